"""Self-check of the numpy reference (tests/reference/ref_model.py); needs no graphswap binary.

Builds tiny checkpoints with the reference's own safetensors writer and checks:
  * safetensors writer/reader round trips (BF16 rounding, F16, F32, I32, sharded index),
  * the strict loader rejects missing / extra / mis-shaped tensors,
  * forward shapes and finiteness for qwen3 / llama / qwen2 variants,
  * teacher-forced one-pass log-probs == brute-force per-token recomputation (no KV cache),
  * KV-cache greedy == brute-force greedy; chunked prefill through the cache == one pass,
  * a second, deliberately naive per-token / per-head loop implementation agrees,
  * RoPE properties (norm preserving, relative-position only),
  * Qwen3-MoE: the sparse-layer rule, transformers' config defaults and the num_local_experts alias;
    router ties go to the lower expert id (first place and k-th place), norm_topk_prob on / off
    (k = 1: weight 1 vs p_max; k = E: no difference), a MoE whose experts all copy one dense MLP equals
    that dense Qwen3 (norm on, or k = E), per-expert <-> fused conversion is byte-exact and both
    layouts give bitwise-equal logits, the strict loader rejects mixed / incomplete / mis-named /
    mis-shaped expert sets, and the cache / brute-force / chunked / naive-loop checks above on MoE
    variants (both layouts, k = 1 / 2 / 3, norm on / off, decoder_sparse_step 2 + mlp_only_layers).
"""

import os
import shutil
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_model as rm  # noqa: E402

PASSED = 0
FAILED = 0


def check(cond, msg):
    global PASSED, FAILED
    if cond:
        PASSED += 1
    else:
        FAILED += 1
        print("FAIL: " + msg, flush=True)


def naive_forward(model, ids):
    """Token-by-token, head-by-head loops; independent of RefModel.forward's vectorization."""
    cfg = model.cfg
    W = model.w
    hd, nh, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
    group = nh // nkv

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v) + cfg.eps) * w

    def lin(v, name):
        out = W[name + ".weight"].dot(v)
        if name + ".bias" in W:
            out = out + W[name + ".bias"]
        return out

    def rope(vec, p):
        out = np.empty_like(vec)
        half = hd // 2
        for i in range(half):
            a = p * cfg.theta ** (-(2.0 * i) / hd)
            c, s = np.cos(a), np.sin(a)
            x1, x2 = vec[i], vec[i + half]
            out[i] = x1 * c - x2 * s
            out[i + half] = x2 * c + x1 * s
        return out

    T = len(ids)
    xs = [W["model.embed_tokens.weight"][t].copy() for t in ids]
    for l in range(cfg.layers):
        p = "model.layers.%d." % l
        Ks, Vs, Qs = [], [], []
        for t in range(T):
            h = rms(xs[t], W[p + "input_layernorm.weight"])
            q = lin(h, p + "self_attn.q_proj").reshape(nh, hd)
            k = lin(h, p + "self_attn.k_proj").reshape(nkv, hd)
            v = lin(h, p + "self_attn.v_proj").reshape(nkv, hd)
            if cfg.qk_norm:
                q = np.array([rms(q[i], W[p + "self_attn.q_norm.weight"]) for i in range(nh)])
                k = np.array([rms(k[i], W[p + "self_attn.k_norm.weight"]) for i in range(nkv)])
            Qs.append(np.array([rope(q[i], t) for i in range(nh)]))
            Ks.append(np.array([rope(k[i], t) for i in range(nkv)]))
            Vs.append(v)
        new = []
        for t in range(T):
            heads_out = []
            for hq in range(nh):
                kvh = hq // group
                sc = np.array([Qs[t][hq].dot(Ks[s][kvh]) / np.sqrt(hd) for s in range(t + 1)])
                e = np.exp(sc - sc.max())
                e = e / e.sum()
                heads_out.append(sum(e[s] * Vs[s][kvh] for s in range(t + 1)))
            att = np.concatenate(heads_out)
            x = xs[t] + lin(att, p + "self_attn.o_proj")
            h = rms(x, W[p + "post_attention_layernorm.weight"])
            if cfg.sparse[l]:
                x = x + naive_moe(model, l, h)
            else:
                g = lin(h, p + "mlp.gate_proj")
                u = lin(h, p + "mlp.up_proj")
                x = x + lin(g / (1 + np.exp(-g)) * u, p + "mlp.down_proj")
            new.append(x)
        xs = new
    head = W["model.embed_tokens.weight"] if cfg.tie else W["lm_head.weight"]
    return np.array([head.dot(rms(x, W["model.norm.weight"])) for x in xs])


def naive_expert(W, cfg, layout, l, e, h):
    """Expert e of sparse layer l on one token, read straight from the checkpoint's own tensors."""
    p = "model.layers.%d.mlp.experts." % l
    I = cfg.moe_inter
    if layout == "fused":
        gu = W[p + "gate_up_proj"][e]
        g, u, d = gu[:I].dot(h), gu[I:].dot(h), W[p + "down_proj"][e]
    else:
        g = W[p + "%d.gate_proj.weight" % e].dot(h)
        u = W[p + "%d.up_proj.weight" % e].dot(h)
        d = W[p + "%d.down_proj.weight" % e]
    return d.dot(g / (1 + np.exp(-g)) * u)


def naive_moe(model, l, h):
    """One token through a sparse block with plain Python loops: softmax over every expert, the k
    best by a sort on (-p, id), optional renormalisation, weighted sum of the chosen SwiGLUs."""
    cfg, W = model.cfg, model.w
    gw = W["model.layers.%d.mlp.gate.weight" % l]
    logits = [float(gw[e].dot(h)) for e in range(cfg.n_experts)]
    m = max(logits)
    ex = [np.exp(z - m) for z in logits]
    tot = sum(ex)
    p = [v / tot for v in ex]
    chosen = sorted(range(cfg.n_experts), key=lambda e: (-p[e], e))[:cfg.experts_per_tok]
    ws = [p[e] for e in chosen]
    if cfg.norm_topk:
        s = sum(ws)
        ws = [v / s for v in ws]
    out = np.zeros_like(h)
    for e, w in zip(chosen, ws):
        out = out + w * naive_expert(W, cfg, model.moe_layout, l, e, h)
    return out


def test_safetensors_io(tmp):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 7)) * 3
    # bf16 rounding: known bit patterns
    check(rm.encode_array("BF16", np.array([1.0])) == b"\x80\x3f", "bf16(1.0) != 0x3f80")
    # 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125 -> rounds to even (1.0)
    check(rm.round_to_dtype("BF16", np.array([1.0 + 2.0 ** -8]))[0] == 1.0, "bf16 round-half-even (down)")
    check(rm.round_to_dtype("BF16", np.array([1.0 + 3 * 2.0 ** -8]))[0] == 1.015625, "bf16 round-half-even (up)")
    check(rm.round_to_dtype("BF16", np.array([-2.5]))[0] == -2.5, "bf16(-2.5)")
    tensors = [
        rm.RawTensor("a.bf16", "BF16", a.shape, rm.encode_array("BF16", a)),
        rm.RawTensor("a.f16", "F16", a.shape, rm.encode_array("F16", a)),
        rm.RawTensor("a.f32", "F32", a.shape, rm.encode_array("F32", a)),
        rm.RawTensor("a.i32", "I32", (3,), rm.encode_array("I32", np.array([1, -2, 3]))),
        rm.RawTensor("empty", "F32", (0, 4), b""),
    ]
    path = os.path.join(tmp, "io.safetensors")
    rm.write_safetensors(path, tensors, {"format": "pt"})
    back, meta = rm.read_safetensors(path)
    check(meta == {"format": "pt"}, "metadata round trip")
    check([t.name for t in back] == [t.name for t in tensors], "tensor order round trip")
    for t0, t1 in zip(tensors, back):
        check(t0.data == t1.data and t0.shape == t1.shape and t0.dtype == t1.dtype, "round trip of " + t0.name)
    with open(path, "rb") as f:
        raw = f.read()
    hlen = int.from_bytes(raw[:8], "little")
    check(hlen % 8 == 0, "header padded to a multiple of 8")
    check(np.max(np.abs(back[0].to_f64() - a)) < 0.02 * np.max(np.abs(a)), "bf16 decode close")
    check(np.max(np.abs(back[1].to_f64() - a)) < 0.005 * np.max(np.abs(a)), "f16 decode close")
    check(np.max(np.abs(back[2].to_f64() - a)) < 1e-6 * np.max(np.abs(a)), "f32 decode close")
    # truncated file is rejected
    with open(path, "wb") as f:
        f.write(raw[:-3])
    try:
        rm.read_safetensors(path)
        check(False, "truncated safetensors accepted")
    except rm.FormatError:
        check(True, "")


def build(tmp, name, arch, shards=1, moe_layout="per_expert", **kw):
    d = os.path.join(tmp, name)
    cfgd = rm.make_config_dict(arch, **kw)
    # a fixed seed per name (str hash() is randomised per process)
    rm.write_random_checkpoint(d, cfgd, seed=sum(map(ord, name)) % 1000, shards=shards, moe_layout=moe_layout)
    return d


def test_model(tmp, name, arch, shards=1, moe_layout="per_expert", **kw):
    d = build(tmp, name, arch, shards=shards, moe_layout=moe_layout, **kw)
    m = rm.RefModel(d)
    cfg = m.cfg
    rng = np.random.default_rng(7)
    prompt = [int(x) for x in rng.integers(0, cfg.vocab, size=6)]
    n = 7
    # brute force (no cache)
    bt, brows = m.greedy_bruteforce(prompt, n)
    # kv cache greedy
    gt, grows = m.greedy(prompt, n)
    check(bt == gt, "%s: cached greedy %s != brute force %s" % (name, gt, bt))
    check(np.max(np.abs(brows - grows)) < 1e-10, "%s: cached logits differ from brute force by %g"
          % (name, np.max(np.abs(brows - grows))))
    # teacher forcing in one pass
    lp = m.step_logprobs(prompt, bt)
    check(lp.shape == (n, cfg.vocab), "%s: step_logprobs shape %s" % (name, lp.shape))
    check(bool(np.all(np.isfinite(lp))), "%s: non-finite logprobs" % name)
    check(np.max(np.abs(np.exp(lp).sum(-1) - 1)) < 1e-12, "%s: probabilities do not sum to 1" % name)
    blp = rm.log_softmax(brows)
    err = np.max(np.abs(lp - blp))
    check(err < 1e-10, "%s: teacher-forced logprobs differ from brute force by %g" % (name, err))
    # logits scale sanity: a useful test model must not be near-uniform nor saturated
    spread = float(np.std(brows))
    check(0.05 < spread < 100, "%s: logits std %g outside sane range" % (name, spread))
    # chunked prefill through the cache == one pass
    full = m.forward(prompt + bt)
    cache = rm.KVCache(cfg)
    seq = prompt + bt
    parts = []
    i = 0
    for c in (1, 3, 2, 5, 100):
        if i >= len(seq):
            break
        parts.append(m.forward(seq[i:i + c], cache))
        i += c
    chunked = np.concatenate(parts)
    check(chunked.shape == full.shape and np.max(np.abs(chunked - full)) < 1e-10,
          "%s: chunked forward differs from one pass" % name)
    # naive loops implementation
    nv = naive_forward(m, seq)
    err = np.max(np.abs(nv - full))
    check(err < 1e-9, "%s: naive loop implementation differs by %g" % (name, err))
    # the per-layer hidden of the last layer has the right shape
    logits, hid = m.forward(seq, return_hidden=True)
    check(len(hid) == cfg.layers and hid[-1].shape == (len(seq), cfg.hidden), "%s: hidden shapes" % name)
    return d


def test_rope_frequencies():
    """Scaled RoPE tables: identities that hold whatever the implementation."""
    hd, th = 32, 10000.0
    base, af = rm.rope_frequencies(th, None, hd, 4096)
    check(af == 1.0 and np.allclose(base, th ** (-np.arange(0, hd, 2) / hd), rtol=1e-15), "default table")
    lin, _ = rm.rope_frequencies(th, {"rope_type": "linear", "factor": 4.0}, hd, 4096)
    check(np.allclose(lin, base / 4, rtol=1e-15), "linear is inv / factor")
    dyn, _ = rm.rope_frequencies(th, {"rope_type": "dynamic", "factor": 4.0}, hd, 4096)
    check(np.array_equal(dyn, base), "dynamic within max_position_embeddings is the default table")
    l3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    inv, _ = rm.rope_frequencies(th, l3, hd, 4096)
    wl = 2 * np.pi / base
    check(np.array_equal(inv[wl < 16], base[wl < 16]), "llama3 keeps short wavelengths")
    check(np.allclose(inv[wl > 64], base[wl > 64] / 8, rtol=1e-15), "llama3 divides long wavelengths by factor")
    mid = (wl >= 16) & (wl <= 64)
    check(mid.any() and np.all(inv[mid] <= base[mid]) and np.all(inv[mid] >= base[mid] / 8), "llama3 blend band")
    one, _ = rm.rope_frequencies(th, dict(l3, factor=1.0), hd, 4096)
    check(np.allclose(one, base, rtol=1e-15), "llama3 with factor 1 is the default table")
    y = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    inv, af = rm.rope_frequencies(th, y, hd, 256)
    check(abs(af - (0.1 * np.log(4.0) + 1)) < 1e-15, "yarn default attention factor")
    check(inv[0] == base[0] and abs(inv[-1] - base[-1] / 4) < 1e-15 * base[-1], "yarn ends: extrapolate / interpolate")
    inv1, af1 = rm.rope_frequencies(th, dict(y, factor=1.0), hd, 256)
    check(af1 == 1.0 and np.allclose(inv1, base, rtol=1e-15), "yarn with factor 1 is the default table")
    _, af2 = rm.rope_frequencies(th, dict(y, mscale=1.0, mscale_all_dim=1.0), hd, 256)
    check(abs(af2 - 1.0) < 1e-15, "yarn mscale == mscale_all_dim gives attention factor 1")


def test_rope():
    cfgd = rm.make_config_dict("qwen3", hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, inter=64,
                               vocab=64, tie=True, theta=10000.0)

    class Dummy(rm.RefModel):
        def __init__(self):
            self.cfg = rm.Config(cfgd)
            hd = self.cfg.head_dim
            self.inv_freq = self.cfg.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
            self.attn_factor = 1.0

    m = Dummy()
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 16))
    k = rng.standard_normal((1, 1, 16))
    r = m._rope(q, [5])
    check(abs(np.linalg.norm(r) - np.linalg.norm(q)) < 1e-12, "rope not norm preserving")
    d1 = float(np.sum(m._rope(q, [9]) * m._rope(k, [4])))
    d2 = float(np.sum(m._rope(q, [25]) * m._rope(k, [20])))
    check(abs(d1 - d2) < 1e-10, "rope dot product not relative-position only")
    check(np.max(np.abs(m._rope(q, [0]) - q)) == 0, "rope at position 0 is not identity")
    # first frequency pair rotates by exactly `pos` radians (inv_freq[0] = 1)
    e = np.zeros((1, 1, 16))
    e[0, 0, 0] = 1.0
    r = m._rope(e, [1.0])
    check(abs(r[0, 0, 0] - np.cos(1.0)) < 1e-15 and abs(r[0, 0, 8] - np.sin(1.0)) < 1e-15,
          "rope rotate-half pairing (i, i+hd/2)")


def test_strict_loader(tmp, src):
    tensors = rm.read_checkpoint_tensors(src)
    names = list(tensors)

    def variant(name, mutate):
        d = os.path.join(tmp, name)
        shutil.copytree(src, d)
        ts = [tensors[n] for n in names]
        ts = mutate(ts)
        rm.write_sharded(d, ts, 1)
        return d

    cases = {
        "drop": lambda ts: [t for t in ts if t.name != "model.layers.0.mlp.up_proj.weight"],
        "extra": lambda ts: ts + [rm.RawTensor("model.foo.weight", "BF16", (2,), b"\0" * 4)],
        "shape": lambda ts: [t if t.name != "model.norm.weight" else
                             rm.RawTensor(t.name, t.dtype, (t.shape[0] - 1,), t.data[:-2]) for t in ts],
    }
    for cname, mut in cases.items():
        d = variant("strict_" + cname, mut)
        try:
            rm.RefModel(d)
            check(False, "strict loader accepted variant " + cname)
        except rm.FormatError as e:
            check(True, str(e))


# ---------------------------------------------------------------------------------------------
# Qwen3-MoE
# ---------------------------------------------------------------------------------------------

MOE_G = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, vocab=96, tie=False)


def expect_format_error(what, fn):
    try:
        fn()
        check(False, what + ": accepted")
    except rm.FormatError as e:
        check(True, str(e))


def test_moe_config():
    """The sparse-layer rule, transformers' defaults, the alias and the errors of config parsing."""
    base = rm.make_config_dict("qwen3_moe", layers=6, inter=48, experts=4, experts_per_tok=2, moe_inter=16,
                               sparse_step=2, mlp_only=[0, 3], **MOE_G)
    c = rm.Config(base)
    check(c.arch == "qwen3_moe" and c.qk_norm, "qwen3_moe: qk_norm")
    check(c.sparse == [False, True, False, False, False, True], "sparse rule (step 2, mlp_only [0, 3]): %s" % c.sparse)
    e = c.expected_tensors()
    check("model.layers.1.mlp.gate.weight" in e and "model.layers.1.mlp.experts.3.down_proj.weight" in e and
          "model.layers.1.mlp.experts.4.gate_proj.weight" not in e and "model.layers.1.mlp.gate_proj.weight" not in e,
          "per-expert names of a sparse layer")
    check(e["model.layers.1.mlp.experts.2.down_proj.weight"] == (32, 16) and
          e["model.layers.1.mlp.experts.2.up_proj.weight"] == (16, 32) and
          e["model.layers.5.mlp.gate.weight"] == (4, 32),
          "per-expert shapes")
    check(e["model.layers.3.mlp.gate_proj.weight"] == (48, 32) and "model.layers.3.mlp.gate.weight" not in e,
          "a mlp_only layer is a dense MLP of intermediate_size")
    f = c.expected_tensors("fused")
    check(f["model.layers.5.mlp.experts.gate_up_proj"] == (4, 32, 32) and
          f["model.layers.5.mlp.experts.down_proj"] == (4, 32, 16) and
          not any(".experts.0." in n for n in f) and not any(n.endswith("gate_up_proj.weight") for n in f),
          "fused names (no .weight) and shapes")
    check(set(e) - set(f) == {n for n in e if ".mlp.experts." in n}, "the layouts differ only in the expert tensors")
    # transformers' defaults for absent fields (configuration_qwen3_moe.py)
    d = dict(base)
    for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
              "mlp_only_layers"):
        d.pop(k)
    c = rm.Config(d)
    check((c.n_experts, c.experts_per_tok, c.moe_inter, c.norm_topk, c.sparse_step, c.mlp_only) ==
          (128, 8, 768, False, 1, []) and all(c.sparse), "defaults: %r" %
          ((c.n_experts, c.experts_per_tok, c.moe_inter, c.norm_topk, c.sparse_step, c.mlp_only),))
    # transformers 5.x saves num_experts as num_local_experts (attribute_map)
    d = dict(base)
    d["num_local_experts"] = d.pop("num_experts")
    check(rm.Config(d).n_experts == 4, "num_local_experts alias")
    # num_experts 0: every layer dense, the tensor set of a plain Qwen3
    d = dict(base, num_experts=0, decoder_sparse_step=1, mlp_only_layers=[])
    c = rm.Config(d)
    q = rm.Config(rm.make_config_dict("qwen3", layers=6, inter=48, **MOE_G))
    check(not any(c.sparse) and c.expected_tensors() == q.expected_tensors(), "num_experts 0 is all dense")
    check(rm.Config(dict(base, mlp_only_layers=None)).sparse == [False, True, False, True, False, True],
          "mlp_only_layers null is []")
    expect_format_error("num_experts_per_tok > num_experts", lambda: rm.Config(dict(base, num_experts_per_tok=5)))
    expect_format_error("decoder_sparse_step 0", lambda: rm.Config(dict(base, decoder_sparse_step=0)))
    expect_format_error("mlp_only_layers not a list", lambda: rm.Config(dict(base, mlp_only_layers=3)))
    expect_format_error("norm_topk_prob not a bool", lambda: rm.Config(dict(base, norm_topk_prob="yes")))
    expect_format_error("num_experts and num_local_experts differ", lambda: rm.Config(dict(base, num_local_experts=5)))


def test_moe_block():
    """route() / moe_block() on hand-made numbers: ties go to the lower id, norm_topk_prob."""
    rng = np.random.default_rng(11)
    H, I, E = 6, 5, 6
    x = rng.standard_normal((4, H))
    wg, wu, wd = rng.standard_normal((E, I, H)), rng.standard_normal((E, I, H)), rng.standard_normal((E, H, I))

    def expert(e, v):
        g = v @ wg[e].T
        return (g / (1 + np.exp(-g)) * (v @ wu[e].T)) @ wd[e].T

    # experts 1 and 3 have the same router row, far above the others: an exact tie for first
    gate = rng.standard_normal((E, H)) * 0.1
    gate[3] = gate[1] = 1.0
    xs = np.abs(x)                                    # x . gate[1] = sum|x| > the others
    p, sel, w = rm.route(xs, gate, 1, True)
    check(bool(np.all(p[:, 1] == p[:, 3])), "tie set-up: p[1] == p[3] exactly")
    check(sel[:, 0].tolist() == [1] * 4, "tie for first, k = 1: chose %s, want the lower id 1" % sel[:, 0].tolist())
    out = rm.moe_block(xs, gate, wg, wu, wd, 1, True)
    check(np.array_equal(out, expert(1, xs)), "tie, k = 1: output is expert 1's")
    _, sel, _ = rm.route(xs, gate, 2, True)
    check(sel.tolist() == [[1, 3]] * 4, "tie, k = 2: %s" % sel.tolist())
    # a tie at the k-th place: experts 4 and 2 share the second-best row
    gate2 = -np.abs(rng.standard_normal((E, H)))
    gate2[5] = 2.0
    gate2[4] = gate2[2] = 1.0
    _, sel, _ = rm.route(xs, gate2, 2, False)
    check(sel.tolist() == [[5, 2]] * 4, "tie at the k-th place goes to the lower id: %s" % sel.tolist())
    # norm_topk_prob: k = 1 gives weight 1 with it, p_max without
    gate3 = rng.standard_normal((E, H))
    p, sel, w1 = rm.route(x, gate3, 1, True)
    _, _, w0 = rm.route(x, gate3, 1, False)
    check(np.allclose(w1, 1.0, rtol=0, atol=1e-15) and np.allclose(w0[:, 0], p.max(-1), rtol=0, atol=0),
          "norm_topk_prob weights")
    o1 = rm.moe_block(x, gate3, wg, wu, wd, 1, True)
    o0 = rm.moe_block(x, gate3, wg, wu, wd, 1, False)
    want = np.array([expert(int(sel[t, 0]), x[t:t + 1])[0] for t in range(4)])
    check(np.allclose(o1, want, rtol=1e-13, atol=1e-13), "k = 1 with norm: the chosen expert's output")
    check(np.allclose(o0, want * p.max(-1)[:, None], rtol=1e-13, atol=1e-13), "k = 1 without norm: p_max * expert")
    # k = E without norm: weights are the full softmax (sum 1), so the same as with norm
    check(np.allclose(rm.moe_block(x, gate3, wg, wu, wd, E, False), rm.moe_block(x, gate3, wg, wu, wd, E, True),
                      rtol=1e-13, atol=1e-13), "k = E: norm_topk_prob makes no difference")
    ref = sum(p[:, e:e + 1] * expert(e, x) for e in range(E))
    check(np.allclose(rm.moe_block(x, gate3, wg, wu, wd, E, False), ref, rtol=1e-12, atol=1e-12),
          "k = E: softmax-weighted sum of every expert")
    m = rm.router_margins(p, 2)
    s = -np.sort(-p, axis=-1)
    check(np.allclose(m, s[:, 1] - s[:, 2]) and np.all(np.isinf(rm.router_margins(p, E))), "router_margins")


def moe_from_dense(dense_dir, out, E, k, norm, seed, sparse_step=1, mlp_only=()):
    """A Qwen3-MoE checkpoint whose attention / norms / embeddings are dense_dir's and whose every
    expert of a sparse layer is a byte copy of that layer's dense MLP; random router."""
    os.makedirs(out, exist_ok=True)
    import json
    with open(os.path.join(dense_dir, "config.json")) as f:
        d = json.load(f)
    md = rm.make_config_dict("qwen3_moe", hidden=d["hidden_size"], layers=d["num_hidden_layers"],
                             heads=d["num_attention_heads"], kv_heads=d["num_key_value_heads"],
                             head_dim=d["head_dim"], inter=d["intermediate_size"], vocab=d["vocab_size"],
                             tie=d["tie_word_embeddings"], dtype=d["torch_dtype"], theta=d["rope_theta"],
                             eps=d["rms_norm_eps"], experts=E, experts_per_tok=k, moe_inter=d["intermediate_size"],
                             norm_topk=norm, sparse_step=sparse_step, mlp_only=mlp_only)
    cfg = rm.Config(md)
    raw = rm.read_checkpoint_tensors(dense_dir)
    rng = np.random.default_rng(seed)
    st = rm.TORCH_DTYPE_TO_ST[d["torch_dtype"]]
    ts = []
    for name, shape in cfg.expected_tensors().items():
        parts = name.split(".")
        if name.endswith("mlp.gate.weight"):
            ts.append(rm.RawTensor(name, st, shape, rm.encode_array(st, rng.standard_normal(shape))))
        elif ".mlp.experts." in name:
            src = raw["model.layers.%s.mlp.%s.weight" % (parts[2], parts[6])]
            ts.append(rm.RawTensor(name, src.dtype, src.shape, src.data))
        else:
            ts.append(raw[name])
    rm.write_sharded(out, ts, 1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(md, f)
    return out


def test_moe_dense_equivalence(tmp):
    """Identical experts: with norm_topk_prob (any k), or with k = E (weights sum to 1), the MoE is the
    dense model whose MLP the experts copy, whatever the router says."""
    dense = build(tmp, "moe_dense_base", "qwen3", hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8, inter=24,
                  vocab=80, tie=False, dtype="float32")
    dm = rm.RefModel(dense)
    ids = [3, 17, 5, 60, 2, 9, 41, 0, 77]
    want = dm.forward(ids)
    for E, k, norm, step, mo in ((3, 3, True, 1, ()), (3, 3, False, 1, ()), (4, 2, True, 1, ()),
                                 (5, 1, True, 1, ()), (4, 2, True, 1, (1,)), (3, 2, True, 2, ()),
                                 (4, 4, False, 1, (2,))):
        name = "moe_same_E%d_k%d_%s_s%d_%s" % (E, k, "norm" if norm else "nonorm", step, "-".join(map(str, mo)))
        d = moe_from_dense(dense, os.path.join(tmp, name), E, k, norm, seed=E * 10 + k, sparse_step=step, mlp_only=mo)
        m = rm.RefModel(d)
        check(any(m.cfg.sparse), "%s: no sparse layer" % name)
        err = float(np.max(np.abs(m.forward(ids) - want)))
        check(err < 1e-11, "%s: identical experts differ from the dense model by %g" % (name, err))
    # without norm and k < E the block is scaled by sum(p[S]) < 1: it must differ
    d = moe_from_dense(dense, os.path.join(tmp, "moe_same_nonorm_k1"), 4, 1, False, seed=5)
    err = float(np.max(np.abs(rm.RefModel(d).forward(ids) - want)))
    check(err > 1e-3, "identical experts, k = 1, no norm: only %g from the dense model" % err)


def test_moe_layouts(tmp):
    """Per-expert and fused checkpoints of the same numbers: byte-exact conversion both ways, equal
    logits; the strict loader rejects mixed / incomplete / mis-shaped expert sets."""
    kw = dict(hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8, inter=40, vocab=90, tie=True, dtype="bfloat16",
              experts=5, experts_per_tok=2, moe_inter=12, sparse_step=1, mlp_only=(1,))
    a = build(tmp, "moe_layout_a", "qwen3_moe", moe_layout="per_expert", **kw)
    b = build(tmp, "moe_layout_a_fused", "qwen3_moe", moe_layout="fused", **kw)   # different name: own seed
    cfg = rm.load_config(a)
    ra = rm.read_checkpoint_tensors(a)
    fused = rm.convert_moe_layout(ra, cfg, "fused")
    check([t.name for t in fused] == list(cfg.expected_tensors("fused")), "convert to fused: names / order")
    back = {t.name: t for t in rm.convert_moe_layout(fused, cfg, "per_expert")}
    check(set(back) == set(ra) and all(back[n].data == ra[n].data and back[n].shape == ra[n].shape for n in ra),
          "per-expert -> fused -> per-expert is byte-exact")
    # fused gate_up_proj[e] is gate_e's rows then up_e's; down_proj[e] is down_e
    fd = {t.name: t for t in fused}
    gu = fd["model.layers.2.mlp.experts.gate_up_proj"].to_f64()
    check(np.array_equal(gu[3, :12], ra["model.layers.2.mlp.experts.3.gate_proj.weight"].to_f64()) and
          np.array_equal(gu[3, 12:], ra["model.layers.2.mlp.experts.3.up_proj.weight"].to_f64()) and
          np.array_equal(fd["model.layers.2.mlp.experts.down_proj"].to_f64()[4],
                         ra["model.layers.2.mlp.experts.4.down_proj.weight"].to_f64()), "fused row order")
    fdir = os.path.join(tmp, "moe_layout_a_conv")
    shutil.copytree(a, fdir)
    rm.write_sharded(fdir, fused, 2)
    ma, mf = rm.RefModel(a), rm.RefModel(fdir)
    check(ma.moe_layout == "per_expert" and mf.moe_layout == "fused", "layout detection")
    ids = [1, 50, 22, 7, 89, 3, 3, 64]
    check(np.array_equal(ma.forward(ids), mf.forward(ids)), "fused and per-expert layouts give different logits")
    check(rm.RefModel(b).moe_layout == "fused", "write_random_checkpoint(moe_layout=fused)")
    # strict tensor set
    names = list(ra)

    def variant(vname, ts):
        d = os.path.join(tmp, "moe_strict_" + vname)
        shutil.copytree(a, d)
        rm.write_sharded(d, ts, 1)
        return d

    per = [ra[n] for n in names]
    mixed = [t for t in per if not t.name.startswith("model.layers.0.mlp.experts.")] + \
        [t for t in fused if t.name.startswith("model.layers.0.mlp.experts.")]
    cases = {
        "mixed_layouts": mixed,
        "missing_expert": [t for t in per if t.name != "model.layers.2.mlp.experts.4.up_proj.weight"],
        "extra_expert": per + [rm.RawTensor("model.layers.0.mlp.experts.5.up_proj.weight", "BF16", (12, 32),
                                            ra["model.layers.0.mlp.experts.0.up_proj.weight"].data)],
        "dense_mlp_on_sparse_layer": per + [rm.RawTensor("model.layers.0.mlp.gate_proj.weight", "BF16", (40, 32),
                                                         b"\0" * (40 * 32 * 2))],
        "no_router": [t for t in per if t.name != "model.layers.2.mlp.gate.weight"],
        "fused_with_weight_suffix": [rm.RawTensor(t.name + ".weight", t.dtype, t.shape, t.data)
                                     if t.name.endswith(("gate_up_proj", "experts.down_proj")) else t for t in fused],
        "fused_wrong_shape": [rm.RawTensor(t.name, t.dtype, (5, 32, 24), t.data)
                              if t.name == "model.layers.0.mlp.experts.gate_up_proj" else t for t in fused],
        "fused_f32_among_bf16": [rm.RawTensor(t.name, "F32", t.shape, rm.encode_array("F32", t.to_f64()))
                                 if t.name == "model.layers.2.mlp.experts.down_proj" else t for t in fused],
    }
    for cname, ts in cases.items():
        d = variant(cname, ts)
        expect_format_error("strict loader, MoE variant " + cname, lambda: rm.RefModel(d))


def main():
    tmp = os.environ.get("GS_TEST_TMP")
    if tmp:
        tmp = os.path.join(tmp, "selfcheck")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    else:
        tmp = tempfile.mkdtemp(prefix="gs_ref_selfcheck_")
    test_safetensors_io(tmp)
    test_rope()
    test_rope_frequencies()
    q = test_model(tmp, "qwen3_hd", "qwen3", hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, inter=48,
                   vocab=97, tie=False)
    test_model(tmp, "qwen3_tied_gqa4_shard3", "qwen3", shards=3, hidden=32, layers=2, heads=4, kv_heads=1,
               head_dim=8, inter=40, vocab=64, tie=True)
    test_model(tmp, "qwen3_f16", "qwen3", hidden=24, layers=1, heads=2, kv_heads=2, head_dim=12, inter=32,
               vocab=50, tie=True, dtype="float16")
    test_model(tmp, "qwen3_f32", "qwen3", hidden=24, layers=2, heads=3, kv_heads=3, head_dim=6, inter=32,
               vocab=50, tie=False, dtype="float32")
    test_model(tmp, "llama", "llama", hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inter=48, vocab=80,
               tie=False, theta=10000.0)
    test_model(tmp, "llama_bias", "llama", hidden=32, layers=1, heads=4, kv_heads=4, head_dim=8, inter=48,
               vocab=80, tie=True, attention_bias=True)
    test_model(tmp, "qwen2", "qwen2", hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inter=48, vocab=80,
               tie=False)
    test_strict_loader(tmp, q)
    # Qwen3-MoE
    test_moe_config()
    test_moe_block()
    test_moe_dense_equivalence(tmp)
    test_moe_layouts(tmp)
    test_model(tmp, "moe_k2_norm", "qwen3_moe", hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, inter=48,
               vocab=97, tie=False, experts=4, experts_per_tok=2, moe_inter=16)
    test_model(tmp, "moe_k2_norm_fused", "qwen3_moe", moe_layout="fused", hidden=32, layers=2, heads=4, kv_heads=2,
               head_dim=8, inter=48, vocab=97, tie=False, experts=4, experts_per_tok=2, moe_inter=16)
    test_model(tmp, "moe_k1_nonorm_f32_tied", "qwen3_moe", hidden=24, layers=2, heads=3, kv_heads=1, head_dim=8,
               inter=32, vocab=70, tie=True, dtype="float32", experts=6, experts_per_tok=1, moe_inter=8,
               norm_topk=False)
    test_model(tmp, "moe_k3_step2_mlponly_shard2", "qwen3_moe", shards=2, moe_layout="fused", hidden=32, layers=4,
               heads=4, kv_heads=2, head_dim=8, inter=40, vocab=64, tie=False, experts=5, experts_per_tok=3,
               moe_inter=12, sparse_step=2, mlp_only=(1,))
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
