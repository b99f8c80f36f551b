"""Optional: graphswap (and the numpy reference's RoPE tables) against Hugging Face transformers itself.

Needs torch and transformers importable by this python3 (never installed by make check): without
them the test prints why and exits 77, which ctest reports as SKIPPED (SKIP_RETURN_CODE 77).

For each RoPE variant (mkmodel --rope-* / --config-layout, float32 weights):
  * transformers' rotary embedding (inv_freq, attention_scaling) equals ref_model.rope_frequencies
    (the numpy reference the always-on test_reference.py compares graphswap with) within 1e-6,
  * graphswap's greedy tokens on a prompt past original_max_position_embeddings equal transformers'
    argmax under teacher forcing, and every logprob agrees within 1e-3.
transformers 4 does not read the version 5 layout (rope_parameters): those variants are skipped
there, with a note.
Qwen3-MoE (Qwen3MoeForCausalLM, mkmodel --arch qwen3_moe, both expert layouts, bf16 / f32 weights run
in float32): transformers loads the checkpoint with no missing / unexpected / mismatched key, its
decoder layers are sparse exactly where the reference's rule says (Qwen3MoeSparseMoeBlock vs
Qwen3MoeMLP), the numpy reference's teacher-forced logprobs equal transformers' within 1e-4, and
graphswap's greedy tokens / logprobs equal transformers' (argmax, 1e-3). transformers 5 reads both
layouts (the per-expert one through its conversion_mapping, the fused one as its own parameters);
transformers 4 only the per-expert one: fused variants are skipped there, with a note. The first
MoE variant is also saved by transformers (save_pretrained) and that folder must give graphswap the
same output. Environment: GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR; GS_PYTHON_TORCH may name
another python3 (e.g. a virtualenv holding torch) that the test re-executes itself with.
"""

import os
import sys

sys.dont_write_bytecode = True

alt = os.environ.get("GS_PYTHON_TORCH")
if alt and os.path.realpath(alt) != os.path.realpath(sys.executable) and not os.environ.get("GS_TORCH_REEXEC"):
    os.environ["GS_TORCH_REEXEC"] = "1"
    os.execv(alt, [alt] + sys.argv)

try:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:  # optional dependency: skipped, never passed
    print("SKIP: torch / transformers not importable (%s); set GS_PYTHON_TORCH to a python3 that has them" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402

TOL = 1e-3
MAX_TOKENS = 8
C = H.Checker("transformers_ref")
TF_MAJOR = int(transformers.__version__.split(".")[0])

G = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, inter=128, vocab=512, tie=False, dtype="f32")
VARIANTS = [
    ("tf_qwen3_default_v4", "qwen3", ["--rope-theta", "10000"]),
    ("tf_qwen3_linear_v4", "qwen3", ["--rope-theta", "10000", "--rope-type", "linear", "--rope-factor", "2.5"]),
    ("tf_llama_llama3_v4", "llama", ["--rope-theta", "10000", "--rope-type", "llama3", "--rope-factor", "8",
                                     "--rope-low-freq-factor", "1", "--rope-high-freq-factor", "4",
                                     "--rope-orig-max-pos", "64"]),
    ("tf_qwen2_yarn_v4", "qwen2", ["--max-pos", "256", "--rope-theta", "10000", "--rope-type", "yarn",
                                   "--rope-factor", "4", "--rope-orig-max-pos", "64"]),
    ("tf_qwen3_dynamic_v4", "qwen3", ["--rope-theta", "10000", "--rope-type", "dynamic", "--rope-factor", "4"]),
    ("tf_llama_llama3_v5", "llama", ["--config-layout", "v5", "--rope-theta", "10000", "--rope-type", "llama3",
                                     "--rope-factor", "4", "--rope-low-freq-factor", "1",
                                     "--rope-high-freq-factor", "2", "--rope-orig-max-pos", "64"]),
    ("tf_qwen3_yarn_mscale_v5", "qwen3", ["--config-layout", "v5", "--max-pos", "512", "--rope-theta", "10000",
                                          "--rope-type", "yarn", "--rope-factor", "8", "--rope-orig-max-pos", "64",
                                          "--rope-beta-fast", "16", "--rope-beta-slow", "2", "--rope-mscale", "2",
                                          "--rope-mscale-all-dim", "0.5", "--rope-truncate", "false"]),
    ("tf_qwen3_default_v5", "qwen3", ["--config-layout", "v5", "--rope-theta", "5000"]),
]


# Qwen3-MoE: name, geometry, mkmodel MoE options
MOE_G = dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=96, vocab=512, tie=False, dtype="f32")
MOE_VARIANTS = [
    ("tf_moe_f32_e8_k2_norm", MOE_G, ["--experts", "8", "--experts-per-tok", "2", "--moe-intermediate", "32"]),
    ("tf_moe_f32_e8_k2_norm_fused", MOE_G,
     ["--experts", "8", "--experts-per-tok", "2", "--moe-intermediate", "32", "--moe-fused"]),
    ("tf_moe_bf16_e6_k1_nonorm_fused", dict(MOE_G, dtype="bf16", tie=True),
     ["--experts", "6", "--experts-per-tok", "1", "--moe-intermediate", "24", "--no-norm-topk", "--moe-fused"]),
    ("tf_moe_bf16_e5_k3_step2_mlponly", dict(MOE_G, layers=4, dtype="bf16"),
     ["--experts", "5", "--experts-per-tok", "3", "--moe-intermediate", "20", "--sparse-step", "2",
      "--mlp-only", "3"]),
]
REF_TOL = 1e-4


def load_hf(d, info=False):
    kw = {"dtype": torch.float32} if TF_MAJOR >= 5 else {"torch_dtype": torch.float32}
    m = AutoModelForCausalLM.from_pretrained(d, output_loading_info=info, **kw)
    if info:
        m, li = m
    m.eval()
    return (m, li) if info else m


def hf_check_tokens(name, model, prompt, out):
    """transformers' log-softmax over prompt + graphswap's greedy tokens: each token must be its
    argmax and its logprob within TOL of graphswap's. Returns (the log-softmax rows, the worst
    |dlogprob|)."""
    toks = out["token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + toks])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1).numpy()
    worst = 0.0
    for i, t in enumerate(toks):
        row = lp[len(prompt) - 1 + i]
        C.check(int(np.argmax(row)) == t, "%s step %d: graphswap token %d, transformers argmax %d"
                % (name, i, t, int(np.argmax(row))))
        diff = abs(H.num(out["logprobs"][i]) - row[t])
        worst = max(worst, diff)
        C.check(diff <= TOL, "%s step %d: logprob %s vs transformers %.6f" % (name, i, out["logprobs"][i], row[t]))
    return lp, worst


def check_moe_variant(binary, tmp, name, g, opts, seed):
    if "--moe-fused" in opts and TF_MAJOR < 5:
        print("  %-34s skipped: transformers %s has no fused expert parameters" % (name, transformers.__version__))
        return
    d = os.path.join(tmp, name)
    res = H.mkmodel(binary, d, "qwen3_moe", seed=seed, extra=opts, **g)
    if not C.check(res.rc == 0, "%s: mkmodel: %s" % (name, res.stderr.strip())):
        return
    model, info = load_hf(d, info=True)
    C.check(type(model).__name__ == "Qwen3MoeForCausalLM", "%s: transformers built %s" % (name, type(model).__name__))
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                                       "error_msgs")}
    C.check(not bad, "%s: transformers loading info %s" % (name, bad))
    ref = rm.RefModel(d)
    hf_sparse = [type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in model.model.layers]
    C.check(hf_sparse == ref.cfg.sparse, "%s: transformers' sparse layers %s, reference %s"
            % (name, hf_sparse, ref.cfg.sparse))
    rng = np.random.default_rng(seed)
    prompt = [int(x) for x in rng.integers(0, g["vocab"], size=23)]
    out = H.generate(C, name, binary, d, prompt, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    if out is None:
        return
    lp, worst = hf_check_tokens(name, model, prompt, out)
    rlp = rm.log_softmax(ref.forward(prompt + out["token_ids"]))
    rdiff = float(np.max(np.abs(rlp - lp)))
    C.check(rdiff <= REF_TOL, "%s: numpy reference logprobs differ from transformers' by %.2e" % (name, rdiff))
    print("  %-34s max|dlogprob| graphswap vs transformers %.2e, reference vs transformers %.2e"
          % (name, worst, rdiff), flush=True)
    if name == MOE_VARIANTS[0][0]:
        check_moe_saved(binary, model, ref, d, prompt, out)


def check_moe_saved(binary, model, ref, d, prompt, out):
    """transformers' own save_pretrained of the loaded model (transformers 5: per-expert tensors, and
    config.json with num_local_experts for num_experts): the reference reads the same numbers and
    graphswap gives the same tokens and logprobs as on the mkmodel checkpoint."""
    sd = d + "_hf_saved"
    model.save_pretrained(sd)
    what = os.path.basename(sd)
    try:
        sref = rm.RefModel(sd)
    except (rm.FormatError, KeyError, ValueError) as e:
        C.fail("%s: the reference cannot read transformers' save: %s" % (what, e))
        return
    seq = prompt + out["token_ids"]
    C.check(np.array_equal(sref.forward(seq), ref.forward(seq)), "%s: the reference reads other numbers" % what)
    out2 = H.generate(C, what, binary, sd, prompt, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    if out2 is None:
        return
    C.check(out2["token_ids"] == out["token_ids"], "%s: graphswap tokens %s, on the mkmodel checkpoint %s"
            % (what, out2["token_ids"], out["token_ids"]))
    diff = max(abs(H.num(a) - H.num(b)) for a, b in zip(out2["logprobs"], out["logprobs"]))
    C.check(diff <= 1e-6, "%s: graphswap logprobs differ from the mkmodel checkpoint's by %.2e" % (what, diff))
    print("  %-34s transformers' save_pretrained: graphswap tokens %s" % (what, "ok" if out2["token_ids"] ==
                                                                          out["token_ids"] else "BAD"), flush=True)


def check_variant(binary, tmp, name, arch, opts, seed):
    if "v5" in opts and TF_MAJOR < 5:
        print("  %-28s skipped: transformers %s does not read rope_parameters" % (name, transformers.__version__))
        return
    d = os.path.join(tmp, name)
    res = H.mkmodel(binary, d, arch, seed=seed, extra=opts, **G)
    if not C.check(res.rc == 0, "%s: mkmodel: %s" % (name, res.stderr.strip())):
        return
    model = load_hf(d)
    rot = model.model.rotary_emb
    cfg = rm.load_config(d)
    inv, af = rm.rope_frequencies(cfg.theta, cfg.rope, cfg.head_dim, cfg.max_pos)
    hf_inv = rot.inv_freq.detach().double().numpy()
    C.check(np.allclose(hf_inv, inv, rtol=1e-6, atol=0), "%s: transformers inv_freq %s != reference %s"
            % (name, hf_inv, inv))
    C.check(abs(float(rot.attention_scaling) - af) < 1e-6, "%s: transformers attention_scaling %r != reference %r"
            % (name, rot.attention_scaling, af))
    rng = np.random.default_rng(seed)
    prompt = [int(x) for x in rng.integers(0, G["vocab"], size=70)]
    out = H.generate(C, name, binary, d, prompt, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    if out is None:
        return
    _, worst = hf_check_tokens(name, model, prompt, out)
    print("  %-28s max|dlogprob| vs transformers %.2e" % (name, worst), flush=True)


def main():
    binary = H.require_bin(C)
    tmp = H.scratch_dir("transformers_ref")
    torch.manual_seed(0)
    print("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    for k, (name, arch, opts) in enumerate(VARIANTS):
        check_variant(binary, tmp, name, arch, opts, 7000 + 13 * k)
    for k, (name, g, opts) in enumerate(MOE_VARIANTS):
        check_moe_variant(binary, tmp, name, g, opts, 7500 + 13 * (k // 2 * 2))   # the layout pair: one seed
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
