"""The speculative STEP SEQUENCE of graphswap equals the public loops' (issue 11, part 3).

z-lab dflash (`spec_generate`, ZL:87-99) and DeepSpec (`base_evaluator.py` loop) always prefill the
WHOLE prompt in the target, sample the first token g0 from the last prompt row, and anchor the first
speculative step on g0 (SPEC-NOTES.md 1.4 / 3). ref_spec.spec_generate does the same. graphswap used
to anchor a step on the last PROMPT token whenever the prompt's uncomputed remainder was exactly one
token, which adds a step (and an acceptance length) the public loops never take:
  * a 1-token prompt,
  * a prompt whose prefill chunks end at n-1 (n = chunk + 1, 2*chunk + 1 with --prefill-chunk),
  * a prefix-cache hit of n-1 tokens (n = 16k + 1 with the default 16-token KV blocks; a second
    identical request admitted after the first finished, --max-seqs 1).
For each, the per-step trace (start, anchor, drafts, accepted, bonus), acceptance_lengths and
token_ids must equal the reference. Controls that passed before as well: chunk - 1, chunk tokens.
"""

import json
import os
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_harness as H  # noqa: E402
import ref_spec as rs  # noqa: E402
import test_spec_reference as T  # noqa: E402

C = H.Checker("spec_sequence")
T.C = C  # T.compare reports through this checker
CHUNK = 5
MAX_TOKENS = 24
KV_BLOCK = 16  # the engine's default KV block size (prefix-cache granularity)


def tie_free_prompt(target, drafter, vocab, n, seed, max_tokens=MAX_TOKENS):
    for k in range(8):
        rng = np.random.default_rng(seed * 101 + k)
        p = [int(x) for x in rng.integers(0, vocab - 2, size=n)]
        if T.tie_free(rs.spec_generate(target, drafter, p, max_tokens)):
            return p
    C.fail("TEST SETUP PROBLEM: no tie-free prompt of %d tokens (seed %d)" % (n, seed))
    return None


def prefix_hit_case(what, binary, tdir, ddir, target, drafter, prompt, tmp):
    """Two identical requests, one at a time: the second one finds n-1 prompt tokens cached."""
    ref = rs.spec_generate(target, drafter, prompt, MAX_TOKENS)
    trace_path = os.path.join(tmp, "trace_prefix.jsonl")
    if os.path.exists(trace_path):
        os.remove(trace_path)
    req = {"prompt_ids": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    objs = H.generate_batch(C, what, binary, tdir, [req, req], os.path.join(tmp, "batch_prefix.jsonl"),
                            extra=["--draft", ddir, "--trace", trace_path, "--max-seqs", "1"])
    if objs is None:
        return
    steps = T.read_trace(trace_path) if os.path.exists(trace_path) else []
    for i, o in enumerate(objs):
        tag = "%s request %d%s" % (what, i, " (prefix-cache hit of %d tokens)" % (len(prompt) - 1) if i else "")
        C.check(o.get("token_ids") == ref["tokens"], "%s: token_ids differ from the reference\n  got %s\n  ref %s"
                % (tag, o.get("token_ids"), ref["tokens"]))
        C.check([int(x) for x in o.get("acceptance_lengths") or []] == ref["acceptance_lengths"],
                "%s: acceptance_lengths %s, reference %s" % (tag, o.get("acceptance_lengths"), ref["acceptance_lengths"]))
        mine = [{k: s[k] for k in T.TRACE_KEYS} for s in steps if s.get("request") == i]
        C.check(mine == ref["trace"], "%s: trace differs from the reference loop\n  got %s\n  ref %s"
                % (tag, mine[:3], ref["trace"][:3]))


def main():
    binary = H.require_bin(C)
    hr = H.run([binary, "generate", "--help"])
    if "--draft" not in hr.stdout + hr.stderr:
        print("graphswap has no --draft support yet")
        print("0 passed, 0 failed", flush=True)
        return 0
    tmp = H.scratch_dir("spec_sequence")
    name, g, seed = T.TARGETS[0]
    tdir = os.path.join(tmp, name)
    r = T.mkmodel_target(binary, tdir, g, seed)
    if not C.check(r.rc == 0, "%s: mkmodel exited %s: %s" % (name, r.rc, r.stderr.strip()[-1000:])):
        return C.finish()
    target = T.load_target(name, tdir)
    if target is None:
        return C.finish()
    L = g["layers"]
    tdict = json.load(open(os.path.join(tdir, "config.json")))

    drafters = []
    # mkmodel drafters (random: mostly rejected drafts)
    for kind, layers, block, rank, dseed in (("dflash", 1, 4, None, 41), ("dspark", 2, 5, 8, 42)):
        ddir = os.path.join(tmp, "mk_%s" % kind)
        r = T.mkmodel_drafter(binary, ddir, kind, tdir, layers, block, rank, dseed)
        if C.check(r.rc == 0, "mkmodel %s exited %s: %s" % (kind, r.rc, r.stderr.strip()[-1000:])):
            d = T.load_drafter("%s-mk" % kind, ddir, target)
            if d is not None:
                drafters.append(("%s-mk B=%d" % (kind, block), ddir, d))
    # a DFlash whose layers add nothing and whose mask token makes it propose one of the target's
    # frequent tokens (accepts where the target repeats it)
    p0 = [int(x) for x in np.random.default_rng(7).integers(0, g["vocab"] - 2, size=7)]
    greedy, _ = rs.target_greedy(target, p0, 40)
    freq = max(set(greedy), key=greedy.count)
    cd = rs.make_drafter_config("dflash", tdict, layers=1, block_size=6, target_layer_ids=[0, L - 2])
    w = rs.random_drafter_weights(rs.DraftConfig(cd), seed=43, target=target, layer_out_scale=0.0)
    m = rs.dflash_mask_for(target, w["norm.weight"], cd["rms_norm_eps"], freq)
    if m is not None:
        cd["dflash_config"]["mask_token_id"] = m
    ddir = os.path.join(tmp, "w_dflash_eng")
    shutil.rmtree(ddir, ignore_errors=True)
    rs.write_drafter(ddir, cd, w)
    d = T.load_drafter("dflash-eng", ddir, target)
    if d is not None:
        drafters.append(("dflash-eng B=6", ddir, d))

    for di, (dname, ddir, drafter) in enumerate(drafters):
        # prompt lengths relative to the prefill chunk: 1, chunk-1, chunk, chunk+1, 2*chunk+1
        for n in (1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 1):
            p = tie_free_prompt(target, drafter, g["vocab"], n, 1000 * di + n)
            if p is None:
                continue
            T.compare("%s prompt of %d tokens, --prefill-chunk %d" % (dname, n, CHUNK), binary, tdir, ddir,
                      target, drafter, p, MAX_TOKENS, tmp=tmp, extra_args=["--prefill-chunk", str(CHUNK)])
        # the default chunk (256): a 1-token prompt, and a prompt of 2 tokens (control)
        for n in (1, 2):
            p = tie_free_prompt(target, drafter, g["vocab"], n, 5000 + 1000 * di + n)
            if p is not None:
                T.compare("%s prompt of %d tokens" % (dname, n), binary, tdir, ddir, target, drafter, p,
                          MAX_TOKENS, tmp=tmp)
        # a prefix-cache hit of n-1 tokens (one and two KV blocks)
        for n in (KV_BLOCK + 1, 2 * KV_BLOCK + 1):
            p = tie_free_prompt(target, drafter, g["vocab"], n, 9000 + 1000 * di + n)
            if p is not None:
                prefix_hit_case("%s prompt of %d tokens, twice" % (dname, n), binary, tdir, ddir, target, drafter,
                                p, tmp)
    # accepted drafts (multi-row context updates, starts advancing by more than one) must occur
    C.check(T.STATS["accepting_steps"] > 0, "TEST SETUP PROBLEM: no compared step accepted a draft")
    print("coverage: %(runs)d runs, %(steps)d steps compared, %(accepting_steps)d steps accepted >= 1 draft"
          % T.STATS, flush=True)
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
