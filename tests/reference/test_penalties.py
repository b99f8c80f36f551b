"""Presence / frequency / repetition penalties and logit_bias against the independent numpy reference
(ref_penalties.py: vLLM's definitions over ref_model.py's float64 logits).

  * greedy: for each penalty alone (both signs / both sides of 1), logit_bias, and all of them
    together, on two prompts, 16 tokens with --ignore-eos: graphswap's tokens equal the reference's
    penalized greedy continuation (a reference top-2 gap under 1e-4 on the path is reported as a test
    setup problem). All cases run as one --batch-file next to unpenalized requests (the state is per
    sequence slot), with plans and --eager, and with a DFlash drafter; and on a 10-id vocabulary,
    where a random drafter's drafts are accepted now and then, with the drafter (a verify row after
    an accepted draft sees it as an output: a wrong count changes that row's token). Reported logprobs stay those of the raw model (vLLM's default
    raw_logprobs): within 1e-3 of the reference's log_softmax of the unpenalized logits.
  * sampled: 3000 seeded requests of 2 tokens at temperature 0.9 with every penalty and a logit_bias:
    the first token's counts against softmax(penalized / T), the second's within each frequent first
    token against its conditional distribution (the first token is then an output: frequency and
    presence act), one pooled chi-square at an upper tail of 1e-4 (fixed seeds: deterministic). The
    same counts must fail against the unpenalized distributions (the test has the power to see a
    missing penalty).
"""

import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402
import ref_penalties as rp  # noqa: E402

C = H.Checker("penalties")
GEOM = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=96, tie=False, dtype="bf16")
N_TOK = 16
GAP = 1e-4
TOL = 1e-3

CASES = [
    ("repetition 1.4", dict(repetition=1.4)),
    ("repetition 0.7", dict(repetition=0.7)),
    ("frequency 0.9", dict(frequency=0.9)),
    ("frequency -0.6", dict(frequency=-0.6)),
    ("presence 1.2", dict(presence=1.2)),
    ("presence -0.8", dict(presence=-0.8)),
    ("logit_bias", dict(logit_bias={"7": 3.5, "40": -100, "41": 150, "90": 1.25})),
    ("all", dict(repetition=1.2, frequency=0.5, presence=0.4, logit_bias={"3": 2.0, "60": -2.5})),
]


def request_of(prompt, pen, **kw):
    r = dict(prompt_ids=list(prompt), ignore_eos=True, **kw)
    if "repetition" in pen:
        r["repetition_penalty"] = pen["repetition"]
    if "frequency" in pen:
        r["frequency_penalty"] = pen["frequency"]
    if "presence" in pen:
        r["presence_penalty"] = pen["presence"]
    if "logit_bias" in pen:
        r["logit_bias"] = pen["logit_bias"]
    return r


def greedy_checks(binary, d, dd, ref, prompts, tmp):
    reqs, expect = [], []
    for pi, prompt in enumerate(prompts):
        for label, pen in CASES:
            toks, rows = rp.greedy(ref, prompt, N_TOK, **pen)
            gaps = [rm.top2_gap(r) for r in rows]
            bad = [i for i, g in enumerate(gaps) if g < GAP]
            C.check(not bad, "TEST SETUP PROBLEM: %s prompt %d: penalized top-2 gap < %g at steps %s" % (label, pi, GAP, bad))
            changed = toks != rp.greedy(ref, prompt, N_TOK)[0]
            C.check(changed, "TEST SETUP PROBLEM: %s prompt %d: the penalty does not change the greedy path" % (label, pi))
            reqs.append(request_of(prompt, pen, max_tokens=N_TOK, logprobs=2))
            expect.append(("%s prompt %d" % (label, pi), prompt, toks))
        # unpenalized neighbours in the same batch
        reqs.append(dict(prompt_ids=list(prompt), ignore_eos=True, max_tokens=N_TOK))
        expect.append(("unpenalized prompt %d" % pi, prompt, rp.greedy(ref, prompt, N_TOK)[0]))
    runs = [("plans", []), ("eager", ["--eager"]), ("prefill chunk 3, 2 slots", ["--prefill-chunk", "3", "--max-seqs", "2"])]
    if dd:
        runs.append(("DFlash drafter", ["--draft", dd]))
    for rname, extra in runs:
        outs = H.generate_batch(C, "greedy batch (%s)" % rname, binary, d, reqs, os.path.join(tmp, "greedy.jsonl"),
                                extra=extra)
        if outs is None:
            continue
        ok = 0
        accepted = 0
        for (what, prompt, toks), o in zip(expect, outs):
            got = o.get("token_ids")
            if C.check(got == toks, "%s (%s): graphswap %s, reference %s" % (what, rname, got, toks)):
                ok += 1
            accepted += (o.get("spec") or {}).get("accepted_tokens", 0)
            if got and o.get("logprobs") and rname == "plans":
                lp = ref.step_logprobs(prompt, got)
                for i, t in enumerate(got):
                    v = H.num(o["logprobs"][i])
                    C.check(abs(v - lp[i][t]) <= TOL, "%s step %d: logprob %.6f is not the raw %.6f" % (what, i, v, lp[i][t]))
        print("  greedy %-28s %d/%d sequences equal the reference%s" % (rname, ok, len(expect),
              (", %d drafts accepted" % accepted) if dd and rname == "DFlash drafter" else ""), flush=True)


def drafter_checks(binary, tmp):
    """A 10-id vocabulary, so that a random DFlash drafter's drafts are accepted now and then: the rows
    after an accepted draft are verified with that draft counted as an output. Greedy with the drafter
    equals the reference (and so the drafter-free run) on every sequence whose path has no near tie."""
    g = dict(GEOM, vocab=10)
    d = os.path.join(tmp, "model10")
    dd = os.path.join(tmp, "draft10")
    res = H.mkmodel(binary, d, "qwen3", seed=5, **g)
    if not C.check(res.rc == 0, "mkmodel vocab 10: %s" % res.stderr.strip()):
        return
    res = H.run([binary, "mkmodel", "--arch", "dflash", "--target", d, "--out", dd, "--layers", "1", "--seed", "3"])
    if not C.check(res.rc == 0, "mkmodel dflash (vocab 10): %s" % res.stderr.strip()):
        return
    ref = rm.RefModel(d)
    rng = np.random.default_rng(77)
    pens = [dict(frequency=0.4), dict(presence=0.8), dict(repetition=1.3),
            dict(frequency=0.3, presence=0.3, repetition=1.2, logit_bias={"4": 0.5})]
    reqs, expect = [], []
    for k in range(10):
        prompt = [int(x) for x in rng.integers(0, 10, size=int(rng.integers(2, 7)))]
        for pen in pens:
            toks, rows = rp.greedy(ref, prompt, 40, **pen)
            if min(rm.top2_gap(r) for r in rows) < GAP:
                continue  # a near tie: f32 vs float64 may pick either
            reqs.append(request_of(prompt, pen, max_tokens=40))
            expect.append((prompt, pen, toks))
    C.check(len(expect) >= 20, "TEST SETUP PROBLEM: only %d tie-free sequences" % len(expect))
    outs = H.generate_batch(C, "vocab 10 with a drafter", binary, d, reqs, os.path.join(tmp, "draft10.jsonl"),
                            extra=["--draft", dd])
    if outs is None:
        return
    ok = accepted = 0
    for (prompt, pen, toks), o in zip(expect, outs):
        got = o.get("token_ids")
        ok += C.check(got == toks, "vocab 10, drafter, %s prompt %s: graphswap %s, reference %s" % (pen, prompt, got, toks))
        accepted += (o.get("spec") or {}).get("accepted_tokens", 0)
    C.check(accepted >= 40, "TEST SETUP PROBLEM: only %d drafts accepted: verify rows after an accepted draft are "
            "barely exercised" % accepted)
    print("  greedy vocab 10 + DFlash drafter  %d/%d sequences equal the reference, %d drafts accepted"
          % (ok, len(expect), accepted), flush=True)


def sampled_checks(binary, d, ref, prompt, tmp):
    T, N = 0.9, 3000
    pen = dict(repetition=1.5, frequency=1.5, presence=0.5, logit_bias={str(prompt[0]): 2.0, "11": -3.0})
    reqs = [request_of(prompt, pen, max_tokens=2, temperature=T, seed=1000 + i) for i in range(N)]
    outs = H.generate_batch(C, "sampled batch", binary, d, reqs, os.path.join(tmp, "sampled.jsonl"))
    if outs is None:
        return
    pairs = [tuple(o["token_ids"]) for o in outs]
    V = ref.cfg.vocab

    def stat(with_pen):
        p_pen = pen if with_pen else {}
        l0 = ref.forward(list(prompt))[-1]
        c1 = np.bincount([a for a, _ in pairs], minlength=V)
        s, dof = rp.chi2(c1, rp.softmax_t(rp.penalize(l0, prompt, [], **p_pen), T))
        groups = 0
        for t1 in np.nonzero(c1 >= 80)[0]:
            l1 = ref.forward(list(prompt) + [int(t1)])[-1]
            c2 = np.bincount([b for a, b in pairs if a == t1], minlength=V)
            s2, d2 = rp.chi2(c2, rp.softmax_t(rp.penalize(l1, prompt, [int(t1)], **p_pen), T))
            s, dof, groups = s + s2, dof + d2, groups + 1
        return s, dof, groups

    s, dof, groups = stat(True)
    crit = rp.chi2_critical(dof)
    C.check(groups >= 3, "TEST SETUP PROBLEM: only %d first tokens drawn often enough for a conditional test" % groups)
    C.check(s <= crit, "sampled tokens do not follow the penalized distribution: chi-square %.1f > %.1f (%d dof)"
            % (s, crit, dof))
    s0, dof0, _ = stat(False)
    crit0 = rp.chi2_critical(dof0)
    C.check(s0 > crit0, "TEST SETUP PROBLEM: the counts also fit the unpenalized distribution (chi-square %.1f <= "
            "%.1f): no power" % (s0, crit0))
    print("  sampled: %d requests, chi-square %.1f (%d dof, critical %.1f, %d conditional groups); unpenalized "
          "%.1f (critical %.1f)" % (N, s, dof, crit, groups, s0, crit0), flush=True)


def main():
    binary = H.require_bin(C)
    tmp = H.scratch_dir("penalties")
    d = os.path.join(tmp, "model")
    res = H.mkmodel(binary, d, "qwen3", seed=31, **GEOM)
    if not C.check(res.rc == 0, "mkmodel: %s" % res.stderr.strip()):
        return C.finish()
    ref = rm.RefModel(d)
    dd = os.path.join(tmp, "draft")
    res = H.run([binary, "mkmodel", "--arch", "dflash", "--target", d, "--out", dd, "--layers", "1", "--seed", "3"])
    if not C.check(res.rc == 0, "mkmodel dflash: %s" % res.stderr.strip()):
        dd = None
    prompts = [[5, 17, 33, 5, 80, 2], [60, 61, 62, 3, 3, 9, 44, 12, 70]]
    greedy_checks(binary, d, dd, ref, prompts, tmp)
    drafter_checks(binary, tmp)
    sampled_checks(binary, d, ref, prompts[0], tmp)
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
