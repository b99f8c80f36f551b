#!/usr/bin/env python3
"""FP8 drafters: DFlash and DSpark checkpoints with FP8 projections, and online FP8 of a drafter.

A drafter's layers and its fc are linear modules like a target's projections, so FP8 schemes quantize
them (graphswap mkmodel --arch dflash|dspark --fp8 ...: X.weight float8_e4m3fn with its scale, the
drafter's quantization_config as for a target; the DSpark heads stay unquantized, as lm_head). Its
derived stacked context K/V (rows K0, V0, K1, V1, ... of every layer's qkv) is then FP8 codes plus
derived.ctx_kv_scale, the scale rows of those rows, both refilled in place by the post-load hook.
For a DFlash drafter (block fp8, 16 x 32) and a DSpark drafter (compressed-tensors channel):
  - the FP8 drafter and its dequantized twin (--fp8-dequantized: each weight f32(q) * s) draft the same
    tokens: `graphswap generate --trace` writes byte-identical traces (anchors, every draft token,
    acceptance) and outputs, batched;
  - a server on D0 takes D1 (FP8 codes and scales; one tensor per bucket, and every scale apart from
    its weight) through model=draft and back: the drafter's checksums (derived.ctx_kv_weight and
    derived.ctx_kv_scale included) and greedy outputs with their spec counters equal a cold start;
  - a full drafter update without one scale is refused at finish, naming it, and a whole one repairs
    it.
Online FP8 of a drafter (serve --quantization fp8 --quantization-block 16,32 --draft P0, P0 bf16):
every drafter parameter and derived buffer equals a cold start on the FP8 checkpoint mkmodel writes from
the same bf16 weights, and so does bf16 P1 pushed to it; --draft-quantization none keeps the drafter as
it is stored while the target is FP8, and an FP8 drafter checkpoint beside an online-FP8 target loads
as it is. With --quantize-lm-head (the target's lm_head FP8, which a DFlash drafter drafts through),
speculative greedy decoding equals plain decoding, and the drafter's trace equals the one on the
dequantized twin target.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import random
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

import test_http_basic as H  # noqa: E402
import test_weights_fp8 as F  # noqa: E402
import test_weights_update as W  # noqa: E402

TGEOM = ["--hidden", "64", "--intermediate", "96", "--layers", "2"]
# scheme -> (mkmodel flags, scale suffix)
SCHEMES = {"fp8": (["--fp8", "16,32"], "_scale_inv"),
           "channel": (["--fp8", "channel", "--fp8-compressed-tensors"], "_scale")}


def mk_draft(C, binary, target, root, name, arch, scheme, dtype, seed, dequant=False, plain=False):
    extra = ["--layers", "2", "--dtype", dtype] + ([] if plain else SCHEMES[scheme][0])
    if dequant:
        extra.append("--fp8-dequantized")
    return W.mk_drafter(C, binary, target, os.path.join(root, name), seed, arch=arch, extra=extra)


def traces(C, binary, target, draft, tmp, tag, extra=()):
    """(outputs, trace) of a batched greedy run with the drafter, as text."""
    rng = random.Random(11)
    bf = os.path.join(tmp, "batch.jsonl")
    with open(bf, "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt_ids": [rng.randrange(512) for _ in range(6 + 9 * i)], "max_tokens": 24,
                                "temperature": 0, "ignore_eos": True}) + "\n")
    tr = os.path.join(tmp, "trace-%s.jsonl" % tag)
    p = subprocess.run([binary, "generate", "--model", target, "--draft", draft, "--batch-file", bf, "--trace", tr]
                       + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    C.check(p.returncode == 0, "generate with %s: exit %d: %s" % (tag, p.returncode, p.stderr.decode()[-400:]))
    return p.stdout.decode(), open(tr).read() if os.path.exists(tr) else ""


def test_twin(C, binary, target, root, arch, scheme):
    tag = "%s-%s" % (arch, scheme)
    q = mk_draft(C, binary, target, root, "Q-" + tag, arch, scheme, "f32", 4)
    d = mk_draft(C, binary, target, root, "T-" + tag, arch, scheme, "f32", 4, dequant=True)
    cfg = json.load(open(os.path.join(q, "config.json")))
    C.check("quantization_config" in cfg, "%s: the FP8 drafter has no quantization_config" % tag)
    out_q, tr_q = traces(C, binary, target, q, root, "q-" + tag)
    out_d, tr_d = traces(C, binary, target, d, root, "d-" + tag)
    C.check(tr_q != "" and tr_q == tr_d, "%s: the FP8 drafter and its dequantized twin draft differently:\n%s\n%s" %
            (tag, tr_q[:300], tr_d[:300]))
    C.check(out_q == out_d, "%s: outputs differ with the FP8 drafter and its twin" % tag)
    # the twin check sees the drafts: the plain (unquantized) drafter of the same seed drafts otherwise
    p = mk_draft(C, binary, target, root, "P-" + tag, arch, scheme, "f32", 4, plain=True)
    _, tr_p = traces(C, binary, target, p, root, "p-" + tag)
    C.check(tr_p != tr_q, "%s: the unquantized drafter drafts exactly as the FP8 one (the check is blind)" % tag)


def draft_full(C, srv, what, tensors, buckets, version):
    return W.push(C, srv, what, tensors, buckets, {"mode": "full", "model": "draft", "version": version})


def test_updates(C, binary, target, root, arch, scheme, rng):
    tag = "%s-%s" % (arch, scheme)
    sfx = SCHEMES[scheme][1]
    d0 = mk_draft(C, binary, target, root, "D0-" + tag, arch, scheme, "bf16", 1)
    d1 = mk_draft(C, binary, target, root, "D1-" + tag, arch, scheme, "bf16", 2)
    D0, D1 = W.ckpt(d0), W.ckpt(d1)
    C.check(D0["fc.weight"].dtype == "F8_E4M3" and ("fc.weight" + sfx) in D0 and
            D0["layers.1.self_attn.v_proj.weight"].dtype == "F8_E4M3",
            "%s: the drafter checkpoint's fc / v_proj are not FP8" % tag)
    ref0, ref1 = W.cold_snap(C, binary, target, d0), W.cold_snap(C, binary, target, d1)
    C.check("derived.ctx_kv_scale" in ref0["draft"], "%s: no derived.ctx_kv_scale among the drafter's checksums: %r"
            % (tag, sorted(ref0["draft"])[:40]))
    C.check(ref0["draft"].get("derived.ctx_kv_scale") != ref1["draft"].get("derived.ctx_kv_scale"),
            "%s: D0 and D1 have the same context K/V scales" % tag)
    srv = H.Server(C, binary, target, args=W.SPEC_ARGS + ["--draft", d0])
    try:
        W.same(C, "%s server at D0" % tag, W.snap(srv), ref0)
        for i, kind in enumerate(("one", "mixed")):
            b = W.make_buckets(list(D1), kind, rng)
            if kind == "mixed":
                b = F.scales_apart(b, sfx)
            draft_full(C, srv, "%s D0 -> D1 (%s)" % (tag, kind), D1, b, "d1-%d" % i)
            W.same(C, "%s D0 -> D1 (%s)" % (tag, kind), W.snap(srv), ref1, version="d1-%d" % i)
            draft_full(C, srv, "%s D1 -> D0 (%s)" % (tag, kind), D0, W.make_buckets(list(D0), kind, rng), "d0-%d" % i)
            W.same(C, "%s D1 -> D0 (%s)" % (tag, kind), W.snap(srv), ref0, version="d0-%d" % i)
        # a full drafter update without one scale: refused at finish naming it, nothing changes
        miss = "layers.0.self_attn.k_proj.weight" + sfx
        part = {n: t for n, t in D1.items() if n != miss}
        r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "draft"})
        C.check(r.status == 200, "%s: begin: %r" % (tag, r))
        r = W.post_bucket(srv, W.st_encode(list(part.values())))
        C.check(r.status == 200, "%s: the bucket without %s: %r" % (tag, miss, r))
        r = H.post(srv, "/v1/weights/finish", {})
        msg = (((r.json or {}).get("error") or {}).get("message") or "") if isinstance(r.json, dict) else ""
        C.check(r.status >= 400 and miss in msg, "%s: a full update without %s: %r %r" % (tag, miss, r, msg))
        # the server says so (inconsistent, 503) until a whole update repairs it
        C.check(H.get(srv, "/health").status == 503, "%s: healthy after a full update that lacked %s" % (tag, miss))
        draft_full(C, srv, "%s repair with D0" % tag, D0, W.make_buckets(list(D0), "all", rng), "d0-r")
        W.same(C, "%s repaired with D0" % tag, W.snap(srv), ref0, version="d0-r")
        H.healthy(C, srv, "weights_fp8_draft %s" % tag)
    finally:
        H.stop_clean(C, srv)


def test_online(C, binary, root, rng):
    """bf16 target and DFlash drafter, served with --quantization fp8: equal to the FP8 checkpoints."""
    bf = TGEOM + ["--dtype", "bf16", "--seed", "3"]
    tp = H.mkmodel(C, binary, os.path.join(root, "TP"), vocab=512, extra=bf)
    tq = H.mkmodel(C, binary, os.path.join(root, "TQ"), vocab=512, extra=bf + ["--fp8", "16,32"])
    p0 = mk_draft(C, binary, tp, root, "P0", "dflash", "fp8", "bf16", 1, plain=True)
    p1 = mk_draft(C, binary, tp, root, "P1", "dflash", "fp8", "bf16", 2, plain=True)
    q0 = mk_draft(C, binary, tq, root, "Q0", "dflash", "fp8", "bf16", 1)
    q1 = mk_draft(C, binary, tq, root, "Q1", "dflash", "fp8", "bf16", 2)
    want0, want1 = W.cold_snap(C, binary, tq, q0), W.cold_snap(C, binary, tq, q1)
    online = W.SPEC_ARGS + ["--quantization", "fp8", "--quantization-block", "16,32"]
    srv = H.Server(C, binary, tp, args=online + ["--draft", p0])
    try:
        W.same(C, "online FP8 target + drafter vs the FP8 checkpoints", W.snap(srv), want0)
        P1 = W.ckpt(p1)
        draft_full(C, srv, "bf16 P1 -> online FP8 drafter (mixed)", P1, W.make_buckets(list(P1), "mixed", rng), "p1")
        got = W.snap(srv)
        d = W.diff_sums(got["draft"], want1["draft"])
        C.check(not d, "bf16 P1 pushed to the online FP8 drafter: checksums differ from Q1's cold start in %s" % d[:6])
        H.healthy(C, srv, "online FP8 drafter")
    finally:
        H.stop_clean(C, srv)
    # --draft-quantization none: the target FP8, the drafter as stored (bf16): its checksums are P0's
    plain = W.cold_snap(C, binary, tp, p0)
    srv = H.Server(C, binary, tp, args=online + ["--draft", p0, "--draft-quantization", "none"])
    try:
        got = W.snap(srv)
        C.check(not W.diff_sums(got["draft"], plain["draft"]), "--draft-quantization none: the drafter changed")
        C.check(not W.diff_sums(got["target"], want0["target"]), "--draft-quantization none: the target is not FP8")
    finally:
        H.stop_clean(C, srv)
    # an FP8 drafter checkpoint beside an online-FP8 target loads as it is (no second quantization)
    srv = H.Server(C, binary, tp, args=online + ["--draft", q0])
    try:
        W.same(C, "online FP8 target + FP8 drafter checkpoint vs the FP8 checkpoints", W.snap(srv), want0)
    finally:
        H.stop_clean(C, srv)


def test_lm_head_spec(C, binary, root):
    """--quantize-lm-head with a DFlash drafter, which drafts through the target's lm_head (now FP8):
    speculative greedy outputs equal the same server's without the drafter (lossless), and a batched
    `generate --trace` (every anchor, draft token and acceptance) is byte-identical to the one on the
    dequantized twin target (projections and lm_head f32(q) * s) with the same f32 drafter
    (--draft-quantization none on both)."""
    geo = TGEOM + ["--dtype", "f32", "--seed", "5", "--no-tie"]
    t = H.mkmodel(C, binary, os.path.join(root, "TL"), vocab=512, extra=geo)
    tw = H.mkmodel(C, binary, os.path.join(root, "TLtwin"), vocab=512,
                   extra=geo + ["--fp8", "16,32", "--fp8-dequantized", "--fp8-lm-head"])
    d = mk_draft(C, binary, t, root, "DL", "dflash", "fp8", "f32", 6, plain=True)
    args = ["--quantization", "fp8", "--quantization-block", "16,32", "--quantize-lm-head"]
    outs = {}
    for tag, a in (("plain", args), ("spec", args + ["--draft", d])):
        srv = H.Server(C, binary, t, args=a)
        try:
            outs[tag] = [W.greedy(srv, p, max_tokens=24)[0] for p in W.PROMPTS]
            C.check("lm_head.scale" in W.checksums(srv, "target"), "--quantize-lm-head %s: lm_head is not FP8" % tag)
        finally:
            H.stop_clean(C, srv)
    C.check(outs["spec"] == outs["plain"] and isinstance(outs["plain"][0], list),
            "--quantize-lm-head: speculative greedy outputs differ from plain decoding: %r vs %r" %
            (outs["spec"], outs["plain"]))
    tmp = os.path.join(root, "lm-traces")
    os.makedirs(tmp, exist_ok=True)
    got = traces(C, binary, t, d, tmp, "online-lm", args + ["--draft-quantization", "none"])
    want = traces(C, binary, tw, d, tmp, "twin-lm")
    C.check(got[1] != "" and got == want,
            "--quantize-lm-head: the drafter's trace differs from the dequantized twin target's")
    other = traces(C, binary, t, d, tmp, "online-f32-lm", args[:-1] + ["--draft-quantization", "none"])
    C.check(other[1] != want[1], "the trace does not depend on lm_head's FP8 (no test of the drafts' lm_head)")


def main():
    C = H.Checker("weights_fp8_draft")
    binary = H.gs_bin(C)
    root = os.path.realpath(os.path.join(H.scratch("weights_fp8_draft"), "root"))
    os.makedirs(root, exist_ok=True)
    rng = random.Random(26)
    try:
        target = H.mkmodel(C, binary, os.path.join(root, "T"), vocab=512,
                           extra=TGEOM + ["--dtype", "f32", "--seed", "3"])
        target_bf = H.mkmodel(C, binary, os.path.join(root, "Tb"), vocab=512,
                              extra=TGEOM + ["--dtype", "bf16", "--seed", "3"])
        for arch, scheme in (("dflash", "fp8"), ("dspark", "channel")):
            test_twin(C, binary, target, root, arch, scheme)
            test_updates(C, binary, target_bf, root, arch, scheme, rng)
        test_online(C, binary, root, rng)
        test_lm_head_spec(C, binary, root)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
