/* kernels/kern.c — backend-independent parts of the op vocabulary. */
#include "kernels/kern.h"

const char *kern_op_name(kern_op_kind kind)
{
    switch (kind) {
    case KOP_EMBED: return "embed";
    case KOP_RMSNORM: return "rmsnorm";
    case KOP_MATMUL: return "matmul";
    case KOP_QK_NORM_ROPE: return "qk_norm_rope";
    case KOP_KV_WRITE: return "kv_write";
    case KOP_ATTENTION: return "attention";
    case KOP_SILU_MUL: return "silu_mul";
    case KOP_ADD: return "add";
    case KOP_GATHER_ROWS: return "gather_rows";
    case KOP_COPY_COLS: return "copy_cols";
    case KOP_DRAFT_SELECT: return "draft_select";
    case KOP_CONFIDENCE: return "confidence";
    case KOP_SAMPLE: return "sample";
    case KOP_MOE_ROUTE: return "moe_route";
    case KOP_MOE_FFN: return "moe_ffn";
    case KOP_COUNT: break;
    }
    return "unknown";
}
