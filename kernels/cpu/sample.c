/* kernels/cpu/sample.c — KOP_SAMPLE on the CPU: token choice, speculative verification and raw
 * logprobs, row by row (contract in kernels/kern.h).
 *
 * No scratch besides the stack: the top-k and top-p cut-offs are found by radix selection over the
 * 64-bit order key (kern_sample_key), eight passes of one byte each, every pass narrowing to the
 * candidates whose key starts with the bytes chosen so far. The CUDA kernel runs the same selection
 * with a block per row, so both backends compute the same sets by the same rule; only weight sums
 * (double) are added in a different order.
 *
 * Penalties and logit_bias: every read of a logit by the choice goes through lg() (the contract's
 * l' = kern_penalized_logit of the raw logit, the slot's pen_state word, the row's extra tokens and
 * the slot's bias list, searched by bisection); the raw outputs read l. The pen_state update of the
 * launch runs first, on the calling thread.
 *
 * Raw logprobs: lse = max + log(sum of exp(l - max)) in double, the terms summed in id order; each
 * term is kern_exp_neg (kern_cpu.h: within 1 ulp of glibc's exp in tests, vectorized through
 * kern_simd_ops.exp_shift with the same bits on every ISA), not a libm call per vocabulary entry.
 *
 * Rows are independent; each is handled by one pool thread, so results never depend on the split.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kern_cpu.h"

/* Bans are few (eos + stop ids while min_tokens holds): a sorted copy on the stack when it fits. */
#define BAN_SORTED_MAX 256

typedef struct {
    const float *l;
    int V;
    const int32_t *ban;
    int nb;
    int sorted;   /* ban is sorted ascending (binary search) */
    uint64_t lo;  /* candidates have key >= lo */
    double lmax;  /* best logit among candidates (weights) */
    double inv_t; /* 1 / temperature */
    /* penalties and logit_bias (the contract's l'): adj = 0 when the row has none */
    int adj, pen;
    const int32_t *cnt;           /* the slot's pen_state row (pen) */
    const kern_logit_bias *bias;  /* the slot's bias list, ids ascending */
    int nbias;
    const int32_t *extra;
    int nextra;
    float rep, freq, pres;
} row_ctx;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int is_banned(const row_ctx *c, int32_t id)
{
    if (c->sorted) {
        int lo = 0, hi = c->nb;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (c->ban[mid] < id) lo = mid + 1;
            else hi = mid;
        }
        return lo < c->nb && c->ban[lo] == id;
    }
    for (int i = 0; i < c->nb; i++)
        if (c->ban[i] == id) return 1;
    return 0;
}

/* The logit the choice uses: l'[i] (penalties and logit_bias), else the raw l[i]. */
static float lg(const row_ctx *c, int32_t i)
{
    if (!c->adj) return c->l[i];
    return kern_row_penalized_logit(c->l[i], i, c->bias, c->nbias, c->pen, c->cnt, c->extra, c->nextra, c->rep,
                                    c->freq, c->pres);
}

/* The contract's weight of a choice logit x = lg(c, i) (the caller has it: lg is not recomputed). */
static float weight(const row_ctx *c, float x) { return (float)exp(((double)x - c->lmax) * c->inv_t); }

/* The key T of the candidate (not banned, key >= c->lo) at which the best-first running total of
 * counts (weighted = 0) or weights (weighted = 1) first reaches `target`: the candidates with
 * key >= T are the shortest best-first prefix that reaches it. When rounding leaves the target out
 * of reach, the remaining bytes take the lowest non-empty bin (the prefix grows, never shrinks). */
static uint64_t select_key(const row_ctx *c, int weighted, double target)
{
    uint64_t prefix = 0;
    double above = 0; /* total of the candidates known to be better than the current prefix */
    for (int shift = 56; shift >= 0; shift -= 8) {
        double hist[256];
        memset(hist, 0, sizeof hist);
        const uint64_t hi_mask = shift == 56 ? 0 : ~0ull << (shift + 8);
        for (int32_t i = 0; i < c->V; i++) {
            const float x = lg(c, i);
            uint64_t k = kern_sample_key(x, i);
            if (k < c->lo || (k & hi_mask) != prefix || is_banned(c, i)) continue;
            hist[(k >> shift) & 255] += weighted ? (double)weight(c, x) : 1.0;
        }
        int pick = -1, lowest = -1;
        for (int b = 255; b >= 0; b--) {
            if (hist[b] == 0) continue;
            lowest = b;
            if (above + hist[b] >= target) {
                pick = b;
                break;
            }
            above += hist[b];
        }
        if (pick < 0) { /* out of reach: every later byte takes its lowest bin */
            if (lowest < 0) return c->lo;
            pick = lowest;
            target = INFINITY;
        }
        prefix |= (uint64_t)pick << shift;
    }
    return prefix;
}

/* C3 membership given the cut key T and min_p (weights relative to lmax) */
static int in_c3(const row_ctx *c, int32_t i, uint64_t T, float min_p, float *w)
{
    const float x = lg(c, i);
    if (kern_sample_key(x, i) < T || is_banned(c, i)) return 0;
    *w = weight(c, x);
    return !(min_p > 0) || *w >= min_p;
}

/* Draw from C3 without `exclude` (-1: none) in id order; zz = its weight total. */
static int32_t draw(const row_ctx *c, uint64_t T, float min_p, int32_t exclude, double zz, double u01)
{
    const double u = u01 * zz;
    double run = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < c->V; i++) {
        float w;
        if (i == exclude || !in_c3(c, i, T, min_p, &w)) continue;
        last = i;
        run += w;
        if (u < run) return i;
    }
    return last;
}

static void raw_logprobs(const float *l, int V, const kern_sample_params *sp, kern_sample_out *o)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    /* sum of exp(l - mx) in id order; the terms come 256 at a time from the vectorized
     * kern_exp_neg (a libm call per term was most of a verify row's sampling) */
    const kern_simd_ops *so = kern_simd();
    double sum = 0, e[256];
    for (int i0 = 0; i0 < V; i0 += 256) {
        const int n = V - i0 < 256 ? V - i0 : 256;
        so->exp_shift(e, l + i0, (double)mx, n);
        for (int i = 0; i < n; i++) sum += e[i];
    }
    const double lse = (double)mx + log(sum);
    o->logprob = (float)((double)l[o->tok] - lse);
    o->rank = 0;
    if (sp->score) {
        const uint64_t tk = kern_sample_key(l[o->tok], o->tok);
        int32_t better = 0;
        for (int32_t i = 0; i < V; i++) better += kern_sample_key(l[i], i) > tk;
        o->rank = 1 + better;
    }
    int k = sp->n_logprobs < V ? sp->n_logprobs : V;
    o->n_top = k;
    if (k <= 0) return;
    /* insertion into a short best-first list (k <= KERN_SAMPLE_MAX_TOP) by the order key */
    uint64_t kk[KERN_SAMPLE_MAX_TOP];
    int have = 0;
    for (int32_t i = 0; i < V; i++) {
        uint64_t key = kern_sample_key(l[i], i);
        if (have == k && key <= kk[k - 1]) continue;
        int pos = have < k ? have++ : k - 1;
        while (pos > 0 && key > kk[pos - 1]) {
            kk[pos] = kk[pos - 1];
            o->top[pos] = o->top[pos - 1];
            pos--;
        }
        kk[pos] = key;
        o->top[pos].id = i;
    }
    for (int j = 0; j < k; j++) o->top[j].logprob = (float)((double)l[o->top[j].id] - lse);
}

static void sample_row(const kern_op *op, int32_t j)
{
    const int V = op->p[0];
    const float *l = (const float *)op->buf[0].ptr + (size_t)j * (size_t)V;
    const kern_sample_params *sp = (const kern_sample_params *)op->buf[1].ptr + j;
    kern_sample_out *o = (kern_sample_out *)op->buf[3].ptr + j;
    KERN_CHECK(op, sp->n_ban >= 0 && sp->ban_off >= 0 && (int64_t)sp->ban_off + sp->n_ban <= op->p[2]);
    KERN_CHECK(op, sp->n_logprobs >= 0 && sp->n_logprobs <= KERN_SAMPLE_MAX_TOP);
    KERN_CHECK(op, sp->draft >= -1 && sp->draft < V);
    KERN_CHECK(op, (sp->score == 0 || sp->score == 1) && !(sp->score && sp->draft < 0));
    KERN_CHECK(op, !(sp->min_p > 1));

    row_ctx c = { .l = l, .V = V, .ban = NULL, .nb = sp->n_ban, .lo = 0 };
    /* penalties and logit_bias: the slot's state (checked: a bad row is a bug of the caller) */
    KERN_CHECK(op, (sp->pen == 0 || sp->pen == 1) && sp->n_bias >= 0);
    if (sp->pen || sp->n_bias > 0) {
        KERN_CHECK(op, sp->slot >= 0 && sp->slot < op->p[3]);
        c.adj = 1;
        c.pen = sp->pen;
        c.rep = sp->rep;
        c.freq = sp->freq;
        c.pres = sp->pres;
    }
    if (sp->pen) {
        c.cnt = (const int32_t *)op->buf[5].ptr + (size_t)sp->slot * (size_t)V;
        KERN_CHECK(op, sp->n_extra >= 0 && sp->n_extra <= KERN_SAMPLE_MAX_EXTRA && sp->extra_off >= 0 &&
                           (int64_t)sp->extra_off + sp->n_extra <= op->p[2]);
        if (sp->n_extra > 0) {
            c.extra = (const int32_t *)op->buf[2].ptr + sp->extra_off;
            c.nextra = sp->n_extra;
            for (int k = 0; k < c.nextra; k++) KERN_CHECK(op, c.extra[k] >= 0 && c.extra[k] < V);
        }
    }
    if (sp->n_bias > 0) {
        KERN_CHECK(op, sp->n_bias <= op->p[4]);
        c.bias = (const kern_logit_bias *)op->buf[6].ptr + (size_t)sp->slot * (size_t)op->p[4];
        c.nbias = sp->n_bias;
        for (int k = 0; k < c.nbias; k++)
            KERN_CHECK(op, c.bias[k].id >= 0 && c.bias[k].id < V && (k == 0 || c.bias[k - 1].id < c.bias[k].id));
    }
    int32_t sorted[BAN_SORTED_MAX];
    if (sp->n_ban > 0) {
        const int32_t *ban = (const int32_t *)op->buf[2].ptr + sp->ban_off;
        for (int i = 0; i < sp->n_ban; i++) KERN_CHECK(op, ban[i] >= 0 && ban[i] < V);
        c.ban = ban;
        if (sp->n_ban <= BAN_SORTED_MAX) {
            memcpy(sorted, ban, (size_t)sp->n_ban * sizeof *sorted);
            qsort(sorted, (size_t)sp->n_ban, sizeof *sorted, cmp_i32);
            c.ban = sorted;
            c.sorted = 1;
        }
    }
    /* the best candidate (and whether any id is left at all: bans never empty the vocabulary) */
    int32_t best = -1;
    uint64_t best_key = 0;
    int n_c0 = 0;
    for (int32_t i = 0; i < V; i++) {
        if (is_banned(&c, i)) continue;
        n_c0++;
        uint64_t k = kern_sample_key(lg(&c, i), i);
        if (best < 0 || k > best_key) {
            best = i;
            best_key = k;
        }
    }
    KERN_CHECK(op, best >= 0);
    o->accepted = 0;
    if (sp->score) {
        o->tok = sp->draft;
    } else if (sp->temperature <= 1e-5f) {
        o->tok = best;
        o->accepted = sp->draft >= 0 && best == sp->draft;
    } else {
        c.lmax = (double)lg(&c, best);
        c.inv_t = 1.0 / (double)sp->temperature;
        if (sp->top_k > 0 && sp->top_k < n_c0) c.lo = select_key(&c, 0, (double)sp->top_k);
        if (sp->top_p > 0 && sp->top_p < 1) {
            double z1 = 0;
            for (int32_t i = 0; i < V; i++) {
                const float x = lg(&c, i);
                if (kern_sample_key(x, i) >= c.lo && !is_banned(&c, i)) z1 += weight(&c, x);
            }
            c.lo = select_key(&c, 1, (double)sp->top_p * z1);
        }
        double zz = 0, wd = 0;
        for (int32_t i = 0; i < V; i++) {
            float w;
            if (in_c3(&c, i, c.lo, sp->min_p, &w)) {
                zz += w;
                if (i == sp->draft) wd = w;
            }
        }
        const double u = kern_uniform(sp->seed, sp->counter);
        if (sp->draft < 0) {
            o->tok = draw(&c, c.lo, sp->min_p, -1, zz, u);
        } else if (kern_uniform(sp->seed, KERN_ACCEPT_COUNTER(sp->counter)) < wd / zz) {
            o->tok = sp->draft;
            o->accepted = 1;
        } else {
            int32_t t = draw(&c, c.lo, sp->min_p, sp->draft, zz - wd, u);
            o->tok = t >= 0 ? t : sp->draft; /* C3 held only the draft */
        }
    }
    raw_logprobs(l, V, sp, o);
}

/* The state update that precedes the rows (one thread, in list order: additions commute anyway). */
static void apply_updates(const kern_op *op)
{
    if (op->p[3] <= 0 || op->p[5] <= 0) return;
    const int V = op->p[0];
    const int32_t *u = op->buf[7].ptr;
    int32_t *st = op->buf[5].ptr;
    KERN_CHECK(op, u[0] >= 0 && u[0] <= op->p[5]);
    for (int32_t q = 0; q < u[0]; q++) {
        const int32_t s = u[1 + 2 * q], t = u[2 + 2 * q];
        KERN_CHECK(op, s >= 0 && s < op->p[3] && t >= 0 && t < V);
        st[(size_t)s * (size_t)V + (size_t)t] += 2;
    }
}

typedef struct {
    const kern_op *op;
    int32_t n;
} sample_task;

static void sample_fn(void *vctx, int tid, int nt)
{
    const sample_task *t = vctx;
    for (int32_t j = tid; j < t->n; j += nt) sample_row(t->op, j);
}

void kern_cpu_sample(kern_pool *pool, const kern_op *op)
{
    apply_updates(op);
    sample_task t = { .op = op, .n = kern_cpu_count(op, 4, op->p[1]) };
    kern_cpu_parallel(pool, sample_fn, &t, (size_t)t.n * (size_t)op->p[0] * 8);
}
