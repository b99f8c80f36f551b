/* kernels/validate.c — kern_validate: the kern.h contract of each op kind (parameters, buffer
 * extents, alignment, unused slots, aliasing), checked on the host before an op runs, by every
 * backend (the CPU dispatch aborts on a failure; the CUDA dispatch before launching). Data-dependent
 * bounds (token ids, block ids, gather indices, row counts) are checked by the kernels as they read
 * them. */
#include <stdio.h>

#include "kernels/kern.h"

#define KC_MAX_HEAD_DIM KERN_MAX_HEAD_DIM
#define KC_MAX_MARKOV_RANK KERN_MAX_MARKOV_RANK

typedef struct {
    const kern_op *op;
    char *why;
    size_t whylen;
    int failed;
} vctx;

static int fail(vctx *v, const char *what, int line)
{
    if (!v->failed) snprintf(v->why, v->whylen, "%s (validate.c:%d)", what, line);
    v->failed = 1;
    return 0;
}
#define REQ(cond) ((cond) ? 1 : fail(v, #cond, __LINE__))

/* a*b*c in bytes; fails on negative factors or overflow (returns 0 then). */
static size_t bytes3(vctx *v, int64_t a, int64_t b, int64_t c)
{
    size_t r;
    if (!REQ(a >= 0 && b >= 0 && c >= 0)) return 0;
    int ovf = __builtin_mul_overflow((size_t)a, (size_t)b, &r);
    ovf |= __builtin_mul_overflow(r, (size_t)c, &r);
    if (!REQ(!ovf)) return 0;
    return r;
}

static void buf_fail(vctx *v, int i, const char *why, int line)
{
    char msg[96];
    snprintf(msg, sizeof msg, "buf[%d] %s", i, why);
    fail(v, msg, line);
}

static void need_buf(vctx *v, int i, size_t bytes, size_t align)
{
    const kern_buf *b = &v->op->buf[i];
    if (b->ptr == NULL) buf_fail(v, i, "is NULL", __LINE__);
    else if (b->bytes < bytes) buf_fail(v, i, "extent too small", __LINE__);
    else if ((uintptr_t)b->ptr % align != 0) buf_fail(v, i, "misaligned", __LINE__);
}

static void opt_buf(vctx *v, int i, size_t bytes, size_t align)
{
    if (v->op->buf[i].ptr) need_buf(v, i, bytes, align);
}

static void unused_from(vctx *v, int first)
{
    for (int i = first; i < KERN_MAX_BUFS; i++)
        if (v->op->buf[i].ptr != NULL || v->op->buf[i].bytes != 0)
            buf_fail(v, i, "is set but unused by this kind", __LINE__);
}

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

static int is_dtype(int32_t d) { return d == KERN_DT_F32 || d == KERN_DT_BF16; }

int kern_validate(const kern_op *op, char *why, size_t whylen)
{
    vctx vv = {.op = op, .why = why, .whylen = whylen, .failed = 0};
    vctx *v = &vv;
    if (!op) {
        snprintf(why, whylen, "op is NULL");
        return -1;
    }
    const int32_t *p = op->p;
    switch (op->kind) {
    case KOP_EMBED: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]))) break;
        size_t ds = kern_dtype_size((kern_dtype)p[3]);
        need_buf(v, 0, bytes3(v, p[2], 1, 4), 4);
        need_buf(v, 1, bytes3(v, p[1], p[0], (int64_t)ds), ds);
        need_buf(v, 2, bytes3(v, p[2], p[0], 4), 4);
        need_buf(v, 3, 4, 4);
        unused_from(v, 4);
        break;
    }
    case KOP_RMSNORM: {
        if (!REQ(p[0] > 0 && p[1] >= 0)) break;
        size_t xb = bytes3(v, p[1], p[0], 4);
        need_buf(v, 0, xb, 4);
        need_buf(v, 1, bytes3(v, p[0], 1, 4), 4);
        need_buf(v, 2, xb, 4);
        need_buf(v, 3, 4, 4);
        unused_from(v, 4);
        REQ(same_or_disjoint(&op->buf[0], xb, &op->buf[2], xb));
        break;
    }
    case KOP_MATMUL: {
        const int fp8 = p[3] == KERN_DT_FP8;
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] >= 0 && (is_dtype(p[3]) || fp8))) break;
        REQ(p[4] == 0 || p[4] == 1);
        if (fp8 && !REQ(p[5] >= 1 && p[6] >= 16 && (p[6] & (p[6] - 1)) == 0)) break;
        size_t ds = kern_dtype_size((kern_dtype)p[3]);
        size_t xb = bytes3(v, p[2], p[0], 4), ob = bytes3(v, p[2], p[1], 4);
        need_buf(v, 0, xb, 4);
        need_buf(v, 1, bytes3(v, p[1], p[0], (int64_t)ds), ds);
        opt_buf(v, 2, bytes3(v, p[1], 1, 4), 4);
        need_buf(v, 3, ob, 4);
        need_buf(v, 4, 4, 4);
        if (fp8) need_buf(v, 5, bytes3(v, (p[1] + p[5] - 1) / p[5], (p[0] + p[6] - 1) / p[6], 4), 4);
        unused_from(v, fp8 ? 6 : 5);
        REQ(disjoint(&op->buf[0], xb, &op->buf[3], ob));
        break;
    }
    case KOP_QK_NORM_ROPE: {
        if (!REQ(p[0] >= 0 && p[1] > 0 && p[2] > 0 && p[2] % 2 == 0)) break;
        if (!REQ(p[2] <= KC_MAX_HEAD_DIM && p[4] >= 0)) break;
        REQ((int64_t)p[3] >= ((int64_t)p[0] + p[1]) * p[2]);
        need_buf(v, 0, bytes3(v, p[4], p[3], 4), 4);
        opt_buf(v, 1, bytes3(v, p[2], 1, 4), 4);
        opt_buf(v, 2, bytes3(v, p[2], 1, 4), 4);
        need_buf(v, 3, bytes3(v, p[4], 1, 4), 4);
        need_buf(v, 4, bytes3(v, p[2] / 2, 1, 4), 4);
        need_buf(v, 5, 4, 4);
        unused_from(v, 6);
        break;
    }
    case KOP_KV_WRITE: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] > 0 && p[3] >= 0 && p[4] >= 0)) break;
        if (!REQ(p[5] > 0 && p[6] > 0 && p[7] >= 0)) break;
        int64_t head = (int64_t)p[0] * p[1];
        REQ(p[3] + head <= p[2] && p[4] + head <= p[2]);
        size_t blk = bytes3(v, p[5], head, 4);
        if (!blk) break;
        need_buf(v, 0, bytes3(v, p[7], p[2], 4), 4);
        need_buf(v, 1, blk, 4);
        need_buf(v, 2, op->buf[1].bytes / blk * blk, 4);
        need_buf(v, 3, bytes3(v, p[7], 1, 4), 4);
        need_buf(v, 4, bytes3(v, p[7], 1, 4), 4);
        need_buf(v, 5, bytes3(v, p[6], 1, 4), 4);
        need_buf(v, 6, 4, 4);
        unused_from(v, 7);
        break;
    }
    case KOP_ATTENTION: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[0] % p[1] == 0)) break;
        if (!REQ(p[2] > 0 && p[2] <= KC_MAX_HEAD_DIM)) break;
        REQ((int64_t)p[3] >= (int64_t)p[0] * p[2]);
        if (!REQ(p[4] > 0 && p[5] > 0 && p[6] >= 0)) break;
        size_t blk = bytes3(v, p[4], (int64_t)p[1] * p[2], 4);
        if (!blk) break;
        need_buf(v, 0, bytes3(v, p[6], p[3], 4), 4);
        need_buf(v, 1, blk, 4);
        need_buf(v, 2, op->buf[1].bytes / blk * blk, 4);
        need_buf(v, 3, bytes3(v, p[6], (int64_t)p[0] * p[2], 4), 4);
        need_buf(v, 4, bytes3(v, p[6], 1, 4), 4);
        need_buf(v, 5, bytes3(v, p[6], 1, 4), 4);
        need_buf(v, 6, bytes3(v, p[5], 1, 4), 4);
        need_buf(v, 7, 4, 4);
        unused_from(v, 8);
        break;
    }
    case KOP_SILU_MUL: {
        if (!REQ(p[0] > 0 && p[1] >= 0)) break;
        need_buf(v, 0, bytes3(v, p[1], 2 * (int64_t)p[0], 4), 4);
        need_buf(v, 1, bytes3(v, p[1], p[0], 4), 4);
        need_buf(v, 2, 4, 4);
        unused_from(v, 3);
        break;
    }
    case KOP_ADD: {
        if (!REQ(p[0] > 0 && p[1] >= 0)) break;
        size_t xb = bytes3(v, p[1], p[0], 4);
        need_buf(v, 0, xb, 4);
        need_buf(v, 1, xb, 4);
        need_buf(v, 2, 4, 4);
        unused_from(v, 3);
        REQ(same_or_disjoint(&op->buf[0], xb, &op->buf[1], xb));
        break;
    }
    case KOP_GATHER_ROWS: {
        if (!REQ(p[0] > 0 && p[1] >= 0 && p[2] >= 0)) break;
        size_t xb = bytes3(v, p[1], p[0], 4), ob = bytes3(v, p[2], p[0], 4);
        need_buf(v, 0, xb, 4);
        need_buf(v, 1, bytes3(v, p[2], 1, 4), 4);
        need_buf(v, 2, ob, 4);
        need_buf(v, 3, 4, 4);
        unused_from(v, 4);
        REQ(disjoint(&op->buf[0], xb, &op->buf[2], ob));
        break;
    }
    case KOP_COPY_COLS: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] >= 0 && (int64_t)p[2] + p[0] <= p[1] && p[3] >= 0)) break;
        size_t xb = bytes3(v, p[3], p[0], 4), ob = bytes3(v, p[3], p[1], 4);
        need_buf(v, 0, xb, 4);
        need_buf(v, 1, ob, 4);
        need_buf(v, 2, 4, 4);
        unused_from(v, 3);
        REQ(disjoint(&op->buf[0], xb, &op->buf[1], ob));
        break;
    }
    case KOP_DRAFT_SELECT: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]) && p[4] >= 0)) break;
        if (!REQ(p[2] <= KC_MAX_MARKOV_RANK)) break;
        size_t rows = bytes3(v, p[4], p[0], 1);
        need_buf(v, 0, bytes3(v, (int64_t)rows, p[1], 4), 4);
        REQ((op->buf[1].ptr == NULL) == (op->buf[2].ptr == NULL));
        REQ(op->buf[1].ptr == NULL || p[2] > 0);
        size_t wb = bytes3(v, p[1], p[2], (int64_t)kern_dtype_size((kern_dtype)p[3]));
        opt_buf(v, 1, wb, 2);
        opt_buf(v, 2, wb, 2);
        need_buf(v, 3, bytes3(v, p[4], 1, 4), 4);
        need_buf(v, 4, bytes3(v, (int64_t)rows, 1, 4), 4);
        need_buf(v, 5, 4, 4);
        unused_from(v, 6);
        break;
    }
    case KOP_CONFIDENCE: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] >= 0 && is_dtype(p[3]) && p[4] >= 0 && p[5] > 0)) break;
        if (!REQ(p[2] <= KC_MAX_MARKOV_RANK)) break;
        size_t rows = bytes3(v, p[4], p[0], 1);
        need_buf(v, 0, bytes3(v, (int64_t)rows, p[1], 4), 4);
        REQ(op->buf[1].ptr == NULL || p[2] > 0);
        opt_buf(v, 1, bytes3(v, p[5], p[2], (int64_t)kern_dtype_size((kern_dtype)p[3])), 2);
        need_buf(v, 2, bytes3(v, (int64_t)rows, 1, 4), 4);
        need_buf(v, 3, bytes3(v, p[4], 1, 4), 4);
        need_buf(v, 4, bytes3(v, (int64_t)p[1] + (op->buf[1].ptr ? p[2] : 0), 1, 4), 4);
        need_buf(v, 5, 4, 4);
        need_buf(v, 6, bytes3(v, (int64_t)rows, 1, 4), 4);
        need_buf(v, 7, 4, 4);
        unused_from(v, 8);
        break;
    }
    case KOP_SAMPLE: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] >= 0)) break;
        need_buf(v, 0, bytes3(v, p[1], p[0], 4), 4);
        need_buf(v, 1, bytes3(v, p[1], (int64_t)sizeof(kern_sample_params), 1), 8);
        if (p[2] > 0) need_buf(v, 2, bytes3(v, p[2], 1, 4), 4);
        need_buf(v, 3, bytes3(v, p[1], (int64_t)sizeof(kern_sample_out), 1), 4);
        need_buf(v, 4, 4, 4);
        if (!REQ(p[3] >= 0 && p[4] >= 0 && p[5] >= 0)) break;
        /* penalty state, logit_bias lists and the state update: each present exactly when sized */
        if (p[3] > 0) need_buf(v, 5, bytes3(v, p[3], p[0], 4), 4);
        else unused_from(v, 5);
        if (p[3] > 0 && p[4] > 0) need_buf(v, 6, bytes3(v, p[3], p[4], (int64_t)sizeof(kern_logit_bias)), 4);
        else if (v->op->buf[6].ptr || v->op->buf[6].bytes) buf_fail(v, 6, "is set but p[3] or p[4] is 0", __LINE__);
        if (p[3] > 0 && p[5] > 0) need_buf(v, 7, bytes3(v, 1 + 2 * (int64_t)p[5], 1, 4), 4);
        else if (v->op->buf[7].ptr || v->op->buf[7].bytes) buf_fail(v, 7, "is set but p[3] or p[5] is 0", __LINE__);
        unused_from(v, 8);
        break;
    }
    case KOP_MOE_ROUTE: {
        if (!REQ(p[0] > 0 && p[0] <= KERN_MAX_EXPERTS && p[1] >= 1 && p[1] <= p[0] && p[2] >= 0)) break;
        REQ(p[3] == 0 || p[3] == 1);
        size_t kb = bytes3(v, p[2], p[1], 4);
        need_buf(v, 0, bytes3(v, p[2], p[0], 4), 4);
        need_buf(v, 1, kb, 4);
        need_buf(v, 2, kb, 4);
        need_buf(v, 3, 4, 4);
        unused_from(v, 4);
        REQ(disjoint(&op->buf[1], kb, &op->buf[2], kb));
        break;
    }
    case KOP_MOE_FFN: {
        if (!REQ(p[0] > 0 && p[1] > 0 && p[2] > 0 && p[2] <= KERN_MAX_EXPERTS && p[3] >= 1 && p[3] <= p[2])) break;
        const int fp8 = p[5] == KERN_DT_FP8;
        if (!REQ(p[4] >= 0 && (is_dtype(p[5]) || fp8))) break;
        /* FP8: b0 divides I and H (no scale block spans two experts' matrices or gate and up), b1 a
         * power of two >= 16 (KOP_MATMUL's) */
        if (fp8 && !REQ(p[6] >= 1 && p[1] % p[6] == 0 && p[0] % p[6] == 0)) break;
        if (fp8 && !REQ(p[7] >= 16 && (p[7] & (p[7] - 1)) == 0)) break;
        size_t ds = kern_dtype_size((kern_dtype)p[5]);
        size_t xb = bytes3(v, p[4], p[0], 4), kb = bytes3(v, p[4], p[3], 4);
        need_buf(v, 0, xb, 4);
        need_buf(v, 1, bytes3(v, (int64_t)p[2] * 2 * p[1], p[0], (int64_t)ds), ds);
        need_buf(v, 2, bytes3(v, (int64_t)p[2] * p[0], p[1], (int64_t)ds), ds);
        need_buf(v, 3, kb, 4);
        need_buf(v, 4, kb, 4);
        need_buf(v, 5, xb, 4);
        need_buf(v, 6, 4, 4);
        need_buf(v, 7, kern_moe_scratch_bytes(p[2], p[3], p[0], p[1], p[4]), 64);
        if (fp8) { /* S13 [E*2I / b0, ceil(H / b1)], S2 [E*H / b0, ceil(I / b1)] */
            need_buf(v, 8, bytes3(v, (int64_t)p[2] * 2 * (p[1] / p[6]), ((int64_t)p[0] + p[7] - 1) / p[7], 4), 4);
            need_buf(v, 9, bytes3(v, (int64_t)p[2] * (p[0] / p[6]), ((int64_t)p[1] + p[7] - 1) / p[7], 4), 4);
        }
        unused_from(v, fp8 ? 10 : 8);
        REQ(disjoint(&op->buf[0], xb, &op->buf[5], xb));
        break;
    }
    default:
        fail(v, "unknown op kind", __LINE__);
    }
    return v->failed ? -1 : 0;
}
