"""A stand-in for the graphswap binary's drafter CLI, built on the float64 reference, used only to
exercise test_spec_reference.py before graphswap has --draft (and to check that the test catches
bugs). Not part of any test run.

  GS_REAL_BIN=build/graphswap GS_BIN=<wrapper that runs this file> python3 test_spec_reference.py

Plain `mkmodel --arch qwen3|llama|qwen2` and `generate` without --draft go to the real binary.
`mkmodel --arch dflash|dspark --target T --out D [--layers N] [--block-size B] [--markov-rank R]
[--seed S]` writes a drafter with ref_spec's writer; `generate --draft D [--trace FILE]
[--spec-confidence-threshold X] [--num-spec-tokens N]` runs ref_spec.spec_generate.
FAKE_BUG=ctx (wrong context rows after accepted drafts) or FAKE_BUG=budget (verifies past the
budget) injects a bug.
"""

import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import ref_model as rm  # noqa: E402
import ref_spec as rs  # noqa: E402

REAL = os.environ.get("GS_REAL_BIN", "")


def opts(argv):
    o, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                o[a] = argv[i + 1]
                i += 2
                continue
            o[a] = True
        i += 1
    return o


def main():
    argv = sys.argv[1:]
    if not argv:
        return 2
    cmd, rest = argv[0], argv[1:]
    o = opts(rest)
    if cmd == "generate" and "--help" in rest:
        os.system("%s generate --help" % REAL)
        print("  --draft DIR            DFlash / DSpark drafter checkpoint\n"
              "  --trace FILE           JSONL trace of speculative steps\n"
              "  --spec-confidence-threshold X   DSpark confidence cut (0 = never)\n"
              "  --num-spec-tokens N    drafts verified per step at most")
        return 0
    if cmd == "mkmodel" and o.get("--arch") in ("dflash", "dspark"):
        kind = o["--arch"]
        tdir = o["--target"]
        tcfg = json.load(open(os.path.join(tdir, "config.json")))
        layers = int(o.get("--layers", 1))
        L = int(tcfg["num_hidden_layers"])
        kw = dict(layers=layers, block_size=int(o.get("--block-size", 8 if kind == "dflash" else 7)))
        if L >= 5:
            kw["target_layer_ids"] = [min(x, L - 2) for x in rs.default_target_layer_ids(L, layers)]
        if kind == "dspark":
            r = int(o.get("--markov-rank", 16))
            kw.update(markov_rank=r, enable_conf=True, conf_markov=r > 0)
        rs.write_random_drafter(o["--out"], kind, tdir, seed=int(o.get("--seed", 0)), **kw)
        return 0
    if cmd == "generate" and "--draft" in o:
        target = rm.RefModel(o["--model"])
        drafter = rs.Drafter(o["--draft"], target)
        prompt = [int(x) for x in o["--prompt-ids"].split(",")]
        mt = int(o.get("--max-tokens", 16))
        stop = () if "--ignore-eos" in o else (target.cfg.raw.get("eos_token_id"),)
        bug = os.environ.get("FAKE_BUG", "")
        if bug == "ctx":
            orig = drafter.add_context

            def bad(feats, positions):
                positions = list(positions)
                if len(positions) > 1 and drafter.ctx_len() > 0:
                    feats = np.repeat(feats[:1], len(positions), axis=0)
                orig(feats, positions)
            drafter.add_context = bad
        if bug == "budget":
            mt_run = mt + 3
        else:
            mt_run = mt
        res = rs.spec_generate(target, drafter, prompt, mt_run, stop,
                               float(o.get("--spec-confidence-threshold", 0.0)),
                               int(o["--num-spec-tokens"]) if "--num-spec-tokens" in o else None)
        if bug == "budget":
            res["tokens"] = res["tokens"][:mt]
        if "--trace" in o:
            with open(o["--trace"], "w") as f:
                for st in res["trace"]:
                    f.write(json.dumps(st) + "\n")
        print(json.dumps({"token_ids": res["tokens"], "logprobs": [0.0] * len(res["tokens"]),
                          "finish_reason": res["finish_reason"],
                          "acceptance_lengths": res["acceptance_lengths"]}))
        return 0
    os.execv(REAL, [REAL] + argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
