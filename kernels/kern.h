/* kernels/kern.h — the op vocabulary shared by every backend.
 *
 * A model's forward pass is a tape of kern_op records. Each op names every buffer it touches as
 * (pointer, extent in bytes): those are the "baked pointers" a captured plan keeps. Nothing an op
 * reads may change size between steps; what varies per step (row counts, token ids, positions,
 * block tables, kv lengths) lives in int32 step-parameter buffers that the op reads at run time.
 *
 * Conventions
 *  - Activations are f32, row-major, rows = tokens of the step. Row r < *n_rows is live; rows past
 *    it (padding up to the plan's bucket) are never read or written.
 *  - Weights are row-major [N, K] (Hugging Face nn.Linear layout) in f32 or bf16 (KERN_DT_*).
 *    Norm weights and biases are always f32.
 *  - Every op's per-row result depends only on that row's inputs: results are bitwise independent
 *    of how many other rows share the step and of how threads split the work (tests rely on it).
 *  - buf[] slots a kind does not use are {NULL, 0}. An optional buffer (bias, q_norm) may be NULL.
 */
#ifndef GS_KERN_H
#define GS_KERN_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KERN_DT_F32 = 0,
    KERN_DT_BF16 = 1,
    KERN_DT_FP8 = 2, /* float8_e4m3fn codes with block scales: KOP_MATMUL and KOP_MOE_FFN weights only */
} kern_dtype;

static inline size_t kern_dtype_size(kern_dtype dt) { return dt == KERN_DT_BF16 ? 2 : dt == KERN_DT_FP8 ? 1 : 4; }

typedef enum {
    /* out[r,:] = (f32) table[ids[r], :]
     * buf: 0 ids i32[max_rows], 1 table [V,H] (wdt), 2 out f32[max_rows,H], 3 n_rows i32[1]
     * p: 0 H, 1 V, 2 max_rows, 3 wdt                                                             */
    KOP_EMBED = 0,
    /* out[r,:] = (x[r,:] * rsqrt(mean(x[r,:]^2) + eps)) * w          (in place allowed: out == x)
     * buf: 0 x f32[max_rows,H], 1 w f32[H], 2 out f32[max_rows,H], 3 n_rows
     * p: 0 H, 1 max_rows;  f: 0 eps                                                             */
    KOP_RMSNORM,
    /* out[r,n] (+)= sum_k x[r,k] * W[n,k] + bias[n]
     * buf: 0 x f32[max_rows,K], 1 W [N,K] (wdt), 2 bias f32[N] or NULL, 3 out f32[max_rows,N],
     *      4 n_rows
     * p: 0 K, 1 N, 2 max_rows, 3 wdt, 4 accumulate (0: out = ..., 1: out += ...)
     * The sum over k is done in one fixed order per output element, whatever the row count.
     * FP8 weights (wdt KERN_DT_FP8, block-FP8 as Qwen and DeepSeek checkpoints store it): W holds
     * float8_e4m3fn codes, never a NaN code (0x7f / 0xff: the loader refuses them), buf 5 the scales
     * S f32 [ceil(N / b0), ceil(K / b1)] (checkpoints' weight_scale_inv; every scale finite, > 0
     * and < KERN_FP8_SCALE_MAX: the loader refuses others), p 5 b0 >= 1, p 6 b1 a power of two >= 16. Weight (n, k) is w = kern_fp8_to_f32(W[n, k]) * S[n / b0][k / b1], one
     * rounded f32 multiply, and the result is bitwise the f32-weight matmul of those w (the same
     * order: every ISA, every row count). In a bf16-activation mode of the pool (pairs or amx,
     * kern_pool_set_bf16_activations) FP8 weights run the pairs order: the result is bitwise the
     * pairs-order matmul of the bf16 weights kern_f32_to_bf16_daz(w), as SGLang's CPU backend runs
     * block FP8 (codes and scale to bf16, then a bf16 GEMM).                                      */
    KOP_MATMUL,
    /* In place on a packed qkv row [q: nh*hd | k: nkv*hd | v: nkv*hd] (row stride p[3] floats):
     * q heads: RMSNorm over hd with q_norm (if not NULL), then RoPE; k heads likewise with k_norm.
     * RoPE: neox rotate-half, angle = (float)pos[r] * inv_freq[i] in f32, i < hd/2:
     *   a = x[i], b = x[i+hd/2];  x[i] = a*cos - b*sin;  x[i+hd/2] = b*cos + a*sin.
     * nh may be 0 (keys only: the drafter's context path points buf 0 at one layer's K columns).
     * buf: 0 qkv f32[max_rows,stride], 1 q_norm f32[hd] or NULL, 2 k_norm f32[hd] or NULL,
     *      3 pos i32[max_rows], 4 inv_freq f32[hd/2], 5 n_rows
     * p: 0 nh, 1 nkv, 2 hd, 3 stride, 4 max_rows;  f: 0 eps                                     */
    KOP_QK_NORM_ROPE,
    /* Scatter each row's k and v heads into the paged cache at (slot[r], pos[r]):
     *   blk = block_tables[slot[r] * max_blocks + pos[r] / block_size], off = pos[r] % block_size,
     *   kcache[((blk * block_size + off) * nkv + h) * hd + d] = qkv[r, k_off + h*hd + d]  (v likewise)
     * A row with slot[r] < 0 is skipped (masked padding row).
     * buf: 0 qkv f32[max_rows,stride], 1 kcache f32[num_blocks*block_size*nkv*hd], 2 vcache (same),
     *      3 slot i32[max_rows], 4 pos i32[max_rows], 5 block_tables i32[max_seqs*max_blocks],
     *      6 n_rows
     * p: 0 nkv, 1 hd, 2 stride, 3 k_off, 4 v_off, 5 block_size, 6 max_blocks, 7 max_rows        */
    KOP_KV_WRITE,
    /* Paged attention. Row r, query head h (kv head h / (nh/nkv)) attends cache positions
     * 0 .. kv_len[r]-1 of sequence slot[r] (causal decode/prefill: kv_len = pos+1; a drafter block
     * sets the same kv_len on every block row: non-causal). Scores in f32, softmax with max
     * subtraction, out[r, h*hd + d] = sum_j softmax_j * V[j, d]. A row with slot[r] < 0 gets zeros.
     * buf: 0 q f32[max_rows,q_stride] (q heads at column 0), 1 kcache, 2 vcache,
     *      3 out f32[max_rows, nh*hd], 4 slot i32[max_rows], 5 kv_len i32[max_rows],
     *      6 block_tables i32[max_seqs*max_blocks], 7 n_rows
     * p: 0 nh, 1 nkv, 2 hd, 3 q_stride, 4 block_size, 5 max_blocks, 6 max_rows;  f: 0 scale      */
    KOP_ATTENTION,
    /* out[r,i] = silu(gu[r,i]) * gu[r,I+i],  silu(a) = a / (1 + exp(-a))
     * buf: 0 gu f32[max_rows,2I], 1 out f32[max_rows,I], 2 n_rows;  p: 0 I, 1 max_rows          */
    KOP_SILU_MUL,
    /* x[r,:] += y[r,:]
     * buf: 0 x f32[max_rows,H], 1 y f32[max_rows,H], 2 n_rows;  p: 0 H, 1 max_rows              */
    KOP_ADD,
    /* out[j,:] = x[idx[j],:] for j < *n  (idx[j] < max_rows of x)
     * buf: 0 x f32[x_rows,H], 1 idx i32[max_out], 2 out f32[max_out,H], 3 n i32[1]
     * p: 0 H, 1 x_rows, 2 max_out                                                              */
    KOP_GATHER_ROWS,
    /* out[r, col0 + j] = x[r, j], j < H: the target saves its residual stream after a layer into
     * the drafter's feature buffer (one column block per target layer id).
     * buf: 0 x f32[max_rows,H], 1 out f32[max_rows,out_stride], 2 n_rows
     * p: 0 H, 1 out_stride, 2 col0 (col0 + H <= out_stride), 3 max_rows                          */
    KOP_COPY_COLS,
    /* Draft token choice, sequence by sequence, left to right over W slots (row = s*W + k):
     *   prev = anchor[s]
     *   for k < W:  logits[row, :] += W2 . W1[prev, :]   (vanilla Markov head; skipped when W1 NULL)
     *               drafts[row] = argmax logits[row, :] (lowest id on ties);  prev = drafts[row]
     * buf: 0 logits f32[max_seqs*W, V] (updated in place), 1 W1 [V,r] (wdt) or NULL,
     *      2 W2 [V,r] (wdt) or NULL, 3 anchor i32[max_seqs], 4 drafts i32[max_seqs*W], 5 n_seqs
     * p: 0 W, 1 V, 2 r, 3 wdt, 4 max_seqs                                                       */
    KOP_DRAFT_SELECT,
    /* DSpark confidence: conf[row] = sigmoid(w[0:H] . h[row] + w[H:H+r] . W1[prev] + b[0]), prev =
     * anchor[s] for k = 0 else drafts[row-1]; the W1 term only when W1 is not NULL.
     * buf: 0 h f32[max_seqs*W, H], 1 W1 [V,r] (wdt) or NULL, 2 drafts i32[max_seqs*W],
     *      3 anchor i32[max_seqs], 4 w f32[H+r], 5 b f32[1], 6 conf f32[max_seqs*W], 7 n_seqs
     * p: 0 W, 1 H, 2 r, 3 wdt, 4 max_seqs, 5 V                                                  */
    KOP_CONFIDENCE,
    /* Token choice on the device: row j < *n of logits (one kern_sample_params each) gives one
     * kern_sample_out, so a step only reads back the chosen tokens (never the [rows, V] logits).
     * Per row, with l = logits[j, :], C0 = ids not in bans[ban_off .. ban_off + n_ban) (ban ids in
     * [0, V); C0 never empty), min_p <= 1:
     *   order  "i better than k": kern_sample_key(l[i], i) > kern_sample_key(l[k], k): the larger
     *          logit, equal logits by the lower id (a total order over every bit pattern: +0 above
     *          -0, a positive NaN above +inf).
     *   raw    lse = log(sum_{all i} exp(l[i])) (no bans, no temperature); out.logprob =
     *          l[tok] - lse; out.top = the n_logprobs best ids of all V (best first) with their raw
     *          logprobs; out.n_top = min(n_logprobs, V); entries past n_top are not written.
     *   score  (score = 1, draft >= 0; a prompt token's logprob): tok = draft, accepted = 0, the raw
     *          outputs above, and out.rank = 1 + |{i : i better than tok}| (over all V ids); nothing
     *          is drawn (temperature, top-k/p, min-p ignored; bans are still checked, C0 must not be
     *          empty). Other rows set out.rank = 0 (a decode step pays no rank pass).
     *   greedy (temperature <= 1e-5): tok = best of C0; a verify row (draft >= 0) sets
     *          accepted = (tok == draft); accepted is 0 on every row with draft < 0.
     *   sampling: lmax = max l over C0; weight w[i] = (float)exp(((double)l[i] - lmax) * (1.0 / T))
     *          (T = temperature as double);
     *          C1 = the top_k best of C0 when 0 < top_k < |C0|, else C0;
     *          C2 = when 0 < top_p < 1, the shortest best-first prefix of C1 whose weight sum
     *               (double) reaches top_p * (weight sum of C1); else C1;
     *          C3 = { i in C2 : w[i] >= min_p } when min_p > 0, else C2;   zz = sum_{C3} w (double).
     *          draft < 0: u = kern_uniform(seed, counter); tok = the first i of C3 in id order whose
     *            running weight sum (id order) exceeds u * zz (the last of C3 if rounding leaves none).
     *          draft >= 0 (speculative verify; the draft distribution is a point mass):
     *            p = w[draft] / zz if draft in C3, else 0; accept when
     *            kern_uniform(seed, KERN_ACCEPT_COUNTER(counter)) < p (tok = draft, accepted = 1);
     *            else tok = the draw above from C3 without draft (zz minus w[draft]), accepted = 0;
     *            tok = draft when C3 holds nothing else.
     * Weight sums may be added in any order: backends agree except when u * zz or top_p * z lands
     * within rounding of a boundary.
     * Penalties and logit_bias (vLLM's sampler order: logit_bias, then repetition, frequency and
     * presence penalties, all before temperature / top-k / top-p / min-p): the choice above (best,
     * greedy, weights, top-k/p, min-p, the draw, verification) uses l'[i] = kern_penalized_logit(...)
     * in place of l[i]; the raw outputs (logprob, top, rank) always use the raw l (vLLM's default
     * raw_logprobs). Per row:
     *   bias   when n_bias > 0: the slot's list bias[slot * max_bias .. + n_bias), ids ascending and
     *          unique, in [0, V): l'[id] = l[id] + b (ids not listed keep l);
     *   pen    when pen = 1: with the slot's state cnt = pen_state[slot * V + i] (bit 0: id i is in the
     *          prompt; bits 1..: its count in the output so far) plus c_extra(i) = the occurrences of
     *          i in bans[extra_off .. extra_off + n_extra) (a verify row's earlier drafts of its block):
     *          c = (cnt >> 1) + c_extra(i); seen = (cnt & 1) || c > 0;
     *          repetition: when seen, x = x > 0 ? x / rep : x * rep;
     *          frequency / presence (every id): x = x - freq * (float)c; x = x - pres * (c > 0 ? 1 : 0).
     *   Every step is one f32 operation, rounded (no fused multiply-add).
     * State update, once per launch before any row (whatever n is): with buf 7, for each of the
     * upd[0] (<= p[5]) pairs (s, t) = (upd[1 + 2q], upd[2 + 2q]): pen_state[s * V + t] += 2 (one more
     * output occurrence of t in slot s). The host writes whole slot rows of pen_state and bias
     * directly (admission); the plan only ever adds.
     * buf: 0 logits f32[max_rows, V], 1 params kern_sample_params[max_rows], 2 bans i32[n_bans]
     *      (ban lists and extra-token lists), 3 out kern_sample_out[max_rows], 4 n i32[1],
     *      5 pen_state i32[max_slots * V] or NULL, 6 bias kern_logit_bias[max_slots * max_bias] or NULL,
     *      7 upd i32[1 + 2 * max_upd] or NULL
     * p: 0 V, 1 max_rows, 2 n_bans (capacity of buf 2, >= 0), 3 max_slots (rows of buf 5 / 6; 0
     *    without them), 4 max_bias (entries per slot of buf 6), 5 max_upd (pairs of buf 7)          */
    KOP_SAMPLE,
    /* The router of a sparse MoE block (transformers' Qwen3MoeSparseMoeBlock / Qwen3MoeTopKRouter):
     * per live row r, with l = logits[r, 0..E):
     *   m = l[0], then m = l[e] where l[e] > m (e = 1 .. E-1);  x_e = kern_expf(l[e] - m);  s = x_0 + x_1 + ... (id order, f32);  q_e = x_e / s
     *   the k best experts by q (larger first, equal q to the lower id: kern_sample_key order);
     *   w_j = q of the j-th best;  with norm: t = w_0 + w_1 + ... (best-first order, f32), w_j = w_j / t
     *   written in ascending expert id: ids[r*k + j] strictly increasing in j, wts[r*k + j] its weight.
     * (transformers computes the softmax in f32 and sums the experts' outputs in expert order: the
     * ascending order is that order.) A NaN logit is ordered by kern_sample_key like any value.
     * buf: 0 logits f32[max_rows, E], 1 ids i32[max_rows * k], 2 wts f32[max_rows * k], 3 n_rows
     * p: 0 E, 1 k (1 <= k <= E <= KERN_MAX_EXPERTS), 2 max_rows, 3 norm (0 / 1)                  */
    KOP_MOE_ROUTE,
    /* The experts of a sparse MoE block, added to the residual stream. Per live row r, for j < k
     * (e = ids[r*k + j], 0 <= e < E and no expert twice in a row, as KOP_MOE_ROUTE writes them: checked
     * by the kernel):
     *   g[i] = h[r,:] . W13[e*2I + i, :],  u[i] = h[r,:] . W13[e*2I + I + i, :]   (i < I)
     *   a[i] = kern_silu_mul(g[i], u[i]);   y_j[n] = a . W2[e*H + n, :]          (n < H)
     * each dot product exactly a KOP_MATMUL row of that weight (the same order, the same bits, the
     * bf16-pairs scheme too); then acc = 0, for j = 0 .. k-1: acc = acc + wts[r*k + j] * y_j (two
     * rounded f32 steps, no fma), and out[r,:] = out[r,:] + acc. A row's result depends only on its
     * own inputs, whatever experts the other rows chose (batch invariance), and an expert no live
     * row chose is never read (decode at batch 1 reads k experts' weights). W13 [E*2I, H] stacks
     * each expert's gate rows then up rows (transformers 5's gate_up_proj [E, 2I, H]); W2 [E*H, I]
     * (down_proj [E, H, I]). The scratch is the backend's (rows grouped by expert, their activations):
     * at least kern_moe_scratch_bytes(E, k, H, I, max_rows) bytes, 64-byte aligned.
     * FP8 experts (wdt KERN_DT_FP8, block-FP8 as Qwen3-MoE-FP8 checkpoints store each expert's
     * gate_proj / up_proj / down_proj): W13 and W2 hold float8_e4m3fn codes (never a NaN code), buf 8
     * the scales S13 f32 [E*2I / b0, ceil(H / b1)] of W13 and buf 9 S2 f32 [E*H / b0, ceil(I / b1)]
     * of W2 (each scale finite, > 0 and < KERN_FP8_SCALE_MAX), p 6 b0 >= 1 with I % b0 == 0 and
     * H % b0 == 0 (every expert's gate, up and down matrix starts on a block row: the loader refuses
     * other shapes), p 7 b1 a power of two >= 16. Expert e's gate and up scales are rows
     * e*2I/b0 .. of S13, its down scales rows e*H/b0 .. of S2: weight (n, k) of W13 (or W2) is
     * kern_fp8_to_f32(code) * S[n / b0][k / b1] with n its row in the stacked matrix, one rounded f32
     * multiply, and every dot product is bitwise the KOP_MATMUL FP8 row of that weight, so the whole
     * op is bitwise the f32-weight KOP_MOE_FFN over the dequantized weights (every ISA, every row
     * count). In a bf16-activation mode (pairs or amx) the FP8 experts run KOP_MATMUL's FP8 pairs
     * order: bitwise this op over bf16 experts kern_f32_to_bf16_daz(w) in the pairs order.
     * buf: 0 h f32[max_rows, H], 1 W13 (wdt), 2 W2 (wdt), 3 ids i32[max_rows*k], 4 wts f32[max_rows*k],
     *      5 out f32[max_rows, H] (disjoint from h), 6 n_rows, 7 scratch, 8 S13 (FP8 only),
     *      9 S2 (FP8 only)
     * p: 0 H, 1 I, 2 E, 3 k, 4 max_rows, 5 wdt, 6 b0 (FP8 only), 7 b1 (FP8 only)                    */
    KOP_MOE_FFN,
    KOP_COUNT
} kern_op_kind;

/* ---- KOP_SAMPLE records (plain data, the same layout in C and CUDA) --------------------------- */
#define KERN_SAMPLE_MAX_TOP 20
/* counter space of the speculative acceptance test for output token t, disjoint from sampling's t */
#define KERN_ACCEPT_COUNTER(t) ((1ull << 40) + (uint64_t)(t))

typedef struct {
    float temperature; /* <= 1e-5: greedy */
    float top_p;       /* off unless 0 < top_p < 1 */
    float min_p;       /* off unless > 0 */
    int32_t top_k;     /* off unless > 0 */
    uint64_t seed;
    uint64_t counter;  /* the token's index in its request */
    int32_t draft;     /* -1: sample; >= 0: verify this draft token */
    int32_t n_logprobs; /* 0 .. KERN_SAMPLE_MAX_TOP */
    int32_t ban_off, n_ban;
    int32_t score;     /* 1: score the given token `draft` (prompt logprobs), no choice */
    /* penalties and logit_bias (0 / 0: off): the slot's rows of buf 5 / buf 6 */
    int32_t pen;       /* 1: repetition / frequency / presence penalties from buf 5 */
    int32_t slot;      /* row of buf 5 and buf 6 */
    float rep, freq, pres; /* repetition (1: off), frequency, presence penalties */
    int32_t n_bias;    /* entries of the slot's logit_bias list (buf 6) */
    int32_t extra_off, n_extra; /* ids in buf 2 counted as output tokens too (verify rows' drafts) */
} kern_sample_params; /* 88 bytes (padded) */

#define KERN_SAMPLE_MAX_EXTRA 64 /* n_extra bound */

typedef struct {
    int32_t id;
    float bias;
} kern_logit_bias;

typedef struct {
    int32_t id;
    float logprob;
} kern_toplp;

typedef struct {
    int32_t tok;
    int32_t accepted;
    float logprob; /* raw logprob of tok */
    int32_t rank;  /* score rows: 1 + the number of ids better than tok (raw order); else 0 */
    int32_t n_top;
    kern_toplp top[KERN_SAMPLE_MAX_TOP];
} kern_sample_out; /* 180 bytes */

/* Functions of the contract that CUDA device code calls too: one source for both backends. */
#if defined(__CUDACC__)
#define KERN_HD __host__ __device__
#else
#define KERN_HD
#endif

/* Philox4x32-10 of (counter, key) -> 4 words. */
static inline KERN_HD void kern_philox(uint64_t counter, uint64_t key, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Uniform double in [0, 1) for (seed, counter): 53 bits of one Philox block, exact in a double. */
static inline KERN_HD double kern_uniform(uint64_t seed, uint64_t counter)
{
    uint32_t w[4];
    kern_philox(counter, seed, w);
    uint64_t bits = (((uint64_t)w[0] << 21) ^ (uint64_t)w[1]) & ((1ull << 53) - 1);
    return (double)bits * (1.0 / 9007199254740992.0);
}

/* The order key of (logit, id): larger = better; ties in the logit go to the lower id. Total over
 * every bit pattern (NaNs included), so selections never depend on evaluation order. */
static inline KERN_HD uint64_t kern_sample_key(float l, int32_t id)
{
    union { float f; uint32_t u; } v = { .f = l };
    uint32_t o = (v.u & 0x80000000u) ? ~v.u : (v.u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)id);
}

/* f32 steps, each rounded: never contracted into a fused multiply-add (nvcc would otherwise) */
#if defined(__CUDA_ARCH__)
#define KERN_FADD(a, b) __fadd_rn((a), (b))
#define KERN_FSUB(a, b) __fsub_rn((a), (b))
#define KERN_FMUL(a, b) __fmul_rn((a), (b))
#define KERN_FDIV(a, b) __fdiv_rn((a), (b))
#else
#define KERN_FADD(a, b) ((a) + (b))
#define KERN_FSUB(a, b) ((a) - (b))
#define KERN_FMUL(a, b) ((a) * (b))
#define KERN_FDIV(a, b) ((a) / (b))
#endif

/* KOP_SAMPLE's penalized logit of one id (contract above): x the raw logit; has_bias / bias its
 * logit_bias entry; pen the row's flag; cnt its pen_state word, extra its count among the row's extra
 * tokens. */
static inline KERN_HD float kern_penalized_logit(float x, int has_bias, float bias, int pen, int32_t cnt,
                                                 int32_t extra, float rep, float freq, float pres)
{
    if (has_bias) x = KERN_FADD(x, bias);
    if (pen) {
        const int32_t c = (cnt >> 1) + extra;
        if ((cnt & 1) || c > 0) x = x > 0.0f ? KERN_FDIV(x, rep) : KERN_FMUL(x, rep);
        x = KERN_FSUB(x, KERN_FMUL(freq, (float)c));
        x = KERN_FSUB(x, KERN_FMUL(pres, c > 0 ? 1.0f : 0.0f));
    }
    return x;
}

/* l'[i] of one row from its lists (both backends' sample op): x the raw logit of id i; bias[0..nbias)
 * the slot's logit_bias list (ids ascending, searched by bisection); with pen, cnt the slot's
 * pen_state row and extra[0..nextra) the row's extra output ids. */
static inline KERN_HD float kern_row_penalized_logit(float x, int32_t i, const kern_logit_bias *bias, int nbias,
                                                     int pen, const int32_t *cnt, const int32_t *extra, int nextra,
                                                     float rep, float freq, float pres)
{
    int has = 0;
    float b = 0.0f;
    if (nbias > 0 && i >= bias[0].id && i <= bias[nbias - 1].id) {
        int lo = 0, hi = nbias;
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (bias[mid].id < i) lo = mid + 1;
            else hi = mid;
        }
        if (lo < nbias && bias[lo].id == i) {
            has = 1;
            b = bias[lo].bias;
        }
    }
    int32_t c = 0, ex = 0;
    if (pen) {
        c = cnt[i];
        for (int k = 0; k < nextra; k++) ex += extra[k] == i;
        /* an id never seen keeps a nonzero logit exactly (x - freq * 0 - pres * 0 == x); a zero may
         * change sign, so it takes the full path */
        if (!has && c == 0 && ex == 0 && x != 0.0f) return x;
    }
    return kern_penalized_logit(x, has, b, pen, c, ex, rep, freq, pres);
}

#define KERN_MAX_BUFS 10 /* KOP_MOE_FFN with FP8 experts uses slots 0 .. 9 */
#define KERN_MAX_P 8

typedef struct {
    void *ptr;
    size_t bytes; /* extent the op may touch, from ptr */
} kern_buf;

typedef struct {
    kern_op_kind kind;
    kern_buf buf[KERN_MAX_BUFS];
    int32_t p[KERN_MAX_P];
    float f[2];
} kern_op;

const char *kern_op_name(kern_op_kind kind);

#define KERN_MAX_HEAD_DIM 1024
#define KERN_MAX_EXPERTS 1024

/* KOP_MOE_FFN's scratch: for n = max_rows * k routed rows, f32 [n, H] (the rows grouped by expert),
 * [n, 2I] (their gate and up values), [n, I] (their activations), [n, H] (their outputs), then i32
 * [n] (the grouped position of each routed row), [E + 1] (each expert's first grouped row), [n] (each
 * grouped row's source row) and [E + 1] (the experts with rows: their count, then their ids), each part
 * rounded up to 64 bytes. A backend may use it in its own way within that size (the CPU uses the first
 * six parts; the CUDA kernels all but the first: they read h in place through the source rows). */
static inline size_t kern_moe_scratch_bytes(int64_t E, int64_t k, int64_t H, int64_t I, int64_t max_rows)
{
    const size_t n = (size_t)max_rows * (size_t)k;
#define KERN_R64(b) (((b) + 63) & ~(size_t)63)
    return KERN_R64(n * (size_t)H * 4) + KERN_R64(n * (size_t)I * 8) + KERN_R64(n * (size_t)I * 4) +
           KERN_R64(n * (size_t)H * 4) + KERN_R64(n * 4) + KERN_R64(((size_t)E + 1) * 4) + KERN_R64(n * 4) +
           KERN_R64(((size_t)E + 1) * 4);
#undef KERN_R64
}
#define KERN_MAX_MARKOV_RANK 4096

/* Checks op against the contract above (static shape only). Returns 0, or -1 with the failed check
 * in why. Every backend runs it before an op; a failure is a bug (the op was built wrong). */
int kern_validate(const kern_op *op, char *why, size_t whylen);

/* ---- CPU execution -------------------------------------------------------------------------- */

/* A fixed pool of worker threads, created once. kern_pool_run calls fn(ctx, tid, nthreads) on every
 * thread (the caller is thread 0) and returns when all are done. No allocation after init. */
typedef struct kern_pool kern_pool;
typedef void (*kern_task_fn)(void *ctx, int tid, int nthreads);

kern_pool *kern_pool_create(int nthreads); /* nthreads <= 0: number of online CPUs */
void kern_pool_destroy(kern_pool *pool);
int kern_pool_threads(const kern_pool *pool);
void kern_pool_run(kern_pool *pool, kern_task_fn fn, void *ctx);
/* Off by default (KERN_BF16_ACT_OFF). KERN_BF16_ACT_PAIRS (any other nonzero value): the pool's
 * matmuls of bf16 weights round their activations to bf16 and sum bf16 products in pairs, as
 * vdpbf16ps does (bitwise the same with or without AVX512_BF16; see kernels/cpu/kern_cpu.h) — twice
 * the arithmetic rate where the CPU has it, activations at bf16 precision. KERN_BF16_ACT_AMX: the
 * same rounding, summed in the order of Intel AMX's TDPBF16PS (kernels/cpu/matmul_amx.c; native
 * where the CPU has AMX, an exact emulation elsewhere: the same bits). KOP_MATMUL and KOP_MOE_FFN
 * follow the mode; their FP8 weights take the pairs order in either mode (dequantized, rounded to
 * bf16: the AMX order is for bf16 weights packed once, not decoded per use). Set between ops, never
 * while one runs. */
#define KERN_BF16_ACT_OFF 0
#define KERN_BF16_ACT_PAIRS 1
#define KERN_BF16_ACT_AMX 2
void kern_pool_set_bf16_activations(kern_pool *pool, int mode);
/* The instruction set the CPU kernels run ("scalar", "avx2", "avx512", "avx512bf16", "amx"),
 * whether the bf16-pairs matmuls run natively on it (vdpbf16ps) rather than emulated (slower),
 * and whether the "amx" matmuls do (TDPBF16PS). */
const char *kern_cpu_isa_name(void);
int kern_cpu_bf16_dot_native(void);
int kern_cpu_amx_native(void);

/* Runs one op on the CPU, using the pool's threads. Asserts on malformed ops (a bug). */
void kern_cpu_exec(kern_pool *pool, const kern_op *op);

/* float8_e4m3fn -> f32, exact for every code but the NaN codes 0x7f / 0xff (which give +-480): the
 * 7 magnitude bits moved to f32's exponent and mantissa fields (exponent bias 7 vs 127) and scaled
 * by 2^120, which also makes the codes with a zero exponent (subnormal e4m3) exact. */
static inline float kern_fp8_to_f32(uint8_t q)
{
    union { uint32_t u; float f; } m = { .u = (uint32_t)(q & 0x7fu) << 20 }, r;
    r.f = m.f * 0x1p120f;
    r.u |= (uint32_t)(q & 0x80u) << 24;
    return r.f;
}
static inline int kern_fp8_is_nan(uint8_t q) { return (q & 0x7fu) == 0x7fu; }
/* kern_fp8_to_f32(q) * 2^-120, exactly: the code's bits in place (sign to bit 31, the magnitude to
 * bits 20..26) with no arithmetic. A kernel multiplies it by s * 2^120 (exact for s < 2^8), which is
 * one rounding of the same real number as kern_fp8_to_f32(q) * s: the same bits. */
static inline float kern_fp8_raw(uint8_t q)
{
    union { uint32_t u; float f; } m = { .u = ((uint32_t)(q & 0x80u) << 24) | ((uint32_t)(q & 0x7fu) << 20) };
    return m.f;
}
#define KERN_FP8_SCALE_MAX 0x1p8f /* scales are finite, > 0 and below this (the loader refuses others) */

/* bf16 <-> f32 (round to nearest even; NaN stays NaN) */
static inline float kern_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
static inline uint16_t kern_f32_to_bf16(float f)
{
    union { uint32_t u; float f; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}

#endif
