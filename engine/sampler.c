#include "engine/sampler.h"

#include "kernels/kern.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int eng_sampler_scratch_init(eng_sampler_scratch *s, int V)
{
    s->V = V;
    s->prob = malloc((size_t)V * sizeof *s->prob);
    s->idx = malloc((size_t)V * sizeof *s->idx);
    if (!s->prob || !s->idx) {
        eng_sampler_scratch_free(s);
        return -1;
    }
    return 0;
}

void eng_sampler_scratch_free(eng_sampler_scratch *s)
{
    free(s->prob);
    free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
}

void eng_philox(uint64_t counter, uint64_t key, uint32_t out[4]) { kern_philox(counter, key, out); }

double eng_uniform(uint64_t seed, uint64_t counter) { return kern_uniform(seed, counter); }

/* a is better than b (KOP_SAMPLE's order, written out on floats): the larger logit; at equal logits
 * +0 above -0, then the lower id. (NaN logits are outside this reference's domain.) */
static int better(const float *lg, int32_t a, int32_t b)
{
    const float x = lg[a], y = lg[b];
    if (x != y) return x > y;
    if (signbit(x) != signbit(y)) return !signbit(x);
    return a < b;
}

/* descending by value, ties by ascending id: a total order, so results never depend on qsort */
static const float *g_cmp_vals;
static int cmp_desc(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (i == j) return 0;
    return better(g_cmp_vals, i, j) ? -1 : 1;
}

static int cmp_id(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return (i > j) - (i < j);
}

static void sort_desc(int32_t *idx, size_t n, const float *vals)
{
    /* the engine thread is the only caller; the comparator reads a file-static pointer */
    g_cmp_vals = vals;
    qsort(idx, n, sizeof *idx, cmp_desc);
}

static int is_banned(int32_t id, const int32_t *banned, int n)
{
    for (int i = 0; i < n; i++)
        if (banned[i] == id) return 1;
    return 0;
}

/* a is worse than b (a != b) */
static int worse(const float *lg, int32_t a, int32_t b) { return a != b && better(lg, b, a); }

/* The k best of idx[0..n) into idx[0..k), sorted best first: a size-k min-heap, O(n log k). */
static void top_k_select(int32_t *idx, int n, int k, const float *lg)
{
    int32_t *h = idx; /* the heap lives in the first k slots */
    for (int i = 0; i < n; i++) {
        int32_t v = idx[i];
        int pos;
        if (i < k) {
            pos = i;
            while (pos > 0 && worse(lg, v, h[(pos - 1) / 2])) { /* sift up */
                h[pos] = h[(pos - 1) / 2];
                pos = (pos - 1) / 2;
            }
            h[pos] = v;
        } else if (worse(lg, h[0], v)) { /* replace the worst kept, sift down */
            pos = 0;
            for (;;) {
                int c = 2 * pos + 1;
                if (c >= k) break;
                if (c + 1 < k && worse(lg, h[c + 1], h[c])) c++;
                if (!worse(lg, h[c], v)) break;
                h[pos] = h[c];
                pos = c;
            }
            h[pos] = v;
        }
    }
    sort_desc(idx, (size_t)k, lg);
}

/* Candidates of the filtered distribution at sp's temperature: s->idx[0..n) in id order with
 * unnormalised weights s->prob[0..n) (relative to the best logit); *z their sum. top-k and top-p
 * sort by logit (descending, ties by id) to cut, then put the survivors back in id order, the
 * order draws walk (KOP_SAMPLE's contract). */
static int filtered(const float *logits, const eng_sampling *sp, const int32_t *banned, int n_banned,
                    eng_sampler_scratch *s, double *z_out)
{
    const int V = s->V;
    int n = 0;
    float lmax = -INFINITY;
    for (int i = 0; i < V; i++)
        if (!is_banned(i, banned, n_banned)) {
            s->idx[n++] = i;
            if (logits[i] > lmax) lmax = logits[i];
        }
    const int use_top_p = sp->top_p > 0 && sp->top_p < 1;
    if (sp->top_k > 0 && sp->top_k < n) {
        top_k_select(s->idx, n, sp->top_k, logits);
        n = sp->top_k;
    } else if (use_top_p) {
        sort_desc(s->idx, (size_t)n, logits);
    }
    const double inv_t = 1.0 / sp->temperature;
    double z = 0;
    for (int j = 0; j < n; j++) {
        double p = exp(((double)logits[s->idx[j]] - (double)lmax) * inv_t);
        s->prob[j] = (float)p;
        z += s->prob[j]; /* the float weights, as the top-p prefix below sums them (the op's contract) */
    }
    if (use_top_p) { /* smallest prefix (of the sorted candidates) whose mass reaches top_p */
        double c = 0;
        int keep = n;
        for (int j = 0; j < n; j++) {
            c += s->prob[j];
            if (c >= (double)sp->top_p * z) {
                keep = j + 1;
                break;
            }
        }
        n = keep;
    }
    if (sp->min_p > 0) { /* drop tokens below min_p times the most likely one (weight 1) */
        int keep = 0;
        for (int j = 0; j < n; j++)
            if (s->prob[j] >= sp->min_p) {
                s->idx[keep] = s->idx[j];
                s->prob[keep++] = s->prob[j];
            }
        n = keep;
    }
    if (sp->top_k > 0 || use_top_p) { /* draws walk the kept candidates in id order */
        qsort(s->idx, (size_t)n, sizeof *s->idx, cmp_id);
        for (int j = 0; j < n; j++) s->prob[j] = (float)exp(((double)logits[s->idx[j]] - (double)lmax) * inv_t);
    }
    double zz = 0;
    for (int j = 0; j < n; j++) zz += s->prob[j];
    *z_out = zz;
    return n;
}

void eng_logprobs(const float *logits, int V, int32_t tok, int k, float *logprob, eng_toplp *top)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    const double lse = (double)mx + log(sum);
    *logprob = (float)((double)logits[tok] - lse);
    if (k <= 0 || !top) return;
    /* partial selection of the k best (k <= 20): insertion into a small sorted list */
    if (k > ENG_MAX_LOGPROBS) k = ENG_MAX_LOGPROBS;
    if (k > V) k = V;
    int have = 0;
    for (int i = 0; i < V; i++) {
        if (have == k && !better(logits, i, top[k - 1].id)) continue;
        int pos = have < k ? have++ : k - 1;
        while (pos > 0 && better(logits, i, top[pos - 1].id)) {
            top[pos] = top[pos - 1];
            pos--;
        }
        top[pos].id = i;
    }
    for (int j = 0; j < k; j++) top[j].logprob = (float)((double)logits[top[j].id] - lse);
}

/* Draws from the first n filtered candidates (weights s->prob, total zz), skipping `exclude`. */
static int32_t draw(const eng_sampler_scratch *s, int n, double zz, int32_t exclude, double u01)
{
    if (exclude >= 0)
        for (int j = 0; j < n; j++)
            if (s->idx[j] == exclude) zz -= s->prob[j];
    double u = u01 * zz, c = 0;
    int32_t last = -1;
    for (int j = 0; j < n; j++) {
        if (s->idx[j] == exclude) continue;
        last = s->idx[j];
        c += s->prob[j];
        if (u < c) return last;
    }
    return last;
}

int32_t eng_choose_excluding(const float *logits, const eng_sampling *sp, uint64_t counter, const int32_t *banned,
                             int n_banned, int32_t exclude, eng_sampler_scratch *s)
{
    const int V = s->V;
    if (sp->temperature <= 1e-5f) {
        int32_t tok = -1;
        for (int i = 0; i < V; i++)
            if ((tok < 0 || better(logits, i, tok)) && i != exclude && !is_banned(i, banned, n_banned)) tok = i;
        return tok;
    }
    double zz;
    int n = filtered(logits, sp, banned, n_banned, s, &zz);
    int32_t tok = draw(s, n, zz, exclude, eng_uniform(sp->seed, counter));
    /* p without `exclude` is empty only when p was a point mass on it; fall back to it */
    return tok >= 0 ? tok : exclude;
}

int32_t eng_choose(const float *logits, const eng_sampling *sp, uint64_t counter, const int32_t *banned,
                   int n_banned, eng_sampler_scratch *s)
{
    return eng_choose_excluding(logits, sp, counter, banned, n_banned, -1, s);
}

double eng_prob(const float *logits, const eng_sampling *sp, int32_t tok, const int32_t *banned, int n_banned,
                eng_sampler_scratch *s)
{
    if (sp->temperature <= 1e-5f) return eng_choose(logits, sp, 0, banned, n_banned, s) == tok ? 1.0 : 0.0;
    double zz;
    int n = filtered(logits, sp, banned, n_banned, s, &zz);
    for (int j = 0; j < n; j++)
        if (s->idx[j] == tok) return s->prob[j] / zz;
    return 0.0;
}

int32_t eng_sample(const float *logits, const eng_sampling *sp, uint64_t counter, const int32_t *banned,
                   int n_banned, eng_sampler_scratch *s, float *logprob, eng_toplp *top)
{
    int32_t tok = eng_choose(logits, sp, counter, banned, n_banned, s);
    eng_logprobs(logits, s->V, tok, sp->logprobs, logprob, top);
    return tok;
}

int eng_sampling_has_penalties(const eng_sampling *sp)
{
    return sp->presence_penalty != 0 || sp->frequency_penalty != 0 || eng_sampling_rep(sp) != 1;
}

float eng_sampling_rep(const eng_sampling *sp) { return sp->repetition_penalty == 0 ? 1.0f : sp->repetition_penalty; }

/* Written out from vLLM's definition, not through the kernel's helper: occurrence counts by a
 * direct scan of the token lists (reference speed is not a concern). */
void eng_penalize(float *out, const float *logits, int V, const eng_sampling *sp, const int32_t *prompt,
                  int n_prompt, const int32_t *output, int n_output)
{
    memcpy(out, logits, (size_t)V * sizeof *out);
    for (int k = 0; k < sp->n_logit_bias; k++) {
        out[sp->logit_bias[k].id] = out[sp->logit_bias[k].id] + sp->logit_bias[k].bias;
    }
    if (!eng_sampling_has_penalties(sp)) return;
    const float rep = eng_sampling_rep(sp), freq = sp->frequency_penalty, pres = sp->presence_penalty;
    for (int i = 0; i < V; i++) {
        int count = 0, seen = 0;
        for (int k = 0; k < n_output; k++) count += output[k] == i;
        for (int k = 0; k < n_prompt && !seen; k++) seen = prompt[k] == i;
        float x = out[i];
        if (seen || count > 0) x = x > 0 ? x / rep : x * rep;
        const float fc = freq * (float)count; /* rounded: -ffp-contract=off */
        x = x - fc;
        const float pc = pres * (count > 0 ? 1.0f : 0.0f);
        x = x - pc;
        out[i] = x;
    }
}
