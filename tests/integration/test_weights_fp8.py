#!/usr/bin/env python3
"""Block-FP8 checkpoints (Qwen3-FP8 / DeepSeek-V3 layout): cold load, logprobs, and FP8 + scale updates.

Checkpoints (graphswap mkmodel --dtype f32 --fp8 16,32: every projection stored as X.weight
float8_e4m3fn with X.weight_scale_inv float32 [ceil(rows / 16), ceil(cols / 32)] and a
quantization_config {quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size [16, 32],
modules_to_not_convert [lm_head]}, as Qwen3-8B-FP8's config.json has it): Q0 / Q1 (seeds 1 / 2) and their
twins D0 / D1 (--fp8-dequantized: the same model with each projection's weight f32(q) * s in f32, no
quantization_config).
  - a server on Q0 and one on D0 give the same greedy tokens and the same prompt and sampled logprobs,
    exactly (kern.h: an FP8 matmul is bitwise the f32 matmul over the dequantized weights), and Q0
    differs from Q1;
  - checksums by checkpoint name are exactly the checkpoint's tensors (every X.weight and
    X.weight_scale_inv);
  - the Q0 server takes Q1 in full updates (one tensor per bucket; mixed buckets with q / k / v and
    each weight apart from its scale; all in one) and back: each time checksums and greedy tokens equal a
    cold start on that checkpoint (hot == cold);
  - a full update without one weight_scale_inv is refused at finish (422 naming it), then repaired;
  - bad buckets, each answered 400 naming the tensor, nothing written: a NaN code (0x7f), a zero /
    negative / NaN / 256 scale, a scale table of the wrong shape, a weight sent as BF16 instead of
    F8_E4M3;
  - a config with another quant_method, or FP8 without weight_block_size, fails start-up naming it;
  - online FP8 (serve --quantization fp8 --quantization-block 16,32) on a plain bf16 checkpoint P0 equals a
    cold start on the block-FP8 checkpoint mkmodel writes from the same bf16 weights (same codes, same
    scales: checksums of every parameter, greedy tokens); bf16 P1 pushed to it (shuffled, q / k / v apart)
    equals FP8 Q1b's cold start, and P0 back equals Q0b again; a non-finite bf16 weight is refused (400);
    its export carries the computed scales under the checkpoint's names (checksums equal Q0b's), it takes
    Q1b's codes + scales as they are, an online replica joins it with --weights-from, and codes without
    their scale (or the reverse) are refused at finish (test_online_codes);
  - --quantize-lm-head (online FP8 of lm_head too) on an f32 checkpoint: exactly the logprobs of the
    twin with every projection and lm_head dequantized, and hot == cold for a pushed update
    (test_online_lm_head);
  - a replica started on Q0 joins with --weights-from the server at Q1 (FP8 codes and scales pulled as
    stored) and equals a cold start on Q1;
  - --bf16-activations on the bf16-based block-FP8 checkpoint Q0b gives exactly the tokens and logprobs
    of its bf16 twin B0 under --bf16-activations (every projection written here as bf16(f32(q) * s) with
    f32 denormals read as zero, the kern.h contract, from an e4m3 table built from the OCP spec), on the
    best ISA and GS_KERN_ISA=scalar / avx2, and online FP8 on P0 the same; =amx (projections in the pairs
    order, the bf16 lm_head in the AMX order) the same bits on every ISA; both differ from Q0b without
    the option (it takes effect on FP8 matmuls).
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import numpy as np  # noqa: E402

import ref_model as R  # noqa: E402
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

FP8 = ["--dtype", "f32", "--fp8", "16,32", "--hidden", "64", "--intermediate", "96", "--layers", "2"]
KSCALE = "model.layers.0.self_attn.k_proj.weight_scale_inv"


def mk(C, binary, root, name, seed, dequant):
    return H.mkmodel(C, binary, os.path.join(root, name), vocab=512,
                     extra=FP8 + ["--seed", str(seed)] + (["--fp8-dequantized"] if dequant else []))


def logprobs(srv, ids):
    """Greedy completion with prompt and sampled logprobs (the whole choice, compared exactly)."""
    r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                        "logprobs": 3, "prompt_logprobs": 2, "return_token_ids": True})
    if r.status != 200:
        return ("error", r.status, r.raw[:300])
    ch = r.json["choices"][0]
    return (ch.get("token_ids"), ch.get("logprobs"), ch.get("prompt_logprobs"))


def snap(srv):
    return {"target": W.checksums(srv, "target"), "gen": [W.greedy(srv, p) for p in W.PROMPTS]}


def cold(C, binary, model):
    srv = H.Server(C, binary, model)
    try:
        return snap(srv), [logprobs(srv, p) for p in W.PROMPTS]
    finally:
        srv.stop()
        srv.kill()


def full(C, srv, what, tensors, buckets, version):
    return W.push(C, srv, what, tensors, buckets, {"mode": "full", "model": "target", "version": version})


def scales_apart(buckets, sfx="_scale_inv"):
    """The bucket layout with every scale (name ending sfx) moved out of its weight's bucket into
    one of its own: weights and scales must not need each other in a call."""
    b = [list(bb) for bb in buckets]
    where = {n: j for j, bb in enumerate(b) for n in bb}
    for n in list(where):
        if n.endswith(sfx) and where[n] == where.get(n[:-len(sfx)]):
            b[where[n]].remove(n)
            b.append([n])
    return [bb for bb in b if bb]


def raw(name, dtype, arr):
    return R.RawTensor(name, dtype, arr.shape, R.encode_array(dtype, arr))


def test_bad_buckets(C, srv, Q1):
    base = W.checksums(srv, "target")
    w = Q1["model.layers.1.mlp.down_proj.weight"]
    s = Q1["model.layers.1.mlp.down_proj.weight_scale_inv"]
    codes = np.frombuffer(w.data, dtype="u1").reshape(w.shape).copy()
    nan = codes.copy()
    nan[3, 5] = 0x7F
    sc = np.frombuffer(s.data, dtype="<f4").reshape(s.shape).astype(np.float64)
    table = [("a NaN code", raw(w.name, "F8_E4M3", nan), w.name)]
    for what, v in (("a zero scale", 0.0), ("a negative scale", -0.5), ("a NaN scale", float("nan")),
                    ("a scale of 256", 256.0)):
        bad = sc.copy()
        bad[0, 1] = v
        table.append((what, raw(s.name, "F32", bad), s.name))
    table.append(("a scale table of the wrong shape", raw(s.name, "F32", np.ones((s.shape[0] + 1, s.shape[1]))), s.name))
    table.append(("a weight as BF16", raw(w.name, "BF16", np.zeros(w.shape)), w.name))
    r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target"})
    C.check(r.status == 200, "bad buckets: begin %r" % r)
    for what, t, needle in table:
        r = W.post_bucket(srv, W.st_encode([Q1["model.layers.0.mlp.up_proj.weight"], t]))
        H.error_ok(C, "bad FP8 bucket: %s" % what, r, 400)
        msg = H.error_message(r)
        C.check(needle in msg, "bad FP8 bucket: %s: the message does not name %s: %r" % (what, needle, msg))
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "abort after the bad buckets: %r" % r)
    d = W.diff_sums(W.checksums(srv, "target"), base)
    C.check(not d, "bad FP8 buckets wrote weights: %s" % d[:5])
    H.healthy(C, srv, "after the bad FP8 buckets")


def test_missing_scale(C, srv, Q0, Q1, ref0):
    part = {n: t for n, t in Q1.items() if n != KSCALE}
    r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target"})
    names = sorted(part)
    for b in (names[::2], names[1::2]):
        r = W.post_bucket(srv, W.st_encode([part[n] for n in b]))
        C.check(r.status == 200, "missing scale: bucket %r" % r)
    r = H.post(srv, "/v1/weights/finish", {})
    H.error_ok(C, "a full update without %s" % KSCALE, r, 422, KSCALE)
    full(C, srv, "repair after the missing scale", Q0, W.make_buckets(list(Q0), "all", random.Random(1)), "repaired")
    W.same(C, "repaired after the missing scale", snap(srv), ref0)


def test_config_refusals(C, binary, root, q0):
    for what, qc, needle in (("awq", {"quant_method": "awq", "bits": 4}, "awq"),
                             ("per-tensor FP8", {"quant_method": "fp8", "activation_scheme": "dynamic"},
                              "weight_block_size"),
                             ("static activations", {"quant_method": "fp8", "activation_scheme": "static",
                                                     "weight_block_size": [16, 32]}, "activation_scheme"),
                             ("a block of 24 columns", {"quant_method": "fp8", "weight_block_size": [16, 24]},
                              "weight_block_size")):
        d = os.path.join(root, "bad-" + what.replace(" ", "-"))
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(q0, d)
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg["quantization_config"] = qc
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        p = subprocess.run([binary, "generate", "--model", d, "--prompt-ids", "1,2,3", "--max-tokens", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        err = p.stderr.decode(errors="replace")
        C.check(p.returncode != 0 and needle in err and "quantization_config" in err,
                "%s: exit %d, stderr %r" % (what, p.returncode, err[-300:]))


def test_online(C, binary, root):
    bf = ["--dtype", "bf16"] + [a for a in FP8[2:] if a not in ("--fp8", "16,32")]
    mkq = lambda name, seed: H.mkmodel(C, binary, os.path.join(root, name), vocab=512,  # noqa: E731
                                       extra=bf + ["--fp8", "16,32", "--seed", str(seed)])
    mkp = lambda name, seed: H.mkmodel(C, binary, os.path.join(root, name), vocab=512,  # noqa: E731
                                       extra=bf + ["--seed", str(seed)])
    q0b, q1b, p0, p1 = mkq("Q0b", 1), mkq("Q1b", 2), mkp("P0", 1), mkp("P1", 2)
    (want0, _), (want1, _) = cold(C, binary, q0b), cold(C, binary, q1b)
    P0, P1 = W.ckpt(p0), W.ckpt(p1)
    C.check(P0["model.layers.0.self_attn.q_proj.weight"].dtype == "BF16", "P0 is not bf16")
    srv = H.Server(C, binary, p0, args=["--quantization", "fp8", "--quantization-block", "16,32"])
    try:
        W.same(C, "online FP8 on bf16 P0 vs block-FP8 Q0b", snap(srv), want0)
        rng = random.Random(27)
        full(C, srv, "bf16 P1 -> online FP8 (mixed)", P1, W.make_buckets(list(P1), "mixed", rng), "p1")
        W.same(C, "bf16 P1 pushed to online FP8 vs Q1b", snap(srv), want1, version="p1")
        full(C, srv, "bf16 P0 -> online FP8 (one per bucket)", P0, W.make_buckets(list(P0), "one", rng), "p0")
        W.same(C, "bf16 P0 pushed back vs Q0b", snap(srv), want0, version="p0")
        w = P1["model.layers.1.mlp.gate_proj.weight"]
        arr = w.to_f64().copy()
        arr[2, 3] = float("inf")
        r = H.post(srv, "/v1/weights/begin", {"mode": "partial", "model": "target"})
        r = W.post_bucket(srv, W.st_encode([raw(w.name, "BF16", arr)]))
        H.error_ok(C, "online FP8: a non-finite weight", r, 400)
        msg = H.error_message(r)
        C.check(w.name in msg, "online FP8: the 400 does not name %s: %r" % (w.name, msg))
        H.post(srv, "/v1/weights/abort", {})
        W.same(C, "online FP8 after the refused bucket", snap(srv), want0)
        H.healthy(C, srv, "online FP8")
        test_online_codes(C, binary, srv, q0b, p0, W.ckpt(q1b), want0, want1)
    finally:
        H.stop_clean(C, srv)
    test_bf16_activations(C, binary, root, q0b, p0)


def test_online_codes(C, binary, srv, q0b, p0, Q1b, want0, want1):
    """The online server (at P0) exports its codes with the scales it computed, named as in the block-FP8
    checkpoint written from the same weights (checkpoint-name checksums equal Q0b's); takes FP8 codes +
    scales (Q1b) in a full update, weights and scales in different buckets, and equals Q1b's cold start;
    a replica started online on P0 joins it with --weights-from and equals it too; codes without their
    scale, or a scale without its codes, are refused at finish naming the tensor (422)."""
    def ck_sums(s):
        r = H.get(s, "/v1/weights/checksums?model=target&names=checkpoint")
        return ((r.json or {}).get("tensors") or {}) if r.status == 200 else {"_error": r.status}

    ref = H.Server(C, binary, q0b)
    try:
        want_ck = ck_sums(ref)
    finally:
        H.stop_clean(C, ref)
    got_ck = ck_sums(srv)
    C.check(got_ck == want_ck and any(n.endswith("_scale_inv") for n in got_ck),
            "online FP8: checksums by checkpoint name are not the block-FP8 checkpoint's: %r" %
            sorted(n for n in set(got_ck) | set(want_ck) if got_ck.get(n) != want_ck.get(n))[:8])
    rng = random.Random(29)
    full(C, srv, "FP8 Q1b codes + scales -> online FP8", Q1b, scales_apart(W.make_buckets(list(Q1b), "mixed", rng)),
         "q1b")
    W.same(C, "Q1b's codes pushed to online FP8 vs Q1b", snap(srv), want1, version="q1b")
    test_pull(C, binary, srv, p0, want1, "an online-FP8 replica joining with --weights-from",
              ["--quantization", "fp8", "--quantization-block", "16,32"])
    w = "model.layers.1.mlp.down_proj.weight"
    for what, names in (("codes without their scale", [w]), ("a scale without its codes", [w + "_scale_inv"])):
        H.post(srv, "/v1/weights/begin", {"mode": "partial", "model": "target"})
        r = W.post_bucket(srv, W.st_encode([Q1b[n] for n in names]))
        C.check(r.status == 200, "online FP8, %s: the bucket itself: %r" % (what, r))
        r = H.post(srv, "/v1/weights/finish", {})
        H.error_ok(C, "online FP8: %s" % what, r, 422)
        H.post(srv, "/v1/weights/abort", {})
        msg = H.error_message(r)
        C.check(w + "_scale_inv" in msg, "online FP8, %s: the 422 does not name the scale: %r" % (what, msg))
        C.check(H.get(srv, "/v1/weights").json.get("state") == "inconsistent",
                "online FP8, %s: not inconsistent after the refused finish (part of it was written)" % what)
        # (a refused session that wrote leaves the weights inconsistent until a full update)
        P0 = W.ckpt(p0)
        full(C, srv, "bf16 P0 after: %s" % what, P0, W.make_buckets(list(P0), "all", rng), "p0-again")
        W.same(C, "online FP8 back at P0 after: %s" % what, snap(srv), want0, version="p0-again")


def test_online_lm_head(C, binary, root):
    """serve --quantization fp8 --quantize-lm-head: the untied lm_head is block FP8 too. On an f32
    checkpoint its logprobs are exactly those of the twin mkmodel --fp8-dequantized --fp8-lm-head writes
    (every projection and lm_head as f32(q) * s: an FP8 matmul is bitwise the f32 one over the
    dequantized weights) and differ from the twin with lm_head left f32 (the option takes effect); a
    bf16 update pushed to it equals a cold start of the same server on that checkpoint (checksums of
    every parameter, lm_head's codes and scales included, and the twin's logprobs); a non-finite
    lm_head weight is refused naming it; a replica started with the same flags on P1 joins it with
    --weights-from and equals it; a tied checkpoint, or the flag without --quantization fp8, fails
    start-up naming why."""
    geo = [a for a in FP8[2:] if a not in ("--fp8", "16,32")] + ["--no-tie"]
    mk_ = lambda name, seed, extra: H.mkmodel(C, binary, os.path.join(root, name), vocab=512,  # noqa: E731
                                              extra=["--dtype", "f32"] + geo + ["--seed", str(seed)] + extra)
    twin = ["--fp8", "16,32", "--fp8-dequantized"]
    p0, p1 = mk_("L-P0", 1, []), mk_("L-P1", 2, [])
    t0, t1, m0 = mk_("L-T0", 1, twin + ["--fp8-lm-head"]), mk_("L-T1", 2, twin + ["--fp8-lm-head"]), mk_("L-M0", 1, twin)
    args = ["--quantization", "fp8", "--quantization-block", "16,32", "--quantize-lm-head"]

    def run(model, a):
        srv = H.Server(C, binary, model, args=a)
        try:
            return snap(srv), [logprobs(srv, p) for p in W.PROMPTS]
        finally:
            H.stop_clean(C, srv)

    (_, lt0), (_, lt1), (_, lm0) = run(t0, []), run(t1, []), run(m0, [])
    (cold1, _) = run(p1, args)
    srv = H.Server(C, binary, p0, args=args)
    try:
        got0 = snap(srv), [logprobs(srv, p) for p in W.PROMPTS]
        sums = got0[0]["target"]
        C.check("lm_head" in sums and "lm_head.scale" in sums,
                "--quantize-lm-head: no lm_head scale table among %r" % sorted(sums)[:8])
        C.check(got0[1][0][1] is not None and got0[1] == lt0,
                "--quantize-lm-head: online FP8 on P0 vs its dequantized twin T0: %r vs %r" %
                (str(got0[1])[:300], str(lt0)[:300]))
        C.check(lt0 != lm0, "the twins with and without an FP8 lm_head give the same logprobs")
        P0, P1 = W.ckpt(p0), W.ckpt(p1)
        rng = random.Random(28)
        full(C, srv, "f32 P1 -> online FP8 + lm_head (mixed)", P1, W.make_buckets(list(P1), "mixed", rng), "p1")
        W.same(C, "P1 pushed to --quantize-lm-head vs its cold start", snap(srv), cold1, version="p1")
        C.check([logprobs(srv, p) for p in W.PROMPTS] == lt1, "--quantize-lm-head after P1: not T1's logprobs")
        full(C, srv, "f32 P0 back (one per bucket)", P0, W.make_buckets(list(P0), "one", rng), "p0")
        W.same(C, "P0 pushed back to --quantize-lm-head", snap(srv), got0[0], version="p0")
        arr = P1["lm_head.weight"].to_f64().copy()
        arr[5, 1] = float("nan")
        H.post(srv, "/v1/weights/begin", {"mode": "partial", "model": "target"})
        r = W.post_bucket(srv, W.st_encode([raw("lm_head.weight", "F32", arr)]))
        H.error_ok(C, "--quantize-lm-head: a NaN lm_head weight", r, 400)
        msg = H.error_message(r)
        C.check("lm_head.weight" in msg, "--quantize-lm-head: the 400 does not name lm_head.weight: %r" % msg)
        H.post(srv, "/v1/weights/abort", {})
        W.same(C, "--quantize-lm-head after the refused bucket", snap(srv), got0[0])
        # a replica with the same flags joins with --weights-from: lm_head's codes and scales travel too
        test_pull(C, binary, srv, p1, got0[0], "a --quantize-lm-head replica joining with --weights-from", args)
    finally:
        H.stop_clean(C, srv)
    tied = H.mkmodel(C, binary, os.path.join(root, "L-tied"), vocab=512, extra=["--dtype", "f32"] + geo[:-1])
    for model, a, needle in ((tied, args, "tie_word_embeddings"), (p0, ["--quantize-lm-head"], "--quantization fp8")):
        p = subprocess.run([binary, "generate", "--model", model, "--prompt-ids", "1,2,3", "--max-tokens", "1"] + a,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        err = p.stderr.decode(errors="replace")
        C.check(p.returncode != 0 and needle in err, "--quantize-lm-head refusal (%s): exit %d, stderr %r" %
                (needle, p.returncode, err[-300:]))


def e4m3_values():
    """The float32 value of each of the 256 e4m3 codes, from the OCP spec (sign, exponent bias 7,
    3 mantissa bits, subnormals at exponent 0; the NaN codes 0x7f / 0xff as NaN)."""
    t = np.zeros(256, np.float64)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        v = 2.0 ** (e - 7) * (1 + m / 8) if e else 2.0 ** -6 * (m / 8)
        t[c] = float("nan") if c & 0x7f == 0x7f else (-v if c & 0x80 else v)
    return t.astype(np.float32)


def bf16_twin(src, dst):
    """The bf16 checkpoint a block-FP8 one runs as under --bf16-activations (kernels/kern.h KOP_MATMUL):
    each projection's weight kern_f32_to_bf16_daz(f32(q) * s), one float32 multiply by its block's scale,
    f32 denormals read as zero, then bf16 round to nearest even; every other tensor as stored; the
    config without quantization_config."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    b0, b1 = cfg.pop("quantization_config")["weight_block_size"]
    tab, ts, out = e4m3_values(), R.read_checkpoint_tensors(src), []
    for n, t in ts.items():
        if n.endswith("_scale_inv"):
            continue
        if t.dtype == "F8_E4M3":
            rows, cols = t.shape
            q = np.frombuffer(t.data, np.uint8).reshape(rows, cols)
            sc = ts[n + "_scale_inv"]
            s = np.frombuffer(sc.data, "<f4").reshape(sc.shape)
            w = tab[q] * np.repeat(np.repeat(s, b0, 0), b1, 1)[:rows, :cols]  # float32 x float32
            w = np.where(np.abs(w) < np.float32(2.0 ** -126), np.copysign(np.float32(0), w), w)
            t = R.RawTensor(n, "BF16", t.shape, R.encode_array("BF16", w))
        out.append(t)
    os.makedirs(dst, exist_ok=True)
    R.write_safetensors(os.path.join(dst, "model.safetensors"), out)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    for f in os.listdir(src):
        if f.startswith("tokenizer"):
            shutil.copy(os.path.join(src, f), dst)
    return dst


def test_bf16_activations(C, binary, root, q0b, p0):
    """FP8 matmuls in the bf16-activation modes: bitwise the bf16 twin's (see the module docstring)."""
    b0 = bf16_twin(q0b, os.path.join(root, "B0"))
    C.check(W.ckpt(b0)["model.layers.0.mlp.down_proj.weight"].dtype == "BF16", "B0's projections are not bf16")

    def lps(model, args, env=None):
        srv = H.Server(C, binary, model, args=args, env=env)
        try:
            return [logprobs(srv, p) for p in W.PROMPTS]
        finally:
            H.stop_clean(C, srv)

    plain, twin = lps(q0b, []), None
    for mode in ("--bf16-activations", "--bf16-activations=amx"):
        got = lps(q0b, [mode])
        C.check(got[0][1] is not None and got != plain,
                "%s: FP8 Q0b gives the logprobs of f32 activations (option not in effect)" % mode)
        if mode.endswith("=amx"):
            # the projections in the pairs order, the bf16 lm_head in the AMX order: no twin runs that
            # mix, so the mode is checked for taking effect and for its bits on every ISA
            want = got
        else:
            want = twin = lps(b0, [mode])
            C.check(want != lps(b0, []), "%s: B0's logprobs did not change" % mode)
            C.check(got == want, "%s: FP8 Q0b vs its bf16 twin B0: %r vs %r" % (mode, str(got)[:300], str(want)[:300]))
        for isa in ("scalar", "avx2"):
            C.check(lps(q0b, [mode], env={"GS_KERN_ISA": isa}) == want, "%s: GS_KERN_ISA=%s differs" % (mode, isa))
    got = lps(p0, ["--bf16-activations", "--quantization", "fp8", "--quantization-block", "16,32"])
    C.check(got == twin, "--bf16-activations: online FP8 on P0 vs B0")


def test_pull(C, binary, srv, model, want, what, args=()):
    """A replica started on `model` (with `args`) joins the server srv with --weights-from: FP8 codes
    and scales travel as they are stored, and the replica's snapshot equals `want`."""
    b = H.Server(C, binary, model, args=list(args) + ["--weights-from", "http://127.0.0.1:%d" % srv.port,
                                                      "--weights-from-timeout", "120"])
    try:
        t0 = time.time()
        while time.time() - t0 < 60 and (H.get(b, "/health?ready=1").status != 200):
            time.sleep(0.1)
        W.same(C, what, snap(b), want)
    finally:
        H.stop_clean(C, b)


def main():
    C = H.Checker("weights_fp8")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_fp8")
    root = os.path.realpath(os.path.join(tmp, "root"))
    os.makedirs(root, exist_ok=True)
    q0, q1 = mk(C, binary, root, "Q0", 1, False), mk(C, binary, root, "Q1", 2, False)
    d0 = mk(C, binary, root, "D0", 1, True)
    try:
        Q0, Q1 = W.ckpt(q0), W.ckpt(q1)
        C.check(Q0["model.layers.0.self_attn.q_proj.weight"].dtype == "F8_E4M3" and Q0[KSCALE].dtype == "F32" and
                Q0["model.embed_tokens.weight"].dtype == "F32", "the FP8 checkpoint's dtypes")
        (ref0, lp0), (ref1, _) = cold(C, binary, q0), cold(C, binary, q1)
        (twin0, tlp0) = cold(C, binary, d0)
        C.check(ref0["gen"] == twin0["gen"], "FP8 Q0 and its dequantized twin differ in greedy tokens")
        C.check(lp0 == tlp0, "FP8 Q0 and its dequantized twin differ in logprobs: %r vs %r" %
                (str(lp0)[:300], str(tlp0)[:300]))
        C.check(lp0[0][1] is not None and lp0[0][2] is not None, "no logprobs returned: %r" % (lp0[0],))
        C.check(ref0["gen"] != ref1["gen"], "Q0 and Q1 give the same greedy output")
        rng = random.Random(26)
        srv = H.Server(C, binary, q0, args=["--weights-root", root])
        try:
            r = H.get(srv, "/v1/weights/checksums?model=target&names=checkpoint")
            names = set(((r.json or {}).get("tensors") or {}) if r.status == 200 else {})
            C.check(names == set(Q0), "checksums by checkpoint name are not the checkpoint's tensors: %r" %
                    sorted(names ^ set(Q0))[:10])
            C.check(len([n for n in names if n.endswith("weight_scale_inv")]) == 2 * 7, "not 14 scale tables")
            W.same(C, "FP8 server at Q0", snap(srv), ref0)
            for i, kind in enumerate(("one", "mixed", "all")):
                b = W.make_buckets(list(Q1), kind, rng)
                if kind == "mixed":  # every weight apart from its scale too
                    b = scales_apart(b)
                full(C, srv, "Q0 -> Q1 (%s)" % kind, Q1, b, "q1-%d" % i)
                W.same(C, "Q0 -> Q1 (%s)" % kind, snap(srv), ref1, version="q1-%d" % i)
                full(C, srv, "Q1 -> Q0 (%s)" % kind, Q0, W.make_buckets(list(Q0), kind, rng), "q0-%d" % i)
                W.same(C, "Q1 -> Q0 (%s)" % kind, snap(srv), ref0, version="q0-%d" % i)
            test_missing_scale(C, srv, Q0, Q1, ref0)
            test_bad_buckets(C, srv, Q1)
            full(C, srv, "Q0 -> Q1 before the pull", Q1, W.make_buckets(list(Q1), "all", rng), "q1-pull")
            test_pull(C, binary, srv, q0, ref1, "an FP8 replica joining with --weights-from")
            H.healthy(C, srv, "weights_fp8")
        finally:
            H.stop_clean(C, srv)
        test_config_refusals(C, binary, root, q0)
        test_online(C, binary, root)
        test_online_lm_head(C, binary, root)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
