/* kernels/cpu/dispatch.c — kern_cpu_exec: check an op against the kern.h contract (kern_validate,
 * shared with the CUDA backend: a few dozen comparisons per op), then run it. A failed check aborts:
 * an op that disagrees with its buffers would read or write memory it does not own. Data-dependent
 * bounds (token ids, block ids, gather indices, row counts) are checked by the kernels. */
#include "kernels/cpu/kern_cpu.h"


void kern_cpu_exec(kern_pool *pool, const kern_op *op)
{
    if (!op) kern_cpu_fail(NULL, "op != NULL", __FILE__, __LINE__);
    char why[160];
    if (kern_validate(op, why, sizeof why) != 0) kern_cpu_fail(op, why, __FILE__, __LINE__);
    switch (op->kind) {
    case KOP_EMBED: kern_cpu_embed(pool, op); break;
    case KOP_RMSNORM: kern_cpu_rmsnorm(pool, op); break;
    case KOP_MATMUL: kern_cpu_matmul(pool, op); break;
    case KOP_QK_NORM_ROPE: kern_cpu_qk_norm_rope(pool, op); break;
    case KOP_KV_WRITE: kern_cpu_kv_write(pool, op); break;
    case KOP_ATTENTION: kern_cpu_attention(pool, op); break;
    case KOP_SILU_MUL: kern_cpu_silu_mul(pool, op); break;
    case KOP_ADD: kern_cpu_add(pool, op); break;
    case KOP_GATHER_ROWS: kern_cpu_gather_rows(pool, op); break;
    case KOP_COPY_COLS: kern_cpu_copy_cols(pool, op); break;
    case KOP_DRAFT_SELECT: kern_cpu_draft_select(pool, op); break;
    case KOP_CONFIDENCE: kern_cpu_confidence(pool, op); break;
    case KOP_SAMPLE: kern_cpu_sample(pool, op); break;
    case KOP_MOE_ROUTE: kern_cpu_moe_route(pool, op); break;
    case KOP_MOE_FFN: kern_cpu_moe_ffn(pool, op); break;
    default: kern_cpu_fail(op, "unknown op kind", __FILE__, __LINE__);
    }
}
