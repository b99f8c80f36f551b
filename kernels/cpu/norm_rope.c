/* kernels/cpu/norm_rope.c — KOP_RMSNORM and KOP_QK_NORM_ROPE. Rows are independent; threads take
 * contiguous row ranges. The sum of squares is a 16-lane dot product (kern_cpu.h), so a row's
 * result depends on nothing but that row. */
#include "kernels/cpu/kern_cpu.h"

#include <math.h>

/* x -> (x * (1 / sqrt(mean(x^2) + eps))) * w over n values; in place allowed (out == x). */
static void rms_row(const kern_simd_ops *simd, const float *x, const float *w, float *out, int n,
                    float eps)
{
    const float ms = simd->dot(x, x, n) / (float)n;
    const float scale = 1.0f / sqrtf(ms + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

typedef struct {
    const kern_simd_ops *simd;
    const float *x, *w;
    float *out;
    int H, n;
    float eps;
} rms_task;

static void rms_run(void *ctx, int tid, int nt)
{
    const rms_task *t = ctx;
    int64_t b, e;
    kern_split(t->n, tid, nt, 1, &b, &e);
    for (int64_t r = b; r < e; r++)
        rms_row(t->simd, t->x + r * t->H, t->w, t->out + r * t->H, t->H, t->eps);
}

void kern_cpu_rmsnorm(kern_pool *pool, const kern_op *op)
{
    rms_task t = {
        .simd = kern_simd(),
        .x = op->buf[0].ptr,
        .w = op->buf[1].ptr,
        .out = op->buf[2].ptr,
        .H = op->p[0],
        .n = kern_cpu_count(op, 3, op->p[1]),
        .eps = op->f[0],
    };
    /* rows are the unit of work: a single row is never worth a dispatch */
    kern_cpu_parallel(pool, rms_run, &t, t.n < 2 ? 0 : (size_t)t.n * (size_t)t.H * 4);
}

/* ---- KOP_QK_NORM_ROPE ------------------------------------------------------------------------- */

typedef struct {
    const kern_simd_ops *simd;
    float *qkv;
    const float *q_norm, *k_norm, *inv_freq;
    const int32_t *pos;
    int nh, nkv, hd, stride, n;
    float eps;
} qkr_task;

/* Neox rotate-half on one head: pairs (i, i + hd/2). */
static void rope_head(float *x, const float *cs, const float *sn, int half)
{
    for (int i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

static void qkr_row(const qkr_task *t, int r)
{
    const int hd = t->hd, half = hd / 2;
    float cs[KERN_MAX_HEAD_DIM / 2], sn[KERN_MAX_HEAD_DIM / 2];
    const float fpos = (float)t->pos[r];
    for (int i = 0; i < half; i++) { /* angle rounded to f32 first, as the contract says */
        const float ang = fpos * t->inv_freq[i];
        cs[i] = cosf(ang);
        sn[i] = sinf(ang);
    }
    float *row = t->qkv + (size_t)r * (size_t)t->stride;
    for (int h = 0; h < t->nh + t->nkv; h++) { /* q heads, then the k heads that follow them */
        float *x = row + (size_t)h * (size_t)hd;
        const float *w = h < t->nh ? t->q_norm : t->k_norm;
        if (w) rms_row(t->simd, x, w, x, hd, t->eps);
        rope_head(x, cs, sn, half);
    }
}

static void qkr_run(void *ctx, int tid, int nt)
{
    const qkr_task *t = ctx;
    int64_t b, e;
    kern_split(t->n, tid, nt, 1, &b, &e);
    for (int64_t r = b; r < e; r++) qkr_row(t, (int)r);
}

void kern_cpu_qk_norm_rope(kern_pool *pool, const kern_op *op)
{
    qkr_task t = {
        .simd = kern_simd(),
        .qkv = op->buf[0].ptr,
        .q_norm = op->buf[1].ptr,
        .k_norm = op->buf[2].ptr,
        .pos = op->buf[3].ptr,
        .inv_freq = op->buf[4].ptr,
        .nh = op->p[0],
        .nkv = op->p[1],
        .hd = op->p[2],
        .stride = op->p[3],
        .n = kern_cpu_count(op, 5, op->p[4]),
        .eps = op->f[0],
    };
    /* ~10 operations per element plus a cos and sin per rotary frequency */
    size_t per_row = (size_t)(t.nh + t.nkv) * (size_t)t.hd * 10 + (size_t)t.hd * 20;
    kern_cpu_parallel(pool, qkr_run, &t, t.n < 2 ? 0 : (size_t)t.n * per_row);
}
