/* kernels/cpu/dispatch.c — kern_cpu_exec: check an op against the kern.h contract, then run it.
 *
 * Every check here is about the op's static shape (parameters, buffer extents, alignment), so it
 * costs a few dozen comparisons per op. Data-dependent bounds (token ids, block ids, gather
 * indices, row counts) are checked by the kernels as they read them. A failed check aborts: an op
 * that disagrees with its buffers would read or write memory it does not own.
 */
#include "kernels/cpu/kern_cpu.h"

#include <stdio.h>
#include <stdlib.h>

_Noreturn void kern_cpu_fail(const kern_op *op, const char *what, const char *file, int line)
{
    fprintf(stderr, "graphswap: malformed %s op: check '%s' failed (%s:%d)\n",
            op ? kern_op_name(op->kind) : "?", what, file, line);
    abort();
}

/* a*b*c in bytes, aborting on overflow (huge parameters are a bug too). */
static size_t bytes3(const kern_op *op, int64_t a, int64_t b, int64_t c)
{
    KERN_CHECK(op, a >= 0 && b >= 0 && c >= 0);
    size_t r;
    int ovf = __builtin_mul_overflow((size_t)a, (size_t)b, &r);
    ovf |= __builtin_mul_overflow(r, (size_t)c, &r);
    KERN_CHECK(op, !ovf);
    return r;
}

static _Noreturn void buf_fail(const kern_op *op, int i, const char *why, int line)
{
    char msg[96];
    snprintf(msg, sizeof msg, "buf[%d] %s", i, why);
    kern_cpu_fail(op, msg, __FILE__, line);
}

static void need_buf(const kern_op *op, int i, size_t bytes, size_t align)
{
    const kern_buf *b = &op->buf[i];
    if (b->ptr == NULL) buf_fail(op, i, "is NULL", __LINE__);
    if (b->bytes < bytes) buf_fail(op, i, "extent too small", __LINE__);
    if ((uintptr_t)b->ptr % align != 0) buf_fail(op, i, "misaligned", __LINE__);
}

static void opt_buf(const kern_op *op, int i, size_t bytes, size_t align)
{
    if (op->buf[i].ptr) need_buf(op, i, bytes, align);
}

/* Slots the kind does not use must be {NULL, 0}: a pointer there means the op was built for
 * another layout. */
static void unused_from(const kern_op *op, int first)
{
    for (int i = first; i < KERN_MAX_BUFS; i++)
        if (op->buf[i].ptr != NULL || op->buf[i].bytes != 0)
            buf_fail(op, i, "is set but unused by this kind", __LINE__);
}

/* [a, a+na) and [b, b+nb) are either the same start or disjoint. */
static int same_or_disjoint(const kern_buf *a, size_t na, const kern_buf *b, size_t nb)
{
    uintptr_t pa = (uintptr_t)a->ptr, pb = (uintptr_t)b->ptr;
    return pa == pb || pa + na <= pb || pb + nb <= pa;
}
static int disjoint(const kern_buf *a, size_t na, const kern_buf *b, size_t nb)
{
    uintptr_t pa = (uintptr_t)a->ptr, pb = (uintptr_t)b->ptr;
    return pa + na <= pb || pb + nb <= pa;
}

int32_t kern_cpu_count(const kern_op *op, int i, int32_t max)
{
    int32_t n = *(const int32_t *)op->buf[i].ptr;
    KERN_CHECK(op, n >= 0 && n <= max);
    return n;
}

static int is_dtype(int32_t v) { return v == KERN_DT_F32 || v == KERN_DT_BF16; }

static void validate(const kern_op *op)
{
    const int32_t *p = op->p;
    switch (op->kind) {
    case KOP_EMBED: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]));
        need_buf(op, 0, bytes3(op, p[2], 1, 4), 4);
        need_buf(op, 1, bytes3(op, p[1], p[0], (int64_t)kern_dtype_size((kern_dtype)p[3])),
                 kern_dtype_size((kern_dtype)p[3]));
        need_buf(op, 2, bytes3(op, p[2], p[0], 4), 4);
        need_buf(op, 3, 4, 4);
        unused_from(op, 4);
        break;
    }
    case KOP_RMSNORM: {
        KERN_CHECK(op, p[0] > 0 && p[1] >= 0);
        size_t xb = bytes3(op, p[1], p[0], 4);
        need_buf(op, 0, xb, 4);
        need_buf(op, 1, bytes3(op, p[0], 1, 4), 4);
        need_buf(op, 2, xb, 4);
        need_buf(op, 3, 4, 4);
        unused_from(op, 4);
        KERN_CHECK(op, same_or_disjoint(&op->buf[0], xb, &op->buf[2], xb));
        break;
    }
    case KOP_MATMUL: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]));
        KERN_CHECK(op, p[4] == 0 || p[4] == 1);
        size_t dts = kern_dtype_size((kern_dtype)p[3]);
        size_t xb = bytes3(op, p[2], p[0], 4), ob = bytes3(op, p[2], p[1], 4);
        need_buf(op, 0, xb, 4);
        need_buf(op, 1, bytes3(op, p[1], p[0], (int64_t)dts), dts);
        opt_buf(op, 2, bytes3(op, p[1], 1, 4), 4);
        need_buf(op, 3, ob, 4);
        need_buf(op, 4, 4, 4);
        unused_from(op, 5);
        KERN_CHECK(op, disjoint(&op->buf[0], xb, &op->buf[3], ob));
        break;
    }
    case KOP_QK_NORM_ROPE: {
        KERN_CHECK(op, p[0] >= 0 && p[1] > 0 && p[2] > 0 && p[2] % 2 == 0);
        KERN_CHECK(op, p[2] <= KERN_MAX_HEAD_DIM && p[4] >= 0);
        KERN_CHECK(op, (int64_t)p[3] >= ((int64_t)p[0] + p[1]) * p[2]);
        need_buf(op, 0, bytes3(op, p[4], p[3], 4), 4);
        opt_buf(op, 1, bytes3(op, p[2], 1, 4), 4);
        opt_buf(op, 2, bytes3(op, p[2], 1, 4), 4);
        need_buf(op, 3, bytes3(op, p[4], 1, 4), 4);
        need_buf(op, 4, bytes3(op, p[2] / 2, 1, 4), 4);
        need_buf(op, 5, 4, 4);
        unused_from(op, 6);
        break;
    }
    case KOP_KV_WRITE: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[2] > 0 && p[3] >= 0 && p[4] >= 0);
        KERN_CHECK(op, p[5] > 0 && p[6] > 0 && p[7] >= 0);
        int64_t head = (int64_t)p[0] * p[1];
        KERN_CHECK(op, p[3] + head <= p[2] && p[4] + head <= p[2]);
        size_t blk = bytes3(op, p[5], head, 4);
        need_buf(op, 0, bytes3(op, p[7], p[2], 4), 4);
        need_buf(op, 1, blk, 4); /* at least one block; the kernel bounds block ids by extent */
        need_buf(op, 2, op->buf[1].bytes / blk * blk, 4);
        need_buf(op, 3, bytes3(op, p[7], 1, 4), 4);
        need_buf(op, 4, bytes3(op, p[7], 1, 4), 4);
        need_buf(op, 5, bytes3(op, p[6], 1, 4), 4);
        need_buf(op, 6, 4, 4);
        unused_from(op, 7);
        break;
    }
    case KOP_ATTENTION: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[0] % p[1] == 0);
        KERN_CHECK(op, p[2] > 0 && p[2] <= KERN_MAX_HEAD_DIM);
        KERN_CHECK(op, (int64_t)p[3] >= (int64_t)p[0] * p[2]);
        KERN_CHECK(op, p[4] > 0 && p[5] > 0 && p[6] >= 0);
        size_t blk = bytes3(op, p[4], (int64_t)p[1] * p[2], 4);
        need_buf(op, 0, bytes3(op, p[6], p[3], 4), 4);
        need_buf(op, 1, blk, 4);
        need_buf(op, 2, op->buf[1].bytes / blk * blk, 4);
        need_buf(op, 3, bytes3(op, p[6], (int64_t)p[0] * p[2], 4), 4);
        need_buf(op, 4, bytes3(op, p[6], 1, 4), 4);
        need_buf(op, 5, bytes3(op, p[6], 1, 4), 4);
        need_buf(op, 6, bytes3(op, p[5], 1, 4), 4);
        need_buf(op, 7, 4, 4);
        unused_from(op, 8);
        break;
    }
    case KOP_SILU_MUL: {
        KERN_CHECK(op, p[0] > 0 && p[1] >= 0);
        need_buf(op, 0, bytes3(op, p[1], 2 * (int64_t)p[0], 4), 4);
        need_buf(op, 1, bytes3(op, p[1], p[0], 4), 4);
        need_buf(op, 2, 4, 4);
        unused_from(op, 3);
        break;
    }
    case KOP_ADD: {
        KERN_CHECK(op, p[0] > 0 && p[1] >= 0);
        size_t xb = bytes3(op, p[1], p[0], 4);
        need_buf(op, 0, xb, 4);
        need_buf(op, 1, xb, 4);
        need_buf(op, 2, 4, 4);
        unused_from(op, 3);
        KERN_CHECK(op, same_or_disjoint(&op->buf[0], xb, &op->buf[1], xb));
        break;
    }
    case KOP_GATHER_ROWS: {
        KERN_CHECK(op, p[0] > 0 && p[1] >= 0 && p[2] >= 0);
        size_t xb = bytes3(op, p[1], p[0], 4), ob = bytes3(op, p[2], p[0], 4);
        need_buf(op, 0, xb, 4);
        need_buf(op, 1, bytes3(op, p[2], 1, 4), 4);
        need_buf(op, 2, ob, 4);
        need_buf(op, 3, 4, 4);
        unused_from(op, 4);
        KERN_CHECK(op, disjoint(&op->buf[0], xb, &op->buf[2], ob));
        break;
    }
    case KOP_COPY_COLS: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[2] >= 0 && (int64_t)p[2] + p[0] <= p[1] && p[3] >= 0);
        size_t xb = bytes3(op, p[3], p[0], 4), ob = bytes3(op, p[3], p[1], 4);
        need_buf(op, 0, xb, 4);
        need_buf(op, 1, ob, 4);
        need_buf(op, 2, 4, 4);
        unused_from(op, 3);
        KERN_CHECK(op, disjoint(&op->buf[0], xb, &op->buf[1], ob));
        break;
    }
    case KOP_DRAFT_SELECT: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]) && p[4] >= 0);
        size_t rows = bytes3(op, p[4], p[0], 1);
        need_buf(op, 0, bytes3(op, (int64_t)rows, p[1], 4), 4);
        KERN_CHECK(op, (op->buf[1].ptr == NULL) == (op->buf[2].ptr == NULL));
        KERN_CHECK(op, op->buf[1].ptr == NULL || p[2] > 0);
        size_t wb = bytes3(op, p[1], p[2], kern_dtype_size((kern_dtype)p[3]));
        opt_buf(op, 1, wb, 2);
        opt_buf(op, 2, wb, 2);
        need_buf(op, 3, bytes3(op, p[4], 1, 4), 4);
        need_buf(op, 4, bytes3(op, (int64_t)rows, 1, 4), 4);
        need_buf(op, 5, 4, 4);
        unused_from(op, 6);
        break;
    }
    case KOP_CONFIDENCE: {
        KERN_CHECK(op, p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]) && p[4] >= 0 && p[5] > 0);
        size_t rows = bytes3(op, p[4], p[0], 1);
        need_buf(op, 0, bytes3(op, (int64_t)rows, p[1], 4), 4);
        KERN_CHECK(op, op->buf[1].ptr == NULL || p[2] > 0);
        opt_buf(op, 1, bytes3(op, p[5], p[2], kern_dtype_size((kern_dtype)p[3])), 2);
        need_buf(op, 2, bytes3(op, (int64_t)rows, 1, 4), 4);
        need_buf(op, 3, bytes3(op, p[4], 1, 4), 4);
        need_buf(op, 4, bytes3(op, (int64_t)p[1] + (op->buf[1].ptr ? p[2] : 0), 1, 4), 4);
        need_buf(op, 5, 4, 4);
        need_buf(op, 6, bytes3(op, (int64_t)rows, 1, 4), 4);
        need_buf(op, 7, 4, 4);
        break;
    }
    default:
        kern_cpu_fail(op, "unknown op kind", __FILE__, __LINE__);
    }
}

void kern_cpu_exec(kern_pool *pool, const kern_op *op)
{
    if (!op) kern_cpu_fail(NULL, "op != NULL", __FILE__, __LINE__);
    validate(op);
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
    default: kern_cpu_fail(op, "unknown op kind", __FILE__, __LINE__);
    }
}
