"""Drafter formats as published (issue 11, part 3), against the float64 reference.

* target_layer_ids -1 (DeepSpec: the embedding output, hidden_states[0]) and L-1 (z-lab DFlash:
  hidden_states[L], which Hugging Face replaces by the final-NORMED state; SPEC-NOTES.md section 0)
  are implemented as those semantics: drafters built by `graphswap mkmodel --target-layer-ids` and
  by the reference writer, with -1 and / or L-1 among their ids, give the reference's trace,
  acceptance_lengths and token_ids (ref_spec.target_feats). A graphswap that used the raw residual
  for L-1, or refused either id, fails here.
* a DSpark config.json carrying every field of DeepSpec's Qwen3DSparkConfig (num_anchors,
  layer_types, _attn_implementation, tie_word_embeddings, the target's copied fields) loads and
  runs; mkmodel writes those fields itself.
* fields that would change the math are refused naming the field; out-of-range ids give one message.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_harness as H  # noqa: E402
import ref_spec as rs  # noqa: E402
import test_spec_reference as T  # noqa: E402

C = H.Checker("spec_formats")
T.C = C
MAX_TOKENS = 32


def refused(binary, tdir, ddir, words):
    p = subprocess.run([binary, "generate", "--model", tdir, "--draft", ddir, "--prompt-ids", "1,2",
                        "--max-tokens", "2"], capture_output=True, text=True, timeout=300)
    return p.returncode != 0 and all(w in p.stderr for w in words), p.stderr.strip()[-400:]


def main():
    binary = H.require_bin(C)
    hr = H.run([binary, "generate", "--help"])
    if "--draft" not in hr.stdout + hr.stderr:
        print("graphswap has no --draft support yet")
        print("0 passed, 0 failed", flush=True)
        return 0
    tmp = H.scratch_dir("spec_formats")
    for ti in (0, 1):
        name, g, seed = T.TARGETS[ti]
        tdir = os.path.join(tmp, name)
        r = T.mkmodel_target(binary, tdir, g, seed)
        if not C.check(r.rc == 0, "%s: mkmodel exited %s: %s" % (name, r.rc, r.stderr.strip()[-1000:])):
            continue
        target = T.load_target(name, tdir)
        if target is None:
            continue
        L = g["layers"]
        tdict = json.load(open(os.path.join(tdir, "config.json")))

        # 1. mkmodel drafters with -1 / L-1 among the ids
        for kind, ids, layers, block, rank, dseed in (("dflash", [-1, L - 1], 1, 6, None, 51),
                                                      ("dflash", [L - 1], 2, 8, None, 52),
                                                      ("dspark", [-1, 1, L - 1], 2, 5, 8, 53),
                                                      ("dspark", [-1], 1, 7, 0, 54)):
            dname = "%s/%s-mk ids=%s" % (name, kind, ids)
            ddir = os.path.join(tmp, "mk_%s_%d_%s" % (kind, ti, "_".join(str(j) for j in ids)))
            shutil.rmtree(ddir, ignore_errors=True)
            args = [binary, "mkmodel", "--arch", kind, "--target", tdir, "--out", ddir, "--layers", str(layers),
                    "--block-size", str(block), "--seed", str(dseed),
                    "--target-layer-ids", ",".join(str(j) for j in ids)]
            if rank is not None:
                args += ["--markov-rank", str(rank)]
            r = H.run(args)
            if not C.check(r.rc == 0, "%s: mkmodel exited %s: %s" % (dname, r.rc, r.stderr.strip()[-500:])):
                continue
            cfg = json.load(open(os.path.join(ddir, "config.json")))
            tl = (cfg.get("dflash_config") or {}).get("target_layer_ids", cfg.get("target_layer_ids"))
            C.check(tl == ids, "%s: mkmodel wrote target_layer_ids %r" % (dname, tl))
            C.check(cfg.get("layer_types") == ["full_attention"] * layers, "%s: layer_types %r"
                    % (dname, cfg.get("layer_types")))
            if kind == "dspark":  # every field DeepSpec's build_draft_config sets (config.py:37-56)
                for f in ("architectures", "num_target_layers", "num_hidden_layers", "block_size",
                          "tie_word_embeddings", "layer_types", "mask_token_id", "target_layer_ids", "num_anchors",
                          "enable_confidence_head", "markov_rank"):
                    C.check(f in cfg, "%s: DSpark config.json lacks %s" % (dname, f))
                C.check(cfg.get("tie_word_embeddings") is False, "%s: tie_word_embeddings must be false" % dname)
                C.check(isinstance(cfg.get("num_anchors"), int), "%s: num_anchors %r" % (dname, cfg.get("num_anchors")))
            drafter = T.load_drafter(dname, ddir, target)
            if drafter is None:
                continue
            p = T.pick_prompt(dname, target, drafter, g["vocab"], dseed + ti, MAX_TOKENS)
            if p is not None:
                T.compare(dname, binary, tdir, ddir, target, drafter, p, MAX_TOKENS, tmp=tmp)

        # 2. reference-written drafters (exact layouts): random and engineered, ids with -1 and L-1,
        #    the DSpark one carrying every Qwen3DSparkConfig field
        p0 = [int(x) for x in np.random.default_rng(60 + ti).integers(0, g["vocab"] - 2, size=9)]
        greedy, _ = rs.target_greedy(target, p0, MAX_TOKENS)
        pairs = list(zip([p0[-1]] + greedy[:-1], greedy))
        specs = [
            ("dflash-rand", "dflash", dict(layers=2, block_size=7, target_layer_ids=[-1, 0, L - 2, L - 1]), None),
            ("dflash-last", "dflash", dict(layers=1, block_size=5, target_layer_ids=[L - 1]), None),
            ("dspark-eng", "dspark", dict(layers=2, block_size=6, target_layer_ids=[-1, L - 1], markov_rank=32,
                                          enable_conf=True, conf_markov=True), "markov"),
            ("dspark-emb", "dspark", dict(layers=1, block_size=4, target_layer_ids=[-1], markov_rank=0), None),
            # transformers 5's layout (DeepSpec pins it): theta only inside rope_parameters, and not the
            # target's, so a loader that missed it and used a default would draft differently
            ("dspark-v5rope", "dspark", dict(layers=1, block_size=5, target_layer_ids=[0], markov_rank=8),
             None),
        ]
        for label, kind, ckw, eng in specs:
            dname = "%s/%s ids=%s" % (name, label, ckw["target_layer_ids"])
            ddir = os.path.join(tmp, "w_%s_%d" % (label, ti))
            shutil.rmtree(ddir, ignore_errors=True)
            cd = rs.make_drafter_config(kind, tdict, **ckw)
            if kind == "dspark":  # the rest of Qwen3DSparkConfig, as save_pretrained may write it
                cd.update({"_attn_implementation": "flex_attention", "num_anchors": 512, "initializer_range": 0.02,
                           "use_cache": True, "pad_token_id": None, "transformers_version": "4.57.1"})
            if label.endswith("v5rope"):
                cd.pop("rope_theta", None)
                cd.pop("rope_scaling", None)
                cd["rope_parameters"] = {"rope_theta": 5000.0, "rope_type": "default"}
            dcfg = rs.DraftConfig(cd)
            if label.endswith("v5rope"):
                C.check(float(dcfg.theta) == 5000.0, "%s: the reference read theta %r" % (dname, dcfg.theta))
            overrides = rs.markov_override(dcfg, pairs, scale=8.0, seed=ti, noise=0.3) if eng == "markov" else None
            w = rs.random_drafter_weights(dcfg, seed=70 + ti, target=target, own_head="perturb", overrides=overrides)
            rs.write_drafter(ddir, cd, w)
            drafter = T.load_drafter(dname, ddir, target)
            if drafter is None:
                continue
            prompts = [p0] if eng and T.tie_free(rs.spec_generate(target, drafter, p0, MAX_TOKENS)) else []
            if not prompts:
                pp = T.pick_prompt(dname, target, drafter, g["vocab"], 80 + ti, MAX_TOKENS)
                prompts = [pp] if pp is not None else []
            for p in prompts:
                T.compare(dname, binary, tdir, ddir, target, drafter, p, MAX_TOKENS, tmp=tmp,
                          want_accept=bool(eng) and p is p0)
                T.compare(dname + " --prefill-chunk 3", binary, tdir, ddir, target, drafter, p, MAX_TOKENS,
                          tmp=tmp, extra_args=["--prefill-chunk", "3"])

        # 3. refusals naming the field; out-of-range ids with one message (config and pairing)
        base = rs.make_drafter_config("dspark", tdict, layers=1, block_size=4, target_layer_ids=[0], markov_rank=0)
        w = rs.random_drafter_weights(rs.DraftConfig(base), seed=90, target=target)
        for what, change, words in (
                ("id -2", {"target_layer_ids": [-2]}, ["target_layer_ids[0] = -2", "each -1 (the embedding output) "
                                                       "or a target layer in [0, %d]" % (L - 1)]),
                ("id L", {"target_layer_ids": [L]}, ["target_layer_ids[0] = %d" % L, "each -1 (the embedding "
                                                     "output) or a target layer in [0, %d]" % (L - 1)]),
                ("sliding layer", {"layer_types": ["sliding_attention"]}, ["layer_types"]),
                ("gated markov", {"markov_rank": 4, "markov_head_type": "gated"}, ["markov_head_type"])):
            cd = dict(base)
            cd.update(change)
            ddir = os.path.join(tmp, "bad_%d_%s" % (ti, what.replace(" ", "_")))
            shutil.rmtree(ddir, ignore_errors=True)
            os.makedirs(ddir)
            ww = dict(w)
            if change.get("markov_rank"):
                r4 = change["markov_rank"]
                ww["markov_head.markov_w1.weight"] = np.zeros((g["vocab"], r4))
                ww["markov_head.markov_w2.weight"] = np.zeros((g["vocab"], r4))
            names = sorted(ww)
            tensors = [rs.rm.RawTensor(n, "BF16", ww[n].shape, rs.rm.encode_array("BF16", ww[n])) for n in names]
            rs.rm.write_sharded(ddir, tensors, 1)
            with open(os.path.join(ddir, "config.json"), "w") as f:
                json.dump(cd, f)
            ok, msg = refused(binary, tdir, ddir, words)
            C.check(ok, "%s/%s: not refused with %s: %s" % (name, what, words, msg))
    print("coverage: %(runs)d speculative runs, %(steps)d steps compared, %(accepted)d drafts accepted" % T.STATS,
          flush=True)
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
