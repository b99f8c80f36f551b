"""Independent checks of the trained default pair (run by build_default.sh after training):

1. target: the PyTorch model that trained it and graphswap (bf16 weights, CPU) agree: 16 greedy
   tokens equal, logprobs within 1e-3 nats;
2. drafters: the PyTorch drafter that trained them and the float64 numpy reference of
   tests/reference/ref_spec.py (which the graphswap drafters are tested against) give the same
   block hidden states (max abs difference < 1e-3);
3. serving: graphswap generate --draft on the bundled held-out prompts at temperature 0 gives
   mean acceptance length tau (tokens per speculative step) and is lossless.

    python3 scripts/train/check_parity.py artifacts/default [build/graphswap] [eval/prompts/heldout.jsonl]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))
import ref_model as rm  # noqa: E402
import ref_spec as rs  # noqa: E402
from gs_torch import Drafter, Geo, Target, load_into  # noqa: E402
from train_target import GEO  # noqa: E402


def run_gs(gs, *args):
    return subprocess.run([gs, *args], check=True, capture_output=True, text=True).stdout


def main():
    root = sys.argv[1]
    gs = sys.argv[2] if len(sys.argv) > 2 else "build/graphswap"
    prompts = sys.argv[3] if len(sys.argv) > 3 else "eval/prompts/heldout.jsonl"
    tdir = os.path.join(root, "target")
    T = Target(Geo(**GEO))
    load_into(T.names(), os.path.join(tdir, "model.safetensors"))
    prompt = [626, 643, 663, 12, 99, 1000]
    out = json.loads(run_gs(gs, "generate", "--model", tdir, "--prompt-ids", ",".join(map(str, prompt)),
                            "--max-tokens", "16", "--ignore-eos"))
    with torch.no_grad():
        _, lg, _ = T(torch.tensor([prompt + out["token_ids"]]))
    lp = torch.log_softmax(lg[0].double(), -1)
    n = len(prompt)
    am = [int(lg[0, n - 1 + i].argmax()) for i in range(16)]
    dlp = max(abs(lp[n - 1 + i, t].item() - out["logprobs"][i]) for i, t in enumerate(out["token_ids"]))
    print(f"target: greedy equal {am == out['token_ids']}, max |logprob diff| {dlp:.2e}")
    ok = am == out["token_ids"] and dlp < 1e-3

    # the held-out prompts, and plain decoding of them, once for both drafters
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    td = tempfile.mkdtemp(prefix="gs-parity-")
    batch = os.path.join(td, "b.jsonl")
    with open(batch, "w") as f:
        for line in open(prompts):
            f.write(json.dumps({"prompt_ids": tk.encode(json.loads(line)["prompt"]).ids, "max_tokens": 96}) + "\n")
    plain = [json.loads(l) for l in run_gs(gs, "generate", "--model", tdir, "--batch-file", batch).splitlines()]

    tgt = rm.RefModel(tdir)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 4000, 48).tolist()
    for k in ("dflash-b8", "dspark-b7"):
        ddir = os.path.join(root, k)
        cfg = json.load(open(os.path.join(ddir, "config.json")))
        kind = "dflash" if "dflash_config" in cfg else "dspark"
        tids = cfg["dflash_config"]["target_layer_ids"] if kind == "dflash" else cfg["target_layer_ids"]
        mask = cfg["dflash_config"]["mask_token_id"] if kind == "dflash" else cfg["mask_token_id"]
        D = Drafter(Geo(**{**GEO, "layers": cfg["num_hidden_layers"]}), kind, cfg["block_size"], tids, mask,
                    cfg.get("markov_rank", 0), kind == "dspark", target=T)
        load_into(D.names(), os.path.join(ddir, "model.safetensors"))
        dr = rs.Drafter(ddir, tgt)
        worst = 0.0
        for start in (20, 35, 40):
            hiddens = tgt.forward(ids[:start], return_hidden=True)[1]
            dr.reset()
            dr.add_context(rs.target_feats(tgt, ids[:start], hiddens, tids), list(range(start)))
            ref_h = dr.block_hidden(ids[start], start)
            with torch.no_grad():
                f = T(torch.tensor([ids]), tids, logits=False)[2]
                h = D(f, torch.tensor([ids]), torch.tensor([[start]]),
                      T.embed_tokens.weight if kind == "dflash" else D.embed_tokens)
            worst = max(worst, float(np.abs(h[0, 0].double().numpy() - ref_h).max()))
        print(f"{k}: max |block hidden - float64 reference| {worst:.2e}")
        ok = ok and worst < 1e-3

        spec = [json.loads(l) for l in run_gs(gs, "generate", "--model", tdir, "--draft", ddir,
                                               "--batch-file", batch).splitlines()]
        acc = [x for r in spec for x in r["acceptance_lengths"]]
        same = all(a["token_ids"] == b["token_ids"] for a, b in zip(plain, spec))
        print(f"{k}: serving tau {sum(acc) / len(acc):.2f} over {len(acc)} steps, lossless {same}")
        ok = ok and same
    shutil.rmtree(td, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
