"""Independent numpy reference of vLLM's sampling penalties and logit_bias.

Written from the definitions, not from graphswap's kernels:
  * logit_bias first (vLLM v1's LogitBiasLogitsProcessor runs before the penalties; the sampler's
    order in vllm/v1/sample/sampler.py: non-argmax-invariant logits processors -- min_tokens, logit
    bias -- then apply_penalties, then temperature / top-k / top-p / min-p),
  * repetition penalty over prompt AND output tokens: for every id seen in either, a logit > 0 is
    divided by the penalty, any other multiplied by it,
  * frequency and presence penalties over OUTPUT tokens only:
    logit -= frequency * count(id in output) ; logit -= presence * (count > 0)
    (vllm/model_executor/layers/utils.py apply_penalties; OpenAI's parameter definition).
The float64 model logits of ref_model.py go through the same steps in float64.
"""

import numpy as np


def penalize(logits, prompt, output, presence=0.0, frequency=0.0, repetition=1.0, logit_bias=None):
    x = np.array(logits, dtype=np.float64, copy=True)
    V = x.shape[-1]
    for tok, b in (logit_bias or {}).items():
        x[int(tok)] += max(-100.0, min(100.0, float(b)))
    counts = np.bincount(np.asarray(list(output), dtype=np.int64), minlength=V)[:V] if len(output) else np.zeros(V)
    in_prompt = np.bincount(np.asarray(list(prompt), dtype=np.int64), minlength=V)[:V] > 0
    seen = in_prompt | (counts > 0)
    if repetition != 1.0:
        x = np.where(seen, np.where(x > 0, x / repetition, x * repetition), x)
    x = x - frequency * counts
    x = x - presence * (counts > 0)
    return x


def greedy(ref, prompt, n, **pen):
    """Greedy decoding under the penalties with ref_model's KV cache. Returns (tokens, penalized logits
    rows): row i is what chose token i."""
    import ref_model as rm
    cache = rm.KVCache(ref.cfg)
    logits = ref.forward(list(prompt), cache)[-1]
    toks, rows = [], []
    for i in range(n):
        adj = penalize(logits, prompt, toks, **pen)
        t = int(np.argmax(adj))
        toks.append(t)
        rows.append(adj)
        if i + 1 < n:
            logits = ref.forward([t], cache)[-1]
    return toks, np.array(rows)


def softmax_t(x, temperature):
    z = (np.asarray(x, dtype=np.float64) - np.max(x)) / temperature
    p = np.exp(z)
    return p / p.sum()


def chi2_critical(dof, z=3.719):
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.719: upper tail 1e-4)."""
    d = float(dof)
    return d * (1.0 - 2.0 / (9.0 * d) + z * np.sqrt(2.0 / (9.0 * d))) ** 3


def chi2(observed, expected_p, min_expected=5.0):
    """Goodness of fit of counts against probabilities; cells expected below min_expected are pooled
    into one. Returns (statistic, degrees of freedom); an observation in a cell of probability 0 gives
    an infinite statistic."""
    obs = np.asarray(observed, dtype=np.float64)
    n = obs.sum()
    exp = n * np.asarray(expected_p, dtype=np.float64)
    if np.any((exp == 0) & (obs > 0)):
        return float("inf"), 1
    big = exp >= min_expected
    o = list(obs[big])
    e = list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        o.append(obs[~big].sum())
        e.append(exp[~big].sum())
    o, e = np.array(o), np.array(e)
    if len(o) < 2:
        return 0.0, 0
    return float(np.sum((o - e) ** 2 / e)), len(o) - 1
