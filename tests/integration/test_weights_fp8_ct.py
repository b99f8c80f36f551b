#!/usr/bin/env python3
"""compressed-tensors FP8 checkpoints (llm-compressor's FP8_DYNAMIC / FP8 / FP8_BLOCK layouts).

Checkpoints (graphswap mkmodel --fp8 channel|tensor|R,C [--fp8-compressed-tensors]): every projection
stored as X.weight float8_e4m3fn with X.weight_scale in the model's dtype, per output row [N, 1]
(strategy channel), per tensor [1] (strategy tensor: q, k and v each their own) or per block, and a
quantization_config {quant_method compressed-tensors, format float-quantized, config_groups {group_0:
{targets [Linear], weights {num_bits 8, type float, strategy, symmetric, dynamic false},
input_activations {dynamic true, strategy token}}}, ignore [lm_head], quantization_status compressed}
as llm-compressor writes it (the group's fields: src/llmcompressor's FP8_DYNAMIC preset and
compressed-tensors' QuantizationArgs).
For each strategy:
  - f32 checkpoints: the FP8 model gives exactly the greedy tokens, prompt logprobs and sampled
    logprobs of its dequantized twin (--fp8-dequantized: each weight f32(q) * s);
  - bf16 checkpoints (scales in BF16): checksums by checkpoint name are the SHA-256 of every tensor's
    bytes as the file stores them (the scales come back in BF16, a per-tensor scale as its one value);
  - the server on B0 takes B1 in full updates (one tensor per bucket; mixed, each weight apart from its
    scale; all in one) and back: checksums and greedy tokens equal a cold start each time;
  - tensor strategy: a 0-dim scale is taken as the [1] it stands for; a scale of shape [2], a zero
    scale and a channel scale of shape [N] are refused (400 naming the tensor), nothing written.
Qwen3-MoE (4 experts top-2, one dense layer), block fp8 and compressed-tensors channel: the twin and
update checks above, with every expert's part FP8 and its own scale (the router stays BF16); and online
FP8 on bf16 MoE checkpoints in both expert layouts (per part, transformers 5's fused) equals a cold
start on the FP8 checkpoint of the same weights.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import hashlib
import os
import random
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import numpy as np  # noqa: E402

import ref_model as R  # noqa: E402
import test_http_basic as H  # noqa: E402
import test_weights_fp8 as F  # noqa: E402
import test_weights_update as W  # noqa: E402

GEOM = ["--hidden", "64", "--intermediate", "96", "--layers", "2"]


def mk(C, binary, root, name, scheme, dtype, seed, dequant=False, geom=GEOM):
    """scheme: channel / tensor / block (compressed-tensors), or fp8 (quant_method fp8, 16 x 32 blocks)"""
    fp8 = (["--fp8", "16,32", "--fp8-compressed-tensors"] if scheme == "block" else ["--fp8", "16,32"]
           if scheme == "fp8" else ["--fp8", scheme])
    return H.mkmodel(C, binary, os.path.join(root, name), vocab=512,
                     extra=geom + fp8 + ["--dtype", dtype, "--seed", str(seed)] +
                     (["--fp8-dequantized"] if dequant else []))


def test_twin(C, binary, root, scheme, geom=GEOM, tag=""):
    q = mk(C, binary, root, "F-" + tag + scheme, scheme, "f32", 1, geom=geom)
    d = mk(C, binary, root, "T-" + tag + scheme, scheme, "f32", 1, True, geom=geom)
    (ref, lp), (twin, tlp) = F.cold(C, binary, q), F.cold(C, binary, d)
    C.check(ref["gen"] == twin["gen"], "%s: FP8 and its dequantized twin differ in greedy tokens" % scheme)
    C.check(lp == tlp, "%s: FP8 and its dequantized twin differ in logprobs: %r vs %r" %
            (scheme, str(lp)[:300], str(tlp)[:300]))
    C.check(lp[0][1] is not None and lp[0][2] is not None, "%s: no logprobs returned" % scheme)


def bad_buckets(C, srv, B1, scheme):
    base = W.checksums(srv, "target")
    sfx = "_scale_inv" if scheme == "fp8" else "_scale"
    s = B1["model.layers.1.self_attn.k_proj.weight" + sfx]
    other = sorted(n for n in B1 if n.endswith("proj.weight"))[-1]
    sc = np.asarray(s.to_f64(), dtype=np.float64).reshape(s.shape)
    zero = sc.copy()
    zero.flat[0] = 0.0
    table = [("a zero scale", F.raw(s.name, "BF16", zero))]
    if scheme in ("fp8", "block"):
        table.append(("a block scale table of the wrong shape", F.raw(s.name, "BF16", np.ones((3, 2)))))
    elif scheme == "tensor":
        table.append(("a per-tensor scale of shape [2]", F.raw(s.name, "BF16", np.ones(2))))
    else:
        table.append(("a channel scale of shape [N]", F.raw(s.name, "BF16", sc.reshape(-1))))
    r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target"})
    C.check(r.status == 200, "%s bad buckets: begin %r" % (scheme, r))
    for what, t in table:
        r = W.post_bucket(srv, W.st_encode([B1[other], t]))
        H.error_ok(C, "%s: bad bucket: %s" % (scheme, what), r, 400)
        msg = (((r.json or {}).get("error") or {}).get("message") or "") if isinstance(r.json, dict) else ""
        C.check(s.name in msg, "%s: %s: the message does not name %s: %r" % (scheme, what, s.name, msg))
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "%s: abort after the bad buckets: %r" % (scheme, r))
    d = W.diff_sums(W.checksums(srv, "target"), base)
    C.check(not d, "%s: bad buckets wrote weights: %s" % (scheme, d[:5]))


def test_updates(C, binary, root, scheme, rng, geom=GEOM, tag=""):
    b0 = mk(C, binary, root, "B0-" + tag + scheme, scheme, "bf16", 1, geom=geom)
    b1 = mk(C, binary, root, "B1-" + tag + scheme, scheme, "bf16", 2, geom=geom)
    B0, B1 = W.ckpt(b0), W.ckpt(b1)
    sfx = "_scale_inv" if scheme == "fp8" else "_scale"
    ks = "model.layers.0.self_attn.k_proj.weight" + sfx
    want_shape = (1,) if scheme == "tensor" else (32, 1) if scheme == "channel" else (2, 2)
    sdt = "F32" if scheme == "fp8" else "BF16"
    C.check(B0["model.layers.0.self_attn.k_proj.weight"].dtype == "F8_E4M3" and B0[ks].dtype == sdt and
            B0[ks].shape == want_shape, "%s: the checkpoint's k_proj: %s %r" % (scheme, B0[ks].dtype, B0[ks].shape))
    if tag == "moe-":
        ex = "model.layers.0.mlp.experts.3.down_proj.weight"
        C.check(B0[ex].dtype == "F8_E4M3" and (ex + sfx) in B0 and B0["model.layers.0.mlp.gate.weight"].dtype == "BF16"
                and B0["model.layers.1.mlp.down_proj.weight"].dtype == "F8_E4M3",
                "%s: the MoE checkpoint's experts are not FP8 (or its router is)" % scheme)
    (ref0, _), (ref1, _) = F.cold(C, binary, b0), F.cold(C, binary, b1)
    C.check(ref0["gen"] != ref1["gen"], "%s: B0 and B1 give the same greedy output" % scheme)
    srv = H.Server(C, binary, b0)
    try:
        r = H.get(srv, "/v1/weights/checksums?model=target&names=checkpoint")
        got = ((r.json or {}).get("tensors") or {}) if r.status == 200 else {}
        want = {n: hashlib.sha256(t.data).hexdigest() for n, t in B0.items()}
        C.check(set(got) == set(want), "%s: checksums by checkpoint name are not the checkpoint's tensors: %r" %
                (scheme, sorted(set(got) ^ set(want))[:10]))
        bad = sorted(n for n in want if got.get(n) != want[n])
        C.check(not bad, "%s: checksums by checkpoint name differ from the file's bytes: %s" % (scheme, bad[:6]))
        W.same(C, "%s server at B0" % scheme, F.snap(srv), ref0)
        for i, kind in enumerate(("one", "mixed", "all")):
            b = W.make_buckets(list(B1), kind, rng)
            if kind == "mixed":  # every weight apart from its scale too
                b = F.scales_apart(b, sfx)
            F.full(C, srv, "%s B0 -> B1 (%s)" % (scheme, kind), B1, b, "b1-%d" % i)
            W.same(C, "%s B0 -> B1 (%s)" % (scheme, kind), F.snap(srv), ref1, version="b1-%d" % i)
            F.full(C, srv, "%s B1 -> B0 (%s)" % (scheme, kind), B0, W.make_buckets(list(B0), kind, rng), "b0-%d" % i)
            W.same(C, "%s B1 -> B0 (%s)" % (scheme, kind), F.snap(srv), ref0, version="b0-%d" % i)
        if scheme == "tensor":  # a 0-dim scale stands for its [1]
            zd = dict(B1)
            for n in [n for n in zd if n.endswith("_scale")]:
                zd[n] = R.RawTensor(n, zd[n].dtype, (), zd[n].data)
            F.full(C, srv, "tensor B0 -> B1 with 0-dim scales", zd, W.make_buckets(list(zd), "all", rng), "b1-0d")
            W.same(C, "tensor B0 -> B1 with 0-dim scales", F.snap(srv), ref1, version="b1-0d")
        bad_buckets(C, srv, B1, scheme)
        H.healthy(C, srv, "weights_fp8_ct %s" % scheme)
    finally:
        H.stop_clean(C, srv)


# Qwen3-MoE: 4 experts top-2 of width 32, layer 1 dense (--mlp-only 1): every expert's gate / up /
# down with its own weight and scale (no fused layout for FP8 checkpoints)
MOE = ["--arch", "qwen3_moe", "--hidden", "64", "--intermediate", "96", "--layers", "2", "--experts", "4",
       "--experts-per-tok", "2", "--moe-intermediate", "32", "--mlp-only", "1"]


def test_moe_online(C, binary, root):
    """Online FP8 on bf16 Qwen3-MoE checkpoints in both expert layouts (one tensor per part, and
    transformers 5's fused gate_up_proj / down_proj) equals a cold start on the block-FP8 checkpoint
    mkmodel writes from the same weights."""
    q = mk(C, binary, root, "MQ", "fp8", "bf16", 5, geom=MOE)
    plain = [H.mkmodel(C, binary, os.path.join(root, n), vocab=512, extra=MOE + ["--dtype", "bf16", "--seed", "5"] + x)
             for n, x in (("MP", []), ("MPF", ["--moe-fused"]))]
    ref, _ = F.cold(C, binary, q)
    for p, what in zip(plain, ("per-expert", "fused")):
        srv = H.Server(C, binary, p, args=["--quantization", "fp8", "--quantization-block", "16,32"])
        try:
            W.same(C, "online FP8 on the %s bf16 MoE checkpoint" % what, F.snap(srv), ref)
        finally:
            H.stop_clean(C, srv)


def main():
    C = H.Checker("weights_fp8_ct")
    binary = H.gs_bin(C)
    root = os.path.realpath(os.path.join(H.scratch("weights_fp8_ct"), "root"))
    os.makedirs(root, exist_ok=True)
    rng = random.Random(27)
    try:
        for scheme in ("channel", "tensor", "block"):
            test_twin(C, binary, root, scheme)
            test_updates(C, binary, root, scheme, rng)
        for scheme in ("fp8", "channel"):
            test_twin(C, binary, root, scheme, geom=MOE, tag="moe-")
            test_updates(C, binary, root, scheme, rng, geom=MOE, tag="moe-")
        test_moe_online(C, binary, root)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
