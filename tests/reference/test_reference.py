"""Parity of graphswap against the independent float64 numpy reference (ref_model.py).

For each checkpoint shape (built with `graphswap mkmodel`):
  * the checkpoint follows the Hugging Face layout (config.json fields, file names, tensor names,
    shapes and dtype) -- checked by the reference's strict loader,
  * greedy generation (--ignore-eos --max-tokens 12 --logprobs 5) on a few prompts gives exactly the
    reference's greedy tokens, and every logprob / top_logprobs entry agrees within 1e-3,
  * a reference top-2 logit gap below 1e-5 on the greedy path is reported as a test-setup problem.
Where mkmodel's init leaves norm weights at exactly 1 or biases at exactly 0, a copy with perturbed
norms/biases (rewritten with the reference's safetensors writer) is tested too, so those code paths
are exercised. A hand-built Llama with attention_bias=true covers q/k/v/o biases.
RoPE variants (linear, dynamic, llama3, yarn with its attention factor, both config layouts) run
prompts past a small original_max_position_embeddings (GS_REF_ONLY=rope runs only those).
Extra: sampled generation returns logprobs of the raw distribution (before temperature) and only
samples tokens allowed by top-k / top-p / min-p.
"""

import json
import os
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402

TOL = 1e-3
TIE_GAP = 1e-5
MAX_TOKENS = 12
TOPK = 5

C = H.Checker("reference")

# name, arch, dict(mkmodel geometry), shards
CONFIGS = [
    ("qwen3_hd32_gqa2_tied", "qwen3",
     dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, inter=128, vocab=512, tie=True, dtype="bf16"), 1),
    ("qwen3_gqa1_untied", "qwen3",
     dict(hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16, inter=96, vocab=384, tie=False, dtype="bf16"), 1),
    ("qwen3_gqa4_untied_3layers", "qwen3",
     dict(hidden=128, layers=3, heads=8, kv_heads=2, head_dim=16, inter=192, vocab=1024, tie=False, dtype="bf16"), 1),
    ("qwen3_sharded3_tied", "qwen3",
     dict(hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=512, tie=True, dtype="bf16"), 3),
    ("qwen3_f32_hd8", "qwen3",
     dict(hidden=48, layers=2, heads=6, kv_heads=3, head_dim=8, inter=96, vocab=300, tie=False, dtype="f32"), 1),
    ("qwen3_f16_hd64_gqa2", "qwen3",
     dict(hidden=64, layers=1, heads=2, kv_heads=1, head_dim=64, inter=128, vocab=256, tie=True, dtype="f16"), 1),
    ("llama_gqa2_untied", "llama",
     dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=512, tie=False, dtype="bf16"), 1),
    ("llama_gqa4_tied_sharded2_f32", "llama",
     dict(hidden=96, layers=2, heads=8, kv_heads=2, head_dim=12, inter=160, vocab=640, tie=True, dtype="f32"), 2),
    ("qwen2_gqa2_untied", "qwen2",
     dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=512, tie=False, dtype="bf16"), 1),
    ("qwen2_gqa1_tied_sharded2_f16", "qwen2",
     dict(hidden=32, layers=3, heads=2, kv_heads=2, head_dim=16, inter=64, vocab=256, tie=True, dtype="f16"), 2),
]

# RoPE variants (mkmodel --rope-* / --config-layout): name, arch, geometry, mkmodel options, the rope
# object config.json must hold (under rope_scaling for v4, rope_parameters for v5). A small
# original_max_position_embeddings (64) puts the prompts (70 and 100 tokens) past it, so every
# frequency band and the yarn attention factor matter.
ROPE_G = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, inter=128, vocab=512, tie=False, dtype="f32")
ROPE_CONFIGS = [
    ("rope_qwen3_linear_v4", "qwen3", ROPE_G,
     ["--rope-theta", "10000", "--rope-type", "linear", "--rope-factor", "2.5"],
     {"rope_type": "linear", "factor": 2.5}),
    ("rope_llama_llama3_v4", "llama", dict(ROPE_G, tie=True, dtype="bf16"),
     ["--rope-theta", "10000", "--rope-type", "llama3", "--rope-factor", "8", "--rope-low-freq-factor", "1",
      "--rope-high-freq-factor", "4", "--rope-orig-max-pos", "64"],
     {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
      "original_max_position_embeddings": 64}),
    ("rope_llama_llama3_v5", "llama", ROPE_G,
     ["--config-layout", "v5", "--rope-theta", "10000", "--rope-type", "llama3", "--rope-factor", "4",
      "--rope-low-freq-factor", "1", "--rope-high-freq-factor", "2", "--rope-orig-max-pos", "64"],
     {"rope_type": "llama3", "rope_theta": 10000, "factor": 4, "low_freq_factor": 1, "high_freq_factor": 2,
      "original_max_position_embeddings": 64}),
    ("rope_qwen3_yarn_v5", "qwen3", ROPE_G,
     ["--config-layout", "v5", "--max-pos", "256", "--rope-theta", "10000", "--rope-type", "yarn",
      "--rope-factor", "4", "--rope-orig-max-pos", "64"],
     {"rope_type": "yarn", "rope_theta": 10000, "factor": 4, "original_max_position_embeddings": 64}),
    ("rope_qwen2_yarn_mscale_v4", "qwen2", dict(ROPE_G, dtype="bf16"),
     ["--max-pos", "512", "--rope-theta", "10000", "--rope-type", "yarn", "--rope-factor", "8",
      "--rope-orig-max-pos", "64", "--rope-beta-fast", "16", "--rope-beta-slow", "2", "--rope-mscale", "2",
      "--rope-mscale-all-dim", "0.5", "--rope-truncate", "false"],
     {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 64, "beta_fast": 16, "beta_slow": 2,
      "mscale": 2, "mscale_all_dim": 0.5, "truncate": False}),
    ("rope_llama_yarn_attnfactor_v5", "llama", ROPE_G,
     ["--config-layout", "v5", "--max-pos", "128", "--rope-theta", "10000", "--rope-type", "yarn",
      "--rope-orig-max-pos", "64", "--rope-attention-factor", "1.3"],
     {"rope_type": "yarn", "rope_theta": 10000, "original_max_position_embeddings": 64, "attention_factor": 1.3}),
    ("rope_qwen3_dynamic_v5", "qwen3", ROPE_G,
     ["--config-layout", "v5", "--rope-theta", "10000", "--rope-type", "dynamic", "--rope-factor", "4"],
     {"rope_type": "dynamic", "rope_theta": 10000, "factor": 4}),
    ("rope_qwen3_default_v5", "qwen3", ROPE_G,
     ["--config-layout", "v5", "--rope-theta", "5000"],
     {"rope_type": "default", "rope_theta": 5000}),
]

TORCH_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
ARCH_NAME = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def prompts_for(vocab, seed):
    rng = np.random.default_rng(seed)
    return [
        [int(rng.integers(0, vocab))],
        [int(x) for x in rng.integers(0, vocab, size=9)],
        [int(x) for x in rng.integers(0, vocab, size=37)],
    ]


# ---------------------------------------------------------------------------------------------
# checkpoint layout
# ---------------------------------------------------------------------------------------------

def check_layout(name, d, arch, g, shards):
    cfgp = os.path.join(d, "config.json")
    if not C.check(os.path.exists(cfgp), "%s: mkmodel wrote no config.json" % name):
        return False
    with open(cfgp) as f:
        cfg = json.load(f)
    want = {
        "architectures": [ARCH_NAME[arch]], "model_type": arch, "hidden_size": g["hidden"],
        "intermediate_size": g["inter"], "num_hidden_layers": g["layers"], "num_attention_heads": g["heads"],
        "num_key_value_heads": g["kv_heads"], "head_dim": g["head_dim"], "vocab_size": g["vocab"],
        "tie_word_embeddings": g["tie"], "torch_dtype": TORCH_DTYPE[g["dtype"]], "hidden_act": "silu",
        "rope_scaling": None,
    }
    for k, v in want.items():
        C.check(k in cfg and cfg[k] == v, "%s: config.json %s = %r, expected %r" % (name, k, cfg.get(k, "<absent>"), v))
    for k in ("rms_norm_eps", "rope_theta", "max_position_embeddings", "bos_token_id", "eos_token_id"):
        C.check(k in cfg, "%s: config.json lacks %s" % (name, k))
    if arch == "llama":
        C.check("attention_bias" in cfg, "%s: llama config.json lacks attention_bias" % name)
    files = sorted(os.listdir(d))
    st = [f for f in files if f.endswith(".safetensors")]
    if shards == 1:
        C.check(st == ["model.safetensors"] and "model.safetensors.index.json" not in files,
                "%s: unsharded checkpoint files %s" % (name, st))
    else:
        exp = ["model-%05d-of-%05d.safetensors" % (i + 1, shards) for i in range(shards)]
        C.check(st == exp, "%s: shard files %s, expected %s" % (name, st, exp))
        C.check("model.safetensors.index.json" in files, "%s: no model.safetensors.index.json" % name)
    # mkmodel writes its byte-level BPE tokenizer when the vocabulary can hold it (>= 512 ids)
    for tf in ("tokenizer.json", "tokenizer_config.json"):
        C.check((tf in files) == (cfg["vocab_size"] >= 512),
                "%s: tokenizer file %s present=%s with vocab %d" % (name, tf, tf in files, cfg["vocab_size"]))
    return True


def load_ref(name, d):
    try:
        return rm.RefModel(d, strict=True)
    except (rm.FormatError, KeyError, ValueError, OSError) as e:
        C.fail("%s: checkpoint does not match the Hugging Face layout / reference loader: %s" % (name, e))
        return None


def needs_perturbation(ref):
    """True when some norm weight is exactly all-ones or some bias exactly all-zeros."""
    for n, w in ref.w.items():
        if n.endswith("norm.weight") and np.all(w == 1.0):
            return True
        if n.endswith(".bias") and np.all(w == 0.0):
            return True
    return False


def rewrite_checkpoint(src, dst, mutate_cfg=None, add_tensors=None, perturb_seed=None):
    """Copies a checkpoint, optionally editing config.json, perturbing norm weights / biases, adding
    tensors; rewrites every safetensors file (same file split) with the reference writer."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    if mutate_cfg:
        p = os.path.join(dst, "config.json")
        with open(p) as f:
            cfg = json.load(f)
        mutate_cfg(cfg)
        with open(p, "w") as f:
            json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(perturb_seed if perturb_seed is not None else 0)
    wm, index = rm.checkpoint_files(dst)
    files = ["model.safetensors"] if wm is None else sorted(set(wm.values()))
    for k, fn in enumerate(files):
        path = os.path.join(dst, fn)
        tensors, meta = rm.read_safetensors(path)
        out = []
        for t in tensors:
            if perturb_seed is not None and (t.name.endswith("norm.weight") or t.name.endswith(".bias")):
                a = t.to_f64()
                if t.name.endswith("norm.weight"):
                    a = a * (1.0 + 0.25 * rng.standard_normal(a.shape))
                else:
                    a = a + 0.3 * rng.standard_normal(a.shape)
                t = rm.RawTensor(t.name, t.dtype, t.shape, rm.encode_array(t.dtype, a))
            out.append(t)
        if add_tensors and k == 0:
            out += add_tensors
            if wm is not None:
                for t in add_tensors:
                    wm[t.name] = fn
        rm.write_safetensors(path, out, meta)
    if wm is not None:
        total = 0
        for fn in set(wm.values()):
            total += sum(len(t.data) for t in rm.read_safetensors(os.path.join(dst, fn))[0])
        index["weight_map"] = wm
        index.setdefault("metadata", {})["total_size"] = total
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)


# ---------------------------------------------------------------------------------------------
# parity
# ---------------------------------------------------------------------------------------------

def check_top(what, i, row, lp_row, k):
    """row: graphswap's top list at one step; lp_row: reference log-probs at that step."""
    ids = [e[0] for e in row]
    vals = [H.num(e[1]) for e in row]
    if not C.check(len(set(ids)) == len(ids), "%s step %d: duplicate ids in top_logprobs %s" % (what, i, ids)):
        return
    if not C.check(all(0 <= t < len(lp_row) for t in ids), "%s step %d: top id out of range %s" % (what, i, ids)):
        return
    C.check(all(vals[j] >= vals[j + 1] for j in range(len(vals) - 1)),
            "%s step %d: top_logprobs not sorted descending: %s" % (what, i, vals))
    kth = np.sort(lp_row)[::-1][k - 1]
    for t, v in zip(ids, vals):
        C.check(abs(v - lp_row[t]) <= TOL, "%s step %d: top logprob of id %d = %.6f, reference %.6f (diff %.2e)"
                % (what, i, t, v, lp_row[t], abs(v - lp_row[t])))
        C.check(lp_row[t] >= kth - TOL, "%s step %d: id %d (ref logprob %.6f) is not among the reference top-%d "
                "(k-th best %.6f)" % (what, i, t, lp_row[t], k, kth))


def check_prompt_logprobs(what, ref, prompt, out):
    """prompt_logprobs[i] (i >= 1) is the raw logprob of prompt[i] after prompt[:i], with its rank among
    all ids and the TOPK best ids there; entry 0 is null."""
    n = len(prompt)
    pl, pr, pt = out.get("prompt_logprobs"), out.get("prompt_ranks"), out.get("prompt_top_logprobs")
    if not C.check(all(isinstance(x, list) and len(x) == n for x in (pl, pr, pt)),
                   "%s: prompt_logprobs / prompt_ranks / prompt_top_logprobs missing or not %d long" % (what, n)):
        return
    C.check(pl[0] is None and pr[0] is None and pt[0] is None, "%s: prompt entry 0 is not null" % what)
    if n < 2:
        return
    lp = ref.step_logprobs(prompt[:1], prompt[1:])
    for i in range(1, n):
        row, t = lp[i - 1], prompt[i]
        v = H.num(pl[i])
        C.check(abs(v - row[t]) <= TOL, "%s prompt position %d: logprob of %d = %.6f, reference %.6f"
                % (what, i, t, v, row[t]))
        # ids surely better come first; ids within the tolerance (t itself among them) may go either way
        lo, hi = 1 + int(np.sum(row > row[t] + TOL)), int(np.sum(row > row[t] - TOL))
        C.check(isinstance(pr[i], int) and lo <= pr[i] <= hi,
                "%s prompt position %d: rank %r of %d, reference rank in [%d, %d]" % (what, i, pr[i], t, lo, hi))
        check_top(what + " prompt", i, pt[i], row, TOPK)


def parity_run(name, binary, d, ref, prompt, tag):
    what = "%s prompt%s(len %d)" % (name, tag, len(prompt))
    ref_toks, ref_logits = ref.greedy(prompt, MAX_TOKENS)
    gaps = [rm.top2_gap(r) for r in ref_logits]
    tie_steps = [i for i, g in enumerate(gaps) if g < TIE_GAP]
    C.check(not tie_steps, "TEST SETUP PROBLEM: %s: reference top-2 logits tie (gap < %g) at step(s) %s "
            "(gaps %s); change the seed or prompt" % (what, TIE_GAP, tie_steps, ["%.2e" % gaps[i] for i in tie_steps]))
    spread = float(np.std(ref_logits))
    C.check(spread > 0.01, "TEST SETUP PROBLEM: %s: reference logits nearly uniform (std %.3g); the 1e-3 "
            "logprob tolerance cannot discriminate" % (what, spread))
    # chunks of 3 prompt rows, so a prompt spans several steps (its scores too)
    out = H.generate(C, what, binary, d, prompt, max_tokens=MAX_TOKENS, logprobs=TOPK, ignore_eos=True,
                     prefill_chunk=3, extra=["--prompt-logprobs", str(TOPK)])
    if out is None or not H.validate_shape(C, what, out, MAX_TOKENS, TOPK):
        return
    check_prompt_logprobs(what, ref, prompt, out)
    gs_toks = out["token_ids"]
    C.check(out["finish_reason"] == "length", "%s: finish_reason %r with --ignore-eos" % (what, out["finish_reason"]))
    if gs_toks != ref_toks:
        i = next(j for j in range(MAX_TOKENS) if gs_toks[j] != ref_toks[j])
        lr = ref_logits[i]
        C.fail("%s: greedy tokens differ from reference at step %d: graphswap %s, reference %s "
               "(reference logits: ref token %.6f, graphswap token %.6f, top-2 gap %.2e)"
               % (what, i, gs_toks, ref_toks, lr[ref_toks[i]], lr[gs_toks[i]] if 0 <= gs_toks[i] < len(lr)
                  else float("nan"), gaps[i]))
    else:
        C.check(True, "")
    if not all(isinstance(t, int) and 0 <= t < ref.cfg.vocab for t in gs_toks):
        C.fail("%s: token ids out of range: %s" % (what, gs_toks))
        return
    # log-probs along graphswap's own sequence (meaningful even after a divergence)
    lp = ref.step_logprobs(prompt, gs_toks)
    worst = 0.0
    for i, t in enumerate(gs_toks):
        v = H.num(out["logprobs"][i])
        diff = abs(v - lp[i][t])
        worst = max(worst, diff)
        C.check(diff <= TOL, "%s step %d: logprob of token %d = %.6f, reference %.6f (diff %.2e)"
                % (what, i, t, v, lp[i][t], diff))
        row = out["top_logprobs"][i]
        check_top(what, i, row, lp[i], TOPK)
        # greedy: the chosen token is the top-1 entry and its logprob is that entry's value
        C.check(row[0][0] == t, "%s step %d: greedy token %d is not top_logprobs[0] id %d" % (what, i, t, row[0][0]))
        C.check(abs(H.num(row[0][1]) - v) <= 1e-5, "%s step %d: logprobs %s != top_logprobs[0] %s"
                % (what, i, out["logprobs"][i], row[0][1]))
    print("  %-48s tokens %s  max|dlogprob| %.2e" % (what, "ok " if gs_toks == ref_toks else "BAD", worst), flush=True)


def sampling_run(name, binary, d, ref, prompt):
    """Sampled runs: logprobs are of the raw distribution; tokens respect top-k / top-p / min-p."""
    cases = [
        ("T0.7 top-k 20", dict(temperature=0.7, top_k=20, seed=11)),
        ("T1 top-p 0.3", dict(temperature=1.0, top_p=0.3, seed=12)),
        ("T1 min-p 0.4", dict(temperature=1.0, min_p=0.4, seed=13)),
        ("T1.5 plain", dict(temperature=1.5, seed=14)),
    ]
    for label, kw in cases:
        what = "%s sampling %s" % (name, label)
        out = H.generate(C, what, binary, d, prompt, max_tokens=MAX_TOKENS, logprobs=3, ignore_eos=True, **kw)
        if out is None or not H.validate_shape(C, what, out, MAX_TOKENS, 3):
            continue
        toks = out["token_ids"]
        if not C.check(all(isinstance(t, int) and 0 <= t < ref.cfg.vocab for t in toks),
                       "%s: token ids out of range %s" % (what, toks)):
            continue
        lp = ref.step_logprobs(prompt, toks)
        for i, t in enumerate(toks):
            v = H.num(out["logprobs"][i])
            C.check(abs(v - lp[i][t]) <= TOL, "%s step %d: logprob %.6f of token %d != reference raw (pre-temperature) "
                    "logprob %.6f" % (what, i, v, t, lp[i][t]))
            check_top(what, i, out["top_logprobs"][i], lp[i], 3)
            p = np.exp(lp[i])
            if "top_k" in kw:
                kth = np.sort(lp[i])[::-1][kw["top_k"] - 1]
                C.check(lp[i][t] >= kth - TOL, "%s step %d: token %d outside top-%d" % (what, i, t, kw["top_k"]))
            if "top_p" in kw:
                above = float(np.sum(p[lp[i] > lp[i][t] + TOL]))
                C.check(above < kw["top_p"] + TOL, "%s step %d: token %d outside the top-p %.2f nucleus "
                        "(mass of more likely tokens %.4f)" % (what, i, t, kw["top_p"], above))
            if "min_p" in kw:
                C.check(p[t] >= kw["min_p"] * p.max() * (1 - 1e-2), "%s step %d: token %d prob %.5f below min-p "
                        "%.2f * max %.5f" % (what, i, t, p[t], kw["min_p"], p.max()))


def test_config(binary, tmp, name, arch, g, shards, seed):
    d = os.path.join(tmp, name)
    res = H.mkmodel(binary, d, arch, shards=shards, seed=seed, **g)
    if not C.check(res.rc == 0, "%s: mkmodel exited %s: %s\n  cmd: %s" % (name, res.rc, res.stderr.strip(), res.cmd())):
        return
    if not check_layout(name, d, arch, g, shards):
        return
    ref = load_ref(name, d)
    if ref is None:
        return
    prompts = prompts_for(g["vocab"], seed)
    for j, p in enumerate(prompts):
        parity_run(name, binary, d, ref, p, j)
    variants = []
    if needs_perturbation(ref):
        pd = d + "_perturbed"
        rewrite_checkpoint(d, pd, perturb_seed=seed + 100)
        variants.append((name + "_perturbed", pd))
    if arch == "llama" and not g["tie"]:
        # hand-built llama with attention_bias = true (q/k/v/o biases)
        bd = d + "_attnbias"
        r0 = ref.cfg
        nq, nkv = r0.heads * r0.head_dim, r0.kv_heads * r0.head_dim
        rng = np.random.default_rng(seed + 7)
        dt = rm.TORCH_DTYPE_TO_ST[TORCH_DTYPE[g["dtype"]]]
        add = []
        for l in range(r0.layers):
            for proj, n in (("q_proj", nq), ("k_proj", nkv), ("v_proj", nkv), ("o_proj", r0.hidden)):
                nm = "model.layers.%d.self_attn.%s.bias" % (l, proj)
                add.append(rm.RawTensor(nm, dt, (n,), rm.encode_array(dt, 0.3 * rng.standard_normal(n))))

        def set_bias(c):
            c["attention_bias"] = True
        rewrite_checkpoint(d, bd, mutate_cfg=set_bias, add_tensors=add, perturb_seed=seed + 200)
        variants.append((name + "_attention_bias", bd))
    for vname, vd in variants:
        vref = load_ref(vname, vd)
        if vref is None:
            continue
        for j, p in enumerate(prompts[:2]):
            parity_run(vname, binary, vd, vref, p, j)
    return ref


def test_rope(binary, tmp, name, arch, g, opts, want, seed):
    """A RoPE variant: config.json in the asked layout, then greedy parity on prompts past
    original_max_position_embeddings, the reference computing the tables from the config itself."""
    d = os.path.join(tmp, name)
    res = H.mkmodel(binary, d, arch, seed=seed, extra=opts, **g)
    if not C.check(res.rc == 0, "%s: mkmodel exited %s: %s\n  cmd: %s" % (name, res.rc, res.stderr.strip(), res.cmd())):
        return
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    v5 = "--config-layout" in opts and opts[opts.index("--config-layout") + 1] == "v5"
    key, other = ("rope_parameters", "rope_scaling") if v5 else ("rope_scaling", "rope_parameters")
    C.check(cfg.get(key) == want, "%s: config.json %s = %r, expected %r" % (name, key, cfg.get(key), want))
    C.check(other not in cfg, "%s: config.json has %s too" % (name, other))
    C.check(("rope_theta" in cfg) != v5, "%s: top-level rope_theta present=%s in layout %s"
            % (name, "rope_theta" in cfg, "v5" if v5 else "v4"))
    C.check(("dtype" if v5 else "torch_dtype") in cfg, "%s: config.json lacks its dtype field" % name)
    ref = load_ref(name, d)
    if ref is None:
        return
    rng = np.random.default_rng(seed)
    for j, n in enumerate((70, 100)):
        parity_run(name, binary, d, ref, [int(x) for x in rng.integers(0, g["vocab"], size=n)], j)


def main():
    binary = H.require_bin(C)
    tmp = H.scratch_dir("reference")
    # GS_REF_ONLY=rope runs only the RoPE variants (a quick loop while working on RoPE)
    only = os.environ.get("GS_REF_ONLY", "")
    for k, (name, arch, g, opts, want) in enumerate(ROPE_CONFIGS):
        test_rope(binary, tmp, name, arch, g, opts, want, 5000 + 31 * k)
    if only == "rope":
        return C.finish()
    sampled = {"qwen3_hd32_gqa2_tied", "qwen2_gqa2_untied"}
    for k, (name, arch, g, shards) in enumerate(CONFIGS):
        seed = 1000 + 17 * k
        ref = test_config(binary, tmp, name, arch, g, shards, seed)
        if ref is not None and name in sampled:
            sampling_run(name, binary, os.path.join(tmp, name), ref, prompts_for(g["vocab"], seed)[1])
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
