"""HTTP: presence / frequency / repetition penalties and logit_bias on /v1/completions.

  - greedy (temperature 0, token-id prompts, --ignore-eos, return_token_ids) with each penalty alone,
    logit_bias (a value past 100 is clamped to 100, as vLLM does), and all together: the completion's
    token ids equal the independent numpy reference's penalized greedy continuation
    (tests/reference/ref_penalties.py over ref_model.py), several requests in flight at once;
  - the neutral values (0, 0, 1, {}) give the unpenalized continuation;
  - logprobs stay raw (vLLM's default raw_logprobs): the reported logprob of a penalized choice is the
    reference's log_softmax of the unpenalized logits;
  - bad values are 400 naming the field (the full table is in test_http_errors.py).
"""

import os
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402
import ref_penalties as rp  # noqa: E402
import test_http_basic as T  # noqa: E402

CMPL = "/v1/completions"
GEOM = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=96, tie=False, dtype="bf16")
N_TOK = 12
CASES = [
    ("presence_penalty", {"presence_penalty": 1.5}, dict(presence=1.5)),
    ("frequency_penalty", {"frequency_penalty": 1.1}, dict(frequency=1.1)),
    ("negative frequency_penalty", {"frequency_penalty": -0.7}, dict(frequency=-0.7)),
    ("repetition_penalty", {"repetition_penalty": 1.6}, dict(repetition=1.6)),
    ("repetition_penalty below 1", {"repetition_penalty": 0.6}, dict(repetition=0.6)),
    ("logit_bias", {"logit_bias": {"9": 4.0, "70": -100, "33": 250}}, dict(logit_bias={"9": 4.0, "70": -100, "33": 100})),
    ("all", {"presence_penalty": 0.3, "frequency_penalty": 0.6, "repetition_penalty": 1.3, "logit_bias": {"2": 2.5}},
     dict(presence=0.3, frequency=0.6, repetition=1.3, logit_bias={"2": 2.5})),
]


def completion(srv, prompt, extra):
    body = {"prompt": prompt, "max_tokens": N_TOK, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "logprobs": 1}
    body.update(extra)
    return T.post(srv, CMPL, body)


def main():
    C = T.Checker("http_penalties")
    binary = T.gs_bin(C)
    tmp = T.scratch("http_penalties")
    d = os.path.join(tmp, "model")
    res = H.mkmodel(binary, d, "qwen3", seed=41, **GEOM)
    if not C.check(res.rc == 0, "mkmodel: %s" % res.stderr.strip()):
        return C.finish()
    ref = rm.RefModel(d)
    prompts = [[4, 8, 15, 16, 23, 42], [50, 51, 50, 52, 7]]
    srv = T.Server(C, binary, d)
    try:
        jobs = []
        for p in prompts:
            base = rp.greedy(ref, p, N_TOK)[0]
            jobs.append(("neutral values", p, {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1,
                                               "logit_bias": {}}, base, True))
            for label, body, pen in CASES:
                toks, rows = rp.greedy(ref, p, N_TOK, **pen)
                gaps = [rm.top2_gap(r) for r in rows]
                C.check(min(gaps) > 1e-4, "TEST SETUP PROBLEM: %s: penalized top-2 gap %.2e" % (label, min(gaps)))
                jobs.append((label, p, body, toks, toks != base))
        results = [None] * len(jobs)

        def run(i):
            results[i] = completion(srv, jobs[i][1], jobs[i][2])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for (label, p, body, toks, changed), r in zip(jobs, results):
            what = "%s (prompt %s)" % (label, p)
            if not C.check(r is not None and r.status == 200, "%s: %r" % (what, r)):
                continue
            ch = r.json["choices"][0]
            C.check(ch.get("token_ids") == toks, "%s: HTTP %s, numpy reference %s" % (what, ch.get("token_ids"), toks))
            C.check(changed, "TEST SETUP PROBLEM: %s does not change the greedy continuation" % what)
            lps = (ch.get("logprobs") or {}).get("token_logprobs") or []
            got = ch.get("token_ids") or []
            if got and len(lps) == len(got):
                raw = ref.step_logprobs(p, got)
                worst = max(abs(float(lps[i]) - raw[i][t]) for i, t in enumerate(got))
                C.check(worst <= 1e-3, "%s: logprobs are not the raw model's (max diff %.2e)" % (what, worst))
            else:
                C.fail("%s: logprobs missing: %r" % (what, ch.get("logprobs")))
        print("  %d completions compared with the numpy reference" % len(jobs), flush=True)
        # bad values: 400 naming the field
        for field, value in (("presence_penalty", -2.5), ("frequency_penalty", 7), ("repetition_penalty", 0),
                             ("repetition_penalty", "1.2"), ("logit_bias", {"x1": 1}), ("logit_bias", {"96": 1}),
                             ("logit_bias", {"5": None}), ("logit_bias", "5:1")):
            r = completion(srv, prompts[0], {field: value})
            T.error_ok(C, "%s = %r" % (field, value), r, 400, field)
        T.healthy(C, srv, "after penalized requests")
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
