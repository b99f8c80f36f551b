"""Qwen3-MoE (Qwen3MoeForCausalLM) parity of graphswap against the float64 numpy reference (ref_model.py).

For each MoE checkpoint built with `graphswap mkmodel --arch qwen3_moe` (both expert layouts, bf16 /
f32 / f16, norm_topk_prob on and off, k = 1, 2, 3 and k = E, decoder_sparse_step 2 with
mlp_only_layers, tied / untied, sharded):
  * config.json holds the Qwen3MoeConfig fields asked for, and the reference's strict loader finds
    exactly the Hugging Face tensor set of the asked layout (per expert: mlp.experts.<e>.*_proj.weight;
    fused: mlp.experts.gate_up_proj / mlp.experts.down_proj) with the right shapes and dtype,
  * a per-expert and a --moe-fused checkpoint of one seed hold the same numbers (the fused tensors are
    byte for byte the reference's conversion of the per-expert ones), and graphswap gives them the
    same tokens and logprobs,
  * `graphswap generate` (prefill in chunks of 3): greedy tokens == the reference's, every logprob,
    top_logprobs entry and teacher-forced prompt logprob (--prompt-logprobs) within 1e-3 (the
    tolerance of test_reference.py, whose parity_run this reuses),
  * the three prompts at once (--batch-file: rows of several sequences routed together), with and
    without --eager (plans replayed or not), give the reference's tokens and logprobs,
  * `graphswap serve`: /v1/completions with echo + logprobs (teacher-forced prompt logprobs) and
    greedy tokens == the reference,
  * config.json as transformers 5 saves it (Qwen3MoeConfig's attribute_map writes num_experts as
    num_local_experts), and one leaving out the fields whose transformers default is the model's
    (norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers []): the same parity,
  * num_experts 0: a Qwen3 checkpoint relabelled Qwen3MoeForCausalLM is all dense,
  * router ties: a copy whose router rows 5 and 6 are exact copies of row 2 in every sparse layer
    (so those experts' probabilities are equal, bit for bit) must choose the lower ids where the tied
    group straddles the k-th place, as the reference does (a TEST SETUP PROBLEM when no token of the
    prompts puts the group there).
Test-setup guards: a reference top-2 logit gap below 1e-5 (test_reference) and a router margin
(p of the k-th chosen expert minus p of the best unchosen one) below ROUTER_GAP on the reference's
greedy path are reported as TEST SETUP PROBLEMs, and each sparse layer must route its tokens to
more than k distinct experts (else expert indexing would go unseen).
Environment: GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR (as ctest sets them).
"""

import json
import os
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "integration"))
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402
import test_reference as TR  # noqa: E402  (parity_run, check_top, rewrite_checkpoint, TOL; its Checker)

C = TR.C
C.name = "moe_reference"
TOL = TR.TOL
ROUTER_GAP = 1e-5

TORCH_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}

G64 = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=96, vocab=512, tie=True, dtype="bf16")

# name, geometry, MoE options (dict: experts, k, inter, norm, step, mlp_only, fused), shards, seed.
# Names ending in "_fused" share their seed with the per-expert config named without it (pairs).
CONFIGS = [
    ("moe_bf16_e8_k2_norm", G64, dict(experts=8, k=2, inter=32), 1, 4101),
    ("moe_bf16_e8_k2_norm_fused", G64, dict(experts=8, k=2, inter=32, fused=True), 1, 4101),
    ("moe_f32_e6_k1_nonorm_untied", dict(G64, dtype="f32", tie=False, inter=80),
     dict(experts=6, k=1, inter=24, norm=False), 1, 4202),
    ("moe_f32_e6_k1_nonorm_untied_fused", dict(G64, dtype="f32", tie=False, inter=80),
     dict(experts=6, k=1, inter=24, norm=False, fused=True), 1, 4202),
    ("moe_bf16_e5_k3_step2_mlponly_sharded2",
     dict(hidden=64, layers=6, heads=4, kv_heads=1, head_dim=16, inter=112, vocab=640, tie=False, dtype="bf16"),
     dict(experts=5, k=3, inter=20, step=2, mlp_only=[0, 3]), 2, 4303),
    ("moe_f32_e4_k4_nonorm_step2_fused",
     dict(hidden=48, layers=3, heads=6, kv_heads=3, head_dim=8, inter=64, vocab=512, tie=True, dtype="f32"),
     dict(experts=4, k=4, inter=16, norm=False, step=2, fused=True), 1, 4404),
    ("moe_bf16_e16_k4_nonorm_fused_sharded3",
     dict(hidden=96, layers=2, heads=8, kv_heads=2, head_dim=12, inter=128, vocab=768, tie=False, dtype="bf16"),
     dict(experts=16, k=4, inter=24, norm=False, fused=True), 3, 4505),
    ("moe_f16_e8_k2_norm", dict(G64, dtype="f16"), dict(experts=8, k=2, inter=32), 1, 4606),
]
SERVED = {"moe_bf16_e8_k2_norm", "moe_f32_e6_k1_nonorm_untied_fused", "moe_bf16_e5_k3_step2_mlponly_sharded2"}
TIED = {"moe_bf16_e8_k2_norm": (2, 5, 6), "moe_bf16_e16_k4_nonorm_fused_sharded3": (3, 9, 10),
        "moe_f32_e6_k1_nonorm_untied": (1, 4)}
CONFIG_VARIANTS = {"moe_f32_e6_k1_nonorm_untied"}
EAGER = {"moe_bf16_e8_k2_norm_fused", "moe_bf16_e5_k3_step2_mlponly_sharded2"}


def mk_opts(m):
    o = ["--experts", str(m["experts"]), "--experts-per-tok", str(m["k"]), "--moe-intermediate", str(m["inter"])]
    if not m.get("norm", True):
        o.append("--no-norm-topk")
    if m.get("step", 1) != 1:
        o += ["--sparse-step", str(m["step"])]
    if m.get("mlp_only"):
        o += ["--mlp-only", ",".join(str(x) for x in m["mlp_only"])]
    if m.get("fused"):
        o.append("--moe-fused")
    return o


def sparse_rule(layers, m):
    mo = m.get("mlp_only", [])
    return [(l not in mo) and (l + 1) % m.get("step", 1) == 0 for l in range(layers)]


def check_config(name, d, g, m):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    want = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": g["hidden"],
        "intermediate_size": g["inter"], "num_hidden_layers": g["layers"], "num_attention_heads": g["heads"],
        "num_key_value_heads": g["kv_heads"], "head_dim": g["head_dim"], "vocab_size": g["vocab"],
        "tie_word_embeddings": g["tie"], "torch_dtype": TORCH_DTYPE[g["dtype"]], "hidden_act": "silu",
        "num_experts": m["experts"], "num_experts_per_tok": m["k"], "moe_intermediate_size": m["inter"],
        "norm_topk_prob": m.get("norm", True), "decoder_sparse_step": m.get("step", 1),
        "mlp_only_layers": list(m.get("mlp_only", [])),
    }
    for k, v in want.items():
        C.check(k in cfg and cfg[k] == v and type(cfg[k]) is type(v),
                "%s: config.json %s = %r, expected %r" % (name, k, cfg.get(k, "<absent>"), v))


def load_ref(name, d, g, m):
    ref = TR.load_ref(name, d)
    if ref is None:
        return None
    layout = "fused" if m.get("fused") else "per_expert"
    C.check(ref.moe_layout == layout, "%s: checkpoint layout %s, expected %s" % (name, ref.moe_layout, layout))
    C.check(ref.cfg.sparse == sparse_rule(g["layers"], m), "%s: sparse layers %s, expected %s"
            % (name, ref.cfg.sparse, sparse_rule(g["layers"], m)))
    return ref


def routing_setup(name, ref, prompts):
    """Router margins on the reference's greedy paths, and expert coverage per sparse layer."""
    k = ref.cfg.experts_per_tok
    worst = np.inf
    used = {l: set() for l in range(ref.cfg.layers) if ref.cfg.sparse[l]}
    for p in prompts:
        toks, _ = ref.greedy(p, TR.MAX_TOKENS)
        r = {}
        ref.forward(p + toks, router=r)
        for l, (pr, sel, _) in r.items():
            worst = min(worst, float(np.min(rm.router_margins(pr, k))))
            used[l] |= set(int(e) for e in sel.ravel())
    C.check(worst >= ROUTER_GAP, "TEST SETUP PROBLEM: %s: a router margin of %.2e (< %g) on the reference's greedy "
            "path: rounding may flip the routing; change the seed" % (name, worst, ROUTER_GAP))
    if k < ref.cfg.n_experts:
        for l, s in used.items():
            C.check(len(s) > k, "TEST SETUP PROBLEM: %s: sparse layer %d routes every token to the same %d experts %s"
                    % (name, l, len(s), sorted(s)))
    return worst, {l: len(s) for l, s in used.items()}


def batch_run(name, binary, d, ref, prompts, tmp, eager=False):
    """The prompts as one --batch-file run (sequences stepped together)."""
    what = "%s batch%s" % (name, " --eager" if eager else "")
    reqs = [{"prompt_ids": p, "max_tokens": TR.MAX_TOKENS, "ignore_eos": True, "logprobs": 2, "prompt_logprobs": 0}
            for p in prompts]
    outs = H.generate_batch(C, what, binary, d, reqs, os.path.join(tmp, name + (".eager" if eager else "") + ".jsonl"),
                            prefill_chunk=5, eager=eager)
    if outs is None:
        return
    worst = 0.0
    for j, (p, out) in enumerate(zip(prompts, outs)):
        ref_toks, _ = ref.greedy(p, TR.MAX_TOKENS)
        toks = out.get("token_ids")
        C.check(toks == ref_toks, "%s request %d: tokens %s, reference %s" % (what, j, toks, ref_toks))
        if not isinstance(toks, list) or not all(isinstance(t, int) and 0 <= t < ref.cfg.vocab for t in toks):
            continue
        lp = ref.step_logprobs(p, toks)
        for i, t in enumerate(toks):
            diff = abs(H.num(out["logprobs"][i]) - lp[i][t])
            worst = max(worst, diff)
            C.check(diff <= TOL, "%s request %d step %d: logprob %s, reference %.6f" % (what, j, i, out["logprobs"][i],
                                                                                       lp[i][t]))
        pl = out.get("prompt_logprobs")
        if C.check(isinstance(pl, list) and len(pl) == len(p), "%s request %d: prompt_logprobs %r" % (what, j, pl)):
            if len(p) > 1:
                plp = ref.step_logprobs(p[:1], p[1:])
                for i in range(1, len(p)):
                    diff = abs(H.num(pl[i]) - plp[i - 1][p[i]])
                    worst = max(worst, diff)
                    C.check(diff <= TOL, "%s request %d prompt position %d: logprob %s, reference %.6f"
                            % (what, j, i, pl[i], plp[i - 1][p[i]]))
    print("  %-48s max|dlogprob| %.2e" % (what, worst), flush=True)


def serve_run(name, binary, d, ref, prompt):
    """`graphswap serve`: /v1/completions echo + logprobs on token ids, temperature 0."""
    import test_http_basic as HB  # the Server / post helpers of the HTTP tests
    what = "%s serve" % name
    n = TR.MAX_TOKENS
    srv = HB.Server(C, binary, d, ["--threads", "2"])
    try:
        r = HB.post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                              "echo": True, "logprobs": 1, "return_token_ids": True})
        if not C.check(r.status == 200 and r.json is not None, "%s: /v1/completions: %r" % (what, r)):
            return
        ch = json.loads(r.raw.decode(), parse_float=str)["choices"][0]
        lp = ch.get("logprobs") or {}
        tl = lp.get("token_logprobs")
        if not C.check(isinstance(tl, list) and len(tl) == len(prompt) + n,
                       "%s: token_logprobs not %d + %d long: %r" % (what, len(prompt), n, tl)):
            return
        toks = ch.get("token_ids")
        ref_toks, _ = ref.greedy(prompt, n)
        C.check(toks == ref_toks, "%s: greedy tokens %s, reference %s" % (what, toks, ref_toks))
        if not isinstance(toks, list) or len(toks) != n:
            return
        full = ref.step_logprobs(prompt[:1], prompt[1:] + toks)    # row i predicts (prompt + toks)[i + 1]
        seq = prompt + toks
        C.check(tl[0] is None, "%s: the first prompt token has a logprob %r" % (what, tl[0]))
        worst = 0.0
        for i in range(1, len(seq)):
            diff = abs(H.num(tl[i]) - full[i - 1][seq[i]])
            worst = max(worst, diff)
            C.check(diff <= TOL, "%s: position %d (%s): logprob %s, reference %.6f"
                    % (what, i, "prompt" if i < len(prompt) else "generated", tl[i], full[i - 1][seq[i]]))
        print("  %-48s tokens %s  max|dlogprob| %.2e" % (what, "ok " if toks == ref_toks else "BAD", worst), flush=True)
    finally:
        HB.stop_clean(C, srv)
        HB._kill_all()


def same_numbers(name, d, pd):
    """The fused checkpoint d is byte for byte the reference's fusion of per-expert pd (same seed)."""
    cfg = rm.load_config(pd)
    conv = {t.name: t for t in rm.convert_moe_layout(rm.read_checkpoint_tensors(pd), cfg, "fused")}
    got = rm.read_checkpoint_tensors(d)
    C.check(set(conv) == set(got), "%s: tensor names differ from the fused conversion of %s" % (name, pd))
    bad = [n for n in conv if n in got and (conv[n].data != got[n].data or conv[n].shape != got[n].shape or
                                            conv[n].dtype != got[n].dtype)]
    C.check(not bad, "%s: %d tensors differ from the reference's fusion of the per-expert checkpoint: %s"
            % (name, len(bad), bad[:6]))


def same_output(name, binary, d, pd, prompt):
    """graphswap on both layouts of one model: the same tokens and logprobs (as printed)."""
    outs = [H.generate(C, "%s (%s)" % (name, x), binary, x, prompt, max_tokens=TR.MAX_TOKENS, logprobs=2,
                       ignore_eos=True, prefill_chunk=3) for x in (pd, d)]
    if None in outs:
        return
    a, b = outs
    C.check(a["token_ids"] == b["token_ids"], "%s: fused layout tokens %s != per-expert %s"
            % (name, b["token_ids"], a["token_ids"]))
    diff = max(abs(H.num(x) - H.num(y)) for x, y in zip(a["logprobs"], b["logprobs"]))
    C.check(diff <= 1e-6, "%s: fused vs per-expert logprobs differ by %.2e" % (name, diff))


def config_variants_run(name, binary, d, prompts):
    """The same model under other spellings of its config.json:
      * num_local_experts instead of num_experts (what transformers 5.x's save_pretrained writes
        for Qwen3MoeConfig, whose attribute_map maps num_experts to it),
      * norm_topk_prob / decoder_sparse_step / mlp_only_layers left out (a model with norm off, step
        1, no mlp-only layer): transformers' defaults false / 1 / [] mean the same model."""
    def rename(c):
        c["num_local_experts"] = c.pop("num_experts")

    def drop(c):
        for k in ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
                  "output_router_logits"):
            c.pop(k, None)
    for suffix, mut in (("_num_local_experts", rename), ("_defaults", drop)):
        vname, vd = name + suffix, d + suffix
        TR.rewrite_checkpoint(d, vd, mutate_cfg=mut)
        ref = TR.load_ref(vname, vd)
        if ref is None:
            continue
        for j, p in enumerate(prompts[1:], 1):
            TR.parity_run(vname, binary, vd, ref, p, j)


def tie_variant(src, dst, group):
    """A copy of src whose router rows group[1:] are byte copies of row group[0] (every sparse layer)."""
    def tie(t):
        if not t.name.endswith(".mlp.gate.weight"):
            return t
        a = t.to_f64()
        for e in group[1:]:
            a[e] = a[group[0]]
        return rm.RawTensor(t.name, t.dtype, t.shape, rm.encode_array(t.dtype, a))
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    wm, _ = rm.checkpoint_files(dst)
    for fn in ["model.safetensors"] if wm is None else sorted(set(wm.values())):
        path = os.path.join(dst, fn)
        tensors, meta = rm.read_safetensors(path)
        rm.write_safetensors(path, [tie(t) for t in tensors], meta)     # same sizes: the index still holds


def tie_run(name, binary, d, group, prompts):
    tname = name + "_router_tie"
    td = d + "_router_tie"
    tie_variant(d, td, group)
    ref = TR.load_ref(tname, td)
    if ref is None:
        return
    k = ref.cfg.experts_per_tok
    straddle = 0
    for p in prompts:
        toks, _ = ref.greedy(p, TR.MAX_TOKENS)
        r = {}
        ref.forward(p + toks, router=r)
        for l, (pr, sel, _) in r.items():
            C.check(bool(np.all(pr[:, list(group)] == pr[:, [group[0]]])), "%s: tie set-up: p not equal" % tname)
            for row in sel:
                n_in = len(set(int(e) for e in row) & set(group))
                if 0 < n_in < len(group):
                    straddle += 1
                    C.check(all(e in row for e in group[:n_in]), "%s: reference chose %s of tied %s"
                            % (tname, row.tolist(), group))
    C.check(straddle > 0, "TEST SETUP PROBLEM: %s: no token puts the tied experts %s across the k-th place"
            % (tname, list(group)))
    print("%s: %d token-layers where the tie %s decides the routing (k = %d)" % (tname, straddle, list(group), k),
          flush=True)
    for j, p in enumerate(prompts):
        TR.parity_run(tname, binary, td, ref, p, j)
    batch_run(tname, binary, td, ref, prompts, os.path.dirname(td))


def test_config(binary, tmp, name, g, m, shards, seed):
    d = os.path.join(tmp, name)
    res = H.mkmodel(binary, d, "qwen3_moe", shards=shards, seed=seed, extra=mk_opts(m), **g)
    if not C.check(res.rc == 0, "%s: mkmodel exited %s: %s\n  cmd: %s" % (name, res.rc, res.stderr.strip(), res.cmd())):
        return
    check_config(name, d, g, m)
    ref = load_ref(name, d, g, m)
    if ref is None:
        return
    prompts = TR.prompts_for(g["vocab"], seed)
    gap, used = routing_setup(name, ref, prompts)
    print("%s: sparse layers %s, min router margin %.2e, experts used per sparse layer %s"
          % (name, [l for l in range(g["layers"]) if ref.cfg.sparse[l]], gap, used), flush=True)
    for j, p in enumerate(prompts):
        TR.parity_run(name, binary, d, ref, p, j)
    batch_run(name, binary, d, ref, prompts, tmp)
    if name in EAGER:
        batch_run(name, binary, d, ref, prompts, tmp, eager=True)
    if name.endswith("_fused") and os.path.isdir(d[:-len("_fused")]):
        pd = d[:-len("_fused")]
        same_numbers(name, d, pd)
        same_output(name, binary, d, pd, prompts[2])
    if name in SERVED:
        serve_run(name, binary, d, ref, prompts[1])
    # mkmodel draws norm weights around 1 (no perturbed copy needed: test_reference's needs_perturbation)
    C.check(not TR.needs_perturbation(ref), "TEST SETUP PROBLEM: %s: a norm weight is all ones" % name)
    if name in TIED:
        tie_run(name, binary, d, TIED[name], prompts)
    if name in CONFIG_VARIANTS:
        config_variants_run(name, binary, d, prompts)


def zero_experts_run(binary, tmp):
    """Qwen3MoeForCausalLM with num_experts 0: every layer dense (Qwen3MoeDecoderLayer's rule), so a
    plain Qwen3 checkpoint relabelled is the same model."""
    name = "moe_num_experts_0"
    g = dict(G64, layers=3, dtype="bf16")
    src = os.path.join(tmp, name + "_qwen3")
    res = H.mkmodel(binary, src, "qwen3", seed=4707, **g)
    if not C.check(res.rc == 0, "%s: mkmodel: %s" % (name, res.stderr.strip())):
        return
    d = os.path.join(tmp, name)

    def relabel(c):
        c.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 0,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32})
    TR.rewrite_checkpoint(src, d, mutate_cfg=relabel)
    ref = TR.load_ref(name, d)
    if ref is None:
        return
    C.check(not any(ref.cfg.sparse), "%s: the reference finds sparse layers" % name)
    for j, p in enumerate(TR.prompts_for(g["vocab"], 4707)[1:], 1):
        TR.parity_run(name, binary, d, ref, p, j)


def main():
    binary = H.require_bin(C)
    tmp = H.scratch_dir("moe_reference")
    only = os.environ.get("GS_MOE_ONLY")   # a comma-separated subset of config names (a quick loop)
    for name, g, m, shards, seed in CONFIGS:
        if only and name not in only.split(","):
            continue
        test_config(binary, tmp, name, g, m, shards, seed)
    if not only:
        zero_experts_run(binary, tmp)
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
