"""Self-check of the numpy reference (tests/reference/ref_model.py); needs no graphswap binary.

Builds tiny checkpoints with the reference's own safetensors writer and checks:
  * safetensors writer/reader round trips (BF16 rounding, F16, F32, I32, sharded index),
  * the strict loader rejects missing / extra / mis-shaped tensors,
  * forward shapes and finiteness for qwen3 / llama / qwen2 variants,
  * teacher-forced one-pass log-probs == brute-force per-token recomputation (no KV cache),
  * KV-cache greedy == brute-force greedy; chunked prefill through the cache == one pass,
  * a second, deliberately naive per-token / per-head loop implementation agrees,
  * RoPE properties (norm preserving, relative-position only).
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
            g = lin(h, p + "mlp.gate_proj")
            u = lin(h, p + "mlp.up_proj")
            x = x + lin(g / (1 + np.exp(-g)) * u, p + "mlp.down_proj")
            new.append(x)
        xs = new
    head = W["model.embed_tokens.weight"] if cfg.tie else W["lm_head.weight"]
    return np.array([head.dot(rms(x, W["model.norm.weight"])) for x in xs])


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


def build(tmp, name, arch, shards=1, **kw):
    d = os.path.join(tmp, name)
    cfgd = rm.make_config_dict(arch, **kw)
    rm.write_random_checkpoint(d, cfgd, seed=hash(name) % 1000, shards=shards)
    return d


def test_model(tmp, name, arch, shards=1, **kw):
    d = build(tmp, name, arch, shards=shards, **kw)
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
    print("%d passed, %d failed" % (PASSED, FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
