/* kernels/cuda/sample.cu — KOP_SAMPLE: token choice on the device (contract in kernels/kern.h), one
 * thread block of KS_THREADS per row, no scratch memory (everything lives in shared memory and
 * registers), one launch with a grid of max_rows blocks: capturable, replays for any row count.
 *
 * A row, in passes over its V logits (every pass re-reads the row; it stays in L2):
 *   stats      raw max (lse), |C0|, the best id of C0 (block max of kern_sample_key);
 *   lse        sum of exp(l - max) in double (fixed-order block tree);
 *   top-n      radix selection of the n-th best key over all ids, then the ids with key >= it
 *              (exactly n: keys are unique), sorted best first by one thread;
 *   top-k      radix selection (counts) over C0: the k-th best key Tk;
 *   top-p      radix selection (weight sums) over C1 = {C0, key >= Tk}: the key Tp at which the
 *              best-first running weight first reaches top_p * z1;
 *   zz         sum of w over C3 = {C0, key >= max(Tk, Tp), w >= min_p};
 *   draw       id-order running sums over C3 by chunks of KS_THREADS * KS_DRAW_PER ids: each thread
 *              sums its KS_DRAW_PER consecutive ids, a block exclusive scan (double) plus the carry
 *              of the previous chunks gives each thread its starting running sum, the thread walks
 *              its ids, and the lowest id whose running sum exceeds u * zz wins (block min);
 *   rank       score rows only: the count of ids whose key is above the scored token's.
 * The radix selection is kernels/cpu/sample.c's select_key, byte for byte: eight passes from the
 * top byte of the 64-bit key, each building a 256-bin histogram of the candidates that share the
 * bytes chosen so far, then walking the bins best first, accumulating until the target is reached,
 * and descending into that bin (when rounding leaves the target out of reach, every later byte takes
 * its lowest non-empty bin; no candidate at all gives back the lower bound). A selection stops early
 * when the bytes below cannot change the selected candidates (a count selection that takes the chosen
 * bin whole, a weighted one whose bin holds one candidate): they are left zero (and the result raised
 * to the candidates' lower bound), which selects the same candidates as the CPU's exact key. Count
 * histograms are integer atomics; weight histograms are per warp (each bin group of a warp batch
 * summed by a butterfly) and merged warp by warp: every sum in this file has a fixed order for a
 * given launch shape, so results are deterministic run to run (eager == graph replay).
 *
 * Exact vs the CPU: greedy ids, the top-k set, the top-n ids, the lse-based logprobs up to double
 * rounding of the sums. Weights use the CPU's formula (float)exp(((double)l - lmax) * (1 / T)); CUDA's
 * double exp is within 1 ulp of glibc's, so a weight differs only when that ulp crosses a float
 * rounding boundary. Weight sums are added in another order than the CPU's, so a top-p cut or a draw
 * can differ only when top_p * z1 or u * zz lies within rounding of a running-sum boundary (the
 * contract allows it).
 *
 * Penalties and logit_bias: every logit the choice reads goes through ks_lg (kern_penalized_logit with
 * the slot's pen_state word, the row's extra ids staged in shared memory, and the slot's sorted
 * logit_bias list searched by bisection in global memory); the raw passes (max, lse, top-n, rank,
 * the logprobs) read l. The launch's pen_state update is a one-block kernel before the rows.
 *
 * Data-dependent checks (the CPU aborts on them): row count, the ban list range inside buf 2, ban ids
 * and the draft inside [0, V) (draft -1: sample; a score row needs a draft), n_logprobs in [0, KERN_SAMPLE_MAX_TOP], and a row
 * whose bans leave no id. A failing row is skipped (nothing written) and the first failure recorded.
 * One deliberate difference: when C3 is empty (only possible with min_p > 1) a sampling row takes
 * the best id of C0 (the CPU draw would return -1). */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define KS_THREADS 512
#define KS_WARPS (KS_THREADS / 32)
/* Bans staged (sorted, binary search) in shared memory, one per thread; longer lists are scanned in
 * place in global memory (correct, slow: bans are eos + stop ids while min_tokens holds). */
#define KS_BAN_SMEM KS_THREADS
/* consecutive ids per thread in one draw chunk */
#define KS_DRAW_PER 16
#define KS_NONE 0x7fffffff

static_assert(KS_THREADS % 32 == 0 && KS_WARPS <= 32, "whole warps, one warp-level scan of warp totals");
static_assert(KS_DRAW_PER <= 32, "membership bit mask");

struct ks_smem {
    double whist[KS_WARPS][256]; /* weighted selection: one histogram per warp */
    double tot[256];             /* the pass's merged histogram (counts or weight sums) */
    unsigned int chist[256];     /* candidates per bin (both selections) */
    int32_t ban[KS_BAN_SMEM];    /* the row's bans, sorted ascending */
    int32_t extra[KERN_SAMPLE_MAX_EXTRA]; /* the row's extra output ids (penalties) */
    union {
        double d[KS_WARPS];
        unsigned long long u[KS_WARPS];
        float f[KS_WARPS];
        int i[KS_WARPS];
    } red; /* per-warp partials of block reductions / scans */
    unsigned long long topkey[KERN_SAMPLE_MAX_TOP];
    int32_t topid[KERN_SAMPLE_MAX_TOP];
    int ntop;
    int flag;
    /* result of a selection pass's bin walk (written by lane 0 of warp 0) */
    int pick, state;
    double above;
};

/* Per-row state: the row, its bans, and (sampling) the candidate lower bound and weight scale. */
struct ks_row {
    const float *l;
    int V;
    const int32_t *ban; /* sorted in shared memory when sorted, else the global list */
    int nb;
    int sorted;
    unsigned long long lo; /* candidates have key >= lo */
    double lmax;           /* l'[best of C0] */
    double inv_t;          /* 1 / temperature */
    /* penalties and logit_bias (the contract's l'); adj false: l' = l */
    bool adj;
    int pen;
    const int32_t *cnt;          /* the slot's pen_state row */
    const kern_logit_bias *bias; /* the slot's list, ids ascending (global memory, bisection) */
    int nbias;
    const int32_t *extra;        /* shared memory */
    int nextra;
    float rep, freq, pres;
};

__device__ __forceinline__ unsigned long long ks_key(float x, int32_t i)
{
    return (unsigned long long)kern_sample_key(x, i);
}

__device__ __forceinline__ bool ks_banned(const ks_row &r, int32_t id)
{
    if (r.nb == 0) return false;
    if (r.sorted) {
        int lo = 0, hi = r.nb;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (r.ban[mid] < id) lo = mid + 1;
            else hi = mid;
        }
        return lo < r.nb && r.ban[lo] == id;
    }
    for (int k = 0; k < r.nb; k++)
        if (r.ban[k] == id) return true;
    return false;
}

/* The logit the choice uses for id i with raw logit x: l'[i] (kern_penalized_logit), else x. */
__device__ __forceinline__ float ks_lg(const ks_row &r, int32_t i, float x)
{
    if (!r.adj) return x;
    return kern_row_penalized_logit(x, i, r.bias, r.nbias, r.pen, r.cnt, r.extra, r.nextra, r.rep, r.freq, r.pres);
}

/* l'[i] read from the row */
__device__ __forceinline__ float ks_choice(const ks_row &r, int32_t i) { return ks_lg(r, i, r.l[i]); }

/* The contract's weight, exactly: (float)exp(((double)l - lmax) * (1.0 / T)). */
__device__ __forceinline__ float ks_weight(const ks_row &r, float x)
{
    return (float)exp(((double)x - r.lmax) * r.inv_t);
}

/* C3 membership of id i (its logit x): not banned, key >= lo, and w >= min_p when min_p > 0. *w gets
 * the weight when the first two hold. */
__device__ __forceinline__ bool ks_in_c3(const ks_row &r, int32_t i, float x, float min_p, float *w)
{
    if (ks_key(x, i) < r.lo || ks_banned(r, i)) return false;
    *w = ks_weight(r, x);
    return !(min_p > 0.0f) || *w >= min_p;
}

/* ---- block-wide reductions and scan (blockDim.x == KS_THREADS): fixed orders, every thread gets the
 * result. The leading __syncthreads protects sm.red from the previous call's readers. --------------- */
struct ks_op_sum_d {
    __device__ double operator()(double a, double b) const { return a + b; }
};
struct ks_op_sum_i {
    __device__ int operator()(int a, int b) const { return a + b; }
};
struct ks_op_min_i {
    __device__ int operator()(int a, int b) const { return b < a ? b : a; }
};
struct ks_op_max_i {
    __device__ int operator()(int a, int b) const { return b > a ? b : a; }
};
struct ks_op_max_u64 {
    __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return b > a ? b : a; }
};
/* the CPU's "x > mx ? x : mx": never NaN when the partials are not (they start at -inf and only
 * take values that compare greater) */
struct ks_op_max_f {
    __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

/* XOR butterfly (a + b == b + a in IEEE: every lane ends with the same bits), then the warp partials
 * in warp order. */
template <typename T, typename Op>
__device__ __forceinline__ T ks_reduce(T v, T *sh, Op op)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    T r = sh[0];
#pragma unroll
    for (int w = 1; w < KS_WARPS; w++) r = op(r, sh[w]);
    return r;
}

/* Inclusive prefix sum of v over the lanes of a warp (Hillis-Steele, fixed order). */
__device__ __forceinline__ double ks_warp_incl(double v)
{
    const int lane = threadIdx.x & 31;
    double x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

/* Exclusive prefix sum of v in thread order; *total gets the block's sum. */
__device__ __forceinline__ double ks_excl_scan(double v, double *sh, double *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const double x = ks_warp_incl(v);
    double ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0.0;
    __syncthreads();
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    double base = 0.0, all = 0.0;
#pragma unroll
    for (int w = 0; w < KS_WARPS; w++) {
        if (w == warp) base = all;
        all += sh[w];
    }
    *total = all;
    return base + ex;
}

/* ---- radix selection ------------------------------------------------------------------------------ */
enum { KS_WALK_PICK = 0, KS_WALK_LOWEST = 1, KS_WALK_EMPTY = 2, KS_WALK_WHOLE = 3 };

/* Warp 0: walks sm.tot best first from the running total `above` (bins 255 .. 0; lane L owns bins
 * 255-8L .. 248-8L) and writes the bin where above + hist first reaches target (KS_WALK_PICK, with
 * the new above = the total before that bin), else the lowest non-empty bin (KS_WALK_LOWEST), else
 * KS_WALK_EMPTY. Empty bins are skipped, as on the CPU. A pick ends the selection (KS_WALK_WHOLE)
 * when the bytes below cannot change the selected candidates: a count selection that takes the bin
 * whole, or a weighted one whose bin holds a single candidate (sm.chist). */
__device__ void ks_walk(ks_smem &sm, double above, double target, bool weighted)
{
    const int lane = threadIdx.x & 31;
    double h[8], s = 0.0;
    int low = -1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        h[j] = sm.tot[255 - 8 * lane - j];
        s += h[j];
        if (h[j] != 0.0) low = 255 - 8 * lane - j;
    }
    const double x = ks_warp_incl(s);
    double ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = 0.0;
    double a = above + ex, a_pick = 0.0;
    int pick = -1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (pick >= 0 || h[j] == 0.0) continue;
        if (a + h[j] >= target) {
            pick = 255 - 8 * lane - j;
            a_pick = a;
        } else {
            a += h[j];
        }
    }
    const unsigned got = __ballot_sync(0xffffffffu, pick >= 0);
    if (got) {
        const int src = __ffs(got) - 1; /* the best bins come first */
        pick = __shfl_sync(0xffffffffu, pick, src);
        a_pick = __shfl_sync(0xffffffffu, a_pick, src);
        if (lane == 0) {
            const bool whole = weighted ? sm.chist[pick] == 1u : a_pick + sm.tot[pick] == target;
            sm.pick = pick;
            sm.above = a_pick;
            sm.state = whole ? KS_WALK_WHOLE : KS_WALK_PICK;
        }
    } else {
        const unsigned nz = __ballot_sync(0xffffffffu, low >= 0);
        const int src = nz ? 31 - __clz(nz) : 0; /* the lowest bins come last */
        low = __shfl_sync(0xffffffffu, low, src);
        if (lane == 0) {
            sm.pick = low;
            sm.above = above;
            sm.state = nz ? KS_WALK_LOWEST : KS_WALK_EMPTY;
        }
    }
}

/* The key T of the candidate at which the best-first running total of counts (weighted false) or
 * weights reaches target: the candidates with key >= T are the shortest best-first prefix reaching it.
 * Candidates: every id (raw), else the ids not banned with key >= r.lo. Weighted needs !raw.
 * Histograms are built a warp batch (32 consecutive ids) at a time; the trip count is uniform over
 * the warp, so the warp-wide votes and shuffles see all 32 lanes. Counts: the lanes sharing a bin
 * (__match_any_sync) add their number with one shared atomic. Weights: bin group by bin group (the
 * lowest lane's bin first), a butterfly sum of the group's weights (other lanes add 0) that the
 * lowest lane adds to its warp's histogram: a fixed order, whatever the scheduling. */
__device__ unsigned long long ks_select(ks_smem &sm, const ks_row &r, bool raw, bool weighted, double target)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned long long prefix = 0;
    double above = 0.0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        const unsigned long long hi_mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
        if (weighted)
            for (int k = tid; k < KS_WARPS * 256; k += KS_THREADS) (&sm.whist[0][0])[k] = 0.0;
        for (int k = tid; k < 256; k += KS_THREADS) sm.chist[k] = 0u;
        __syncthreads();
        for (int base = warp * 32; base < r.V; base += KS_THREADS) {
            const int i = base + lane;
            unsigned d = 256u; /* not a candidate */
            double w = 0.0;
            if (i < r.V) {
                const float x = raw ? r.l[i] : ks_choice(r, i);
                const unsigned long long k = ks_key(x, i);
                if ((k & hi_mask) == prefix && (raw || (k >= r.lo && !ks_banned(r, i)))) {
                    d = (unsigned)(k >> shift) & 255u;
                    if (weighted) w = (double)ks_weight(r, x);
                }
            }
            unsigned todo = __ballot_sync(0xffffffffu, d < 256u);
            if (!todo) continue;
            if (!weighted) {
                const unsigned peers = __match_any_sync(0xffffffffu, d);
                if (d < 256u && lane == __ffs(peers) - 1) atomicAdd(&sm.chist[d], (unsigned)__popc(peers));
                continue;
            }
            while (todo) { /* uniform: every lane holds the same todo */
                const int leader = __ffs(todo) - 1;
                const unsigned dl = __shfl_sync(0xffffffffu, d, leader);
                const unsigned group = __ballot_sync(0xffffffffu, d == dl);
                double v = d == dl ? w : 0.0;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == leader) {
                    sm.whist[warp][dl] += v;
                    atomicAdd(&sm.chist[dl], (unsigned)__popc(group)); /* shared by the warps */
                }
                todo &= ~group;
            }
        }
        __syncthreads();
        for (int b = tid; b < 256; b += KS_THREADS) {
            double sum;
            if (weighted) {
                sum = 0.0;
                for (int w = 0; w < KS_WARPS; w++) sum += sm.whist[w][b];
            } else {
                sum = (double)sm.chist[b];
            }
            sm.tot[b] = sum;
        }
        __syncthreads();
        if (warp == 0) ks_walk(sm, above, target, weighted);
        __syncthreads();
        const int pick = sm.pick, state = sm.state;
        above = sm.above;
        if (state == KS_WALK_EMPTY) return r.lo;
        prefix |= (unsigned long long)pick << shift;
        /* lower bytes 0, raised to the candidates' own bound (the bin may start below r.lo): the same
         * candidates as the exact key */
        if (state == KS_WALK_WHOLE) return raw || prefix > r.lo ? prefix : r.lo;
        if (state == KS_WALK_LOWEST) target = INFINITY; /* every later byte takes its lowest bin */
    }
    return prefix;
}

/* ---- the draw ------------------------------------------------------------------------------------- */
/* The first id of C3 without `exclude` (-1: none) whose id-order running weight sum exceeds
 * u01 * zz; -1 when C3 holds nothing else, the last such id when rounding leaves none. Uniform. */
__device__ int32_t ks_draw(ks_smem &sm, const ks_row &r, float min_p, int32_t exclude, double zz, double u01)
{
    const double u = u01 * zz;
    const int tid = threadIdx.x;
    double carry = 0.0;
    int32_t last = -1;
    for (int c0 = 0; c0 < r.V; c0 += KS_THREADS * KS_DRAW_PER) {
        const int i0 = c0 + tid * KS_DRAW_PER;
        float w[KS_DRAW_PER];
        unsigned member = 0;
        double s = 0.0;
#pragma unroll
        for (int j = 0; j < KS_DRAW_PER; j++) {
            const int i = i0 + j;
            float wj = 0.0f;
            const bool m = i < r.V && i != exclude && ks_in_c3(r, i, ks_choice(r, i), min_p, &wj);
            w[j] = m ? wj : 0.0f;
            if (m) {
                member |= 1u << j;
                s += (double)wj;
                last = i;
            }
        }
        double total;
        double run = carry + ks_excl_scan(s, sm.red.d, &total);
        int cand = KS_NONE;
#pragma unroll
        for (int j = 0; j < KS_DRAW_PER; j++) {
            if (!((member >> j) & 1u)) continue;
            run += (double)w[j];
            /* a zero weight never starts exceeding u sequentially: only a rounding of the scan could
             * make it look so */
            if (cand == KS_NONE && w[j] > 0.0f && u < run) cand = i0 + j;
        }
        cand = ks_reduce(cand, sm.red.i, ks_op_min_i());
        if (cand != KS_NONE) return cand;
        carry += total;
    }
    return ks_reduce((int)last, sm.red.i, ks_op_max_i());
}

/* ---- the kernel ----------------------------------------------------------------------------------- */
/* Two rows per SM: 64 registers (no spills on sm_90) and 38 KB of static shared memory per block. */
__global__ void __launch_bounds__(KS_THREADS, 2)
    k_sample(const float *__restrict__ logits, const kern_sample_params *__restrict__ params,
             const int32_t *__restrict__ bans, kern_sample_out *__restrict__ out, const int32_t *n_rows, int V,
             int max_rows, int n_bans, const int32_t *__restrict__ pen_state, const kern_logit_bias *__restrict__ bias,
             int max_slots, int max_bias, kc_err *err)
{
    __shared__ ks_smem sm;
    const int n = kc_rows(n_rows, max_rows, err, KOP_SAMPLE);
    const int row = (int)blockIdx.x;
    if (row >= n) return;
    const int tid = threadIdx.x;
    const kern_sample_params sp = params[row];

    /* checks on the parameters: uniform over the block, the row is skipped */
    if (sp.n_ban < 0 || sp.ban_off < 0 || (long long)sp.ban_off + (long long)sp.n_ban > (long long)n_bans) {
        if (tid == 0) kc_fail(err, KC_ERR_BANS, KOP_SAMPLE, sp.n_ban < 0 ? sp.n_ban : sp.ban_off, n_bans);
        return;
    }
    if (sp.n_logprobs < 0 || sp.n_logprobs > KERN_SAMPLE_MAX_TOP) {
        if (tid == 0) kc_fail(err, KC_ERR_LOGPROBS, KOP_SAMPLE, sp.n_logprobs, KERN_SAMPLE_MAX_TOP);
        return;
    }
    if (sp.draft < -1 || sp.draft >= V || (sp.score != 0 && sp.score != 1) || (sp.score && sp.draft < 0)) {
        if (tid == 0) kc_fail(err, KC_ERR_TOKEN, KOP_SAMPLE, sp.draft, V);
        return;
    }

    /* bans: checked, staged and sorted (rank sort, one per thread) */
    ks_row r;
    r.l = logits + (size_t)row * (size_t)V;
    r.V = V;
    r.nb = sp.n_ban;
    r.sorted = sp.n_ban <= KS_BAN_SMEM;
    r.lo = 0;
    r.lmax = 0.0;
    r.inv_t = 0.0;
    r.adj = false;
    r.pen = 0;
    r.cnt = nullptr;
    r.bias = nullptr;
    r.nbias = 0;
    r.extra = sm.extra;
    r.nextra = 0;
    r.rep = r.freq = r.pres = 0.0f;
    /* penalties and logit_bias: the slot's state (uniform checks; the lists are checked below) */
    if ((sp.pen != 0 && sp.pen != 1) || sp.n_bias < 0 || ((sp.pen || sp.n_bias > 0) && (sp.slot < 0 || sp.slot >= max_slots)) ||
        (sp.n_bias > max_bias) ||
        (sp.pen && (sp.n_extra < 0 || sp.n_extra > KERN_SAMPLE_MAX_EXTRA || sp.extra_off < 0 ||
                    (long long)sp.extra_off + (long long)sp.n_extra > (long long)n_bans))) {
        if (tid == 0) kc_fail(err, KC_ERR_PEN, KOP_SAMPLE, sp.slot, max_slots);
        return;
    }
    if (sp.pen || sp.n_bias > 0) {
        r.adj = true;
        r.pen = sp.pen;
        r.rep = sp.rep;
        r.freq = sp.freq;
        r.pres = sp.pres;
    }
    if (sp.pen) {
        r.cnt = pen_state + (size_t)sp.slot * (size_t)V;
        r.nextra = sp.n_extra;
    }
    if (sp.n_bias > 0) {
        r.bias = bias + (size_t)sp.slot * (size_t)max_bias;
        r.nbias = sp.n_bias;
    }
    const int32_t *gban = sp.n_ban > 0 ? bans + sp.ban_off : bans;
    r.ban = r.sorted ? sm.ban : gban;
    if (tid == 0) sm.flag = 0;
    __syncthreads();
    for (int k = tid; k < sp.n_ban; k += KS_THREADS) {
        const int32_t b = gban[k];
        if (b < 0 || b >= V) {
            sm.flag = 1;
            kc_fail(err, KC_ERR_TOKEN, KOP_SAMPLE, b, V);
        }
        if (r.sorted) sm.ban[k] = b;
    }
    for (int k = tid; k < r.nextra; k += KS_THREADS) { /* extra ids: checked, staged */
        const int32_t x = bans[sp.extra_off + k];
        if (x < 0 || x >= V) {
            sm.flag = 1;
            kc_fail(err, KC_ERR_PEN, KOP_SAMPLE, x, V);
        }
        sm.extra[k] = x;
    }
    for (int k = tid; k < r.nbias; k += KS_THREADS) { /* logit_bias ids in [0, V), ascending */
        const int32_t id = r.bias[k].id;
        if (id < 0 || id >= V || (k > 0 && r.bias[k - 1].id >= id)) {
            sm.flag = 1;
            kc_fail(err, KC_ERR_PEN, KOP_SAMPLE, id, V);
        }
    }
    __syncthreads();
    if (sm.flag) return;
    if (r.sorted && r.nb > 1) {
        int32_t v = 0;
        int rank = 0;
        if (tid < r.nb) {
            v = sm.ban[tid];
            for (int k = 0; k < r.nb; k++) {
                const int32_t o = sm.ban[k];
                rank += o < v || (o == v && k < tid);
            }
        }
        __syncthreads();
        if (tid < r.nb) sm.ban[rank] = v;
        __syncthreads();
    }

    /* stats: raw max, |C0|, best of C0 */
    float mx = -INFINITY;
    int cnt = 0;
    unsigned long long bk = 0; /* every real key is > 0 (its low word is 0xffffffff - id >= 1) */
    for (int i = tid; i < V; i += KS_THREADS) {
        const float x = r.l[i];
        mx = x > mx ? x : mx;
        if (!ks_banned(r, i)) {
            cnt++;
            const unsigned long long k = ks_key(ks_lg(r, i, x), i);
            bk = k > bk ? k : bk;
        }
    }
    mx = ks_reduce(mx, sm.red.f, ks_op_max_f());
    cnt = ks_reduce(cnt, sm.red.i, ks_op_sum_i());
    bk = ks_reduce(bk, sm.red.u, ks_op_max_u64());
    if (cnt == 0) {
        if (tid == 0) kc_fail(err, KC_ERR_NO_TOKEN, KOP_SAMPLE, sp.n_ban, V);
        return;
    }
    const int32_t best = (int32_t)(0xffffffffu - (uint32_t)(bk & 0xffffffffull));

    /* lse = max + log(sum exp(l - max)), no bans, no temperature */
    double se = 0.0;
    for (int i = tid; i < V; i += KS_THREADS) se += exp((double)r.l[i] - (double)mx);
    se = ks_reduce(se, sm.red.d, ks_op_sum_d());
    const double lse = (double)mx + log(se);

    /* raw top-n: the n best keys of all ids (unsorted here; thread 0 sorts them at the end) */
    const int ntop = sp.n_logprobs < V ? sp.n_logprobs : V;
    if (ntop > 0) {
        const unsigned long long T = ks_select(sm, r, true, false, (double)ntop);
        if (tid == 0) sm.ntop = 0;
        __syncthreads();
        for (int i = tid; i < V; i += KS_THREADS) {
            const unsigned long long k = ks_key(r.l[i], i);
            if (k < T) continue;
            const int at = atomicAdd(&sm.ntop, 1);
            if (at < KERN_SAMPLE_MAX_TOP) {
                sm.topkey[at] = k;
                sm.topid[at] = i;
            }
        }
        __syncthreads();
    }

    int32_t tok;
    int accepted = 0;
    if (sp.score) {
        tok = sp.draft; /* uniform over the block */
    } else if (sp.temperature <= 1e-5f) {
        tok = best;
        accepted = sp.draft >= 0 && best == sp.draft;
    } else {
        r.lmax = (double)ks_choice(r, best);
        r.inv_t = 1.0 / (double)sp.temperature;
        if (sp.top_k > 0 && sp.top_k < cnt) r.lo = ks_select(sm, r, false, false, (double)sp.top_k);
        if (sp.top_p > 0.0f && sp.top_p < 1.0f) {
            double z1 = 0.0;
            for (int i = tid; i < V; i += KS_THREADS) {
                const float x = ks_choice(r, i);
                if (ks_key(x, i) >= r.lo && !ks_banned(r, i)) z1 += (double)ks_weight(r, x);
            }
            z1 = ks_reduce(z1, sm.red.d, ks_op_sum_d());
            r.lo = ks_select(sm, r, false, true, (double)sp.top_p * z1);
        }
        double zz = 0.0;
        for (int i = tid; i < V; i += KS_THREADS) {
            float w;
            if (ks_in_c3(r, i, ks_choice(r, i), sp.min_p, &w)) zz += (double)w;
        }
        zz = ks_reduce(zz, sm.red.d, ks_op_sum_d());
        double wd = 0.0; /* w[draft] when the draft is in C3 */
        if (sp.draft >= 0) {
            float w;
            if (ks_in_c3(r, sp.draft, ks_choice(r, sp.draft), sp.min_p, &w)) wd = (double)w;
        }
        const double u = kern_uniform(sp.seed, sp.counter);
        if (sp.draft < 0) {
            tok = ks_draw(sm, r, sp.min_p, -1, zz, u);
            if (tok < 0) tok = best; /* C3 empty: min_p > 1 */
        } else if (kern_uniform(sp.seed, KERN_ACCEPT_COUNTER(sp.counter)) < wd / zz) {
            tok = sp.draft;
            accepted = 1;
        } else {
            const int32_t t = ks_draw(sm, r, sp.min_p, sp.draft, zz - wd, u);
            tok = t >= 0 ? t : sp.draft; /* C3 held only the draft */
        }
    }

    /* score rows: rank = 1 + the ids better than tok (every id, raw order); sp.score is uniform over
     * the block, so the reduction's barriers are reached by every thread or by none */
    int rank = 0;
    if (sp.score) {
        const unsigned long long tkey = ks_key(r.l[tok], tok);
        int better = 0;
        for (int i = tid; i < V; i += KS_THREADS) better += ks_key(r.l[i], i) > tkey;
        rank = 1 + ks_reduce(better, sm.red.i, ks_op_sum_i());
    }

    if (tid == 0) {
        kern_sample_out *o = out + row;
        o->tok = tok;
        o->accepted = accepted;
        o->logprob = (float)((double)r.l[tok] - lse);
        o->rank = rank;
        o->n_top = ntop;
        /* insertion sort, best (largest key) first */
        for (int a = 1; a < ntop; a++) {
            const unsigned long long k = sm.topkey[a];
            const int32_t id = sm.topid[a];
            int b = a;
            for (; b > 0 && sm.topkey[b - 1] < k; b--) {
                sm.topkey[b] = sm.topkey[b - 1];
                sm.topid[b] = sm.topid[b - 1];
            }
            sm.topkey[b] = k;
            sm.topid[b] = id;
        }
        for (int a = 0; a < ntop; a++) {
            o->top[a].id = sm.topid[a];
            o->top[a].logprob = (float)((double)r.l[sm.topid[a]] - lse);
        }
    }
}

/* The launch's pen_state update (before the rows read it): upd[0] pairs (slot, token), each adding one
 * output occurrence (2: bit 0 is the prompt flag). Integer atomics: the order does not matter. An
 * out-of-range pair is skipped and recorded. */
#define KS_UPD_THREADS 256
__global__ void __launch_bounds__(KS_UPD_THREADS)
    k_pen_update(int32_t *__restrict__ pen_state, const int32_t *__restrict__ upd, int V, int max_slots, int max_upd,
                 kc_err *err)
{
    const int n = upd[0];
    if (n < 0 || n > max_upd) {
        if (threadIdx.x == 0) kc_fail(err, KC_ERR_PEN, KOP_SAMPLE, n, max_upd);
        return;
    }
    for (int q = (int)threadIdx.x; q < n; q += KS_UPD_THREADS) {
        const int32_t s = upd[1 + 2 * q], t = upd[2 + 2 * q];
        if (s < 0 || s >= max_slots || t < 0 || t >= V) {
            kc_fail(err, KC_ERR_PEN, KOP_SAMPLE, s < 0 || s >= max_slots ? s : t, s < 0 || s >= max_slots ? max_slots : V);
            continue;
        }
        atomicAdd(&pen_state[(size_t)s * (size_t)V + (size_t)t], 2);
    }
}

/* The launch of an op: launch(kernel, grid, block, dynamic smem, arguments...). kc_sample enqueues it;
 * tests/emu runs the same launch on the CPU emulation (GS_CUDA_EMU). With an update list (p[3], p[5]
 * > 0) the update kernel runs first, on the same stream. */
template <typename Launch>
__host__ void ks_launch(const kern_op *op, kc_err *err, Launch &&launch)
{
    const int32_t *p = op->p;
    const int V = p[0], max_rows = p[1], n_bans = p[2], max_slots = p[3], max_bias = p[4], max_upd = p[5];
    if (max_slots > 0 && max_upd > 0)
        launch(k_pen_update, dim3(1u), dim3(KS_UPD_THREADS), (size_t)0, (int32_t *)op->buf[5].ptr,
               (const int32_t *)op->buf[7].ptr, V, max_slots, max_upd, err);
    launch(k_sample, dim3((unsigned)max_rows), dim3(KS_THREADS), (size_t)0, (const float *)op->buf[0].ptr,
           (const kern_sample_params *)op->buf[1].ptr, (const int32_t *)op->buf[2].ptr,
           (kern_sample_out *)op->buf[3].ptr, (const int32_t *)op->buf[4].ptr, V, max_rows, n_bans,
           (const int32_t *)op->buf[5].ptr, (const kern_logit_bias *)op->buf[6].ptr, max_slots, max_bias, err);
}

#ifndef GS_CUDA_EMU
void kc_sample(kern_cuda_ctx *c, const kern_op *op, cudaStream_t s)
{
    ks_launch(op, c->err_dev, [&](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
        kernel<<<grid, block, smem, s>>>(args...);
        KC_LAUNCHED("sample");
    });
}
#endif
