"""Train the default target: a ~11M-parameter Qwen3 (hidden 384, 6 layers, 6 heads, 2 KV heads,
head_dim 64, intermediate 1024, vocab 4096, tied embeddings) from scratch on the training split of
data.py's corpus, on the CPU, with fixed seeds. Writes a Hugging Face Qwen3 checkpoint (bf16) with
the tokenizer beside it, and the training log (train_log.json).

    python3 scripts/train/train_target.py --data work/ --out artifacts/default/target
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gs_torch import Geo, Target, finish_log, save_checkpoint, target_config  # noqa: E402

GEO = dict(hidden=384, inter=1024, layers=6, heads=6, kv_heads=2, head_dim=64, vocab=4096)


def encode_file(tok, path):
    text = open(path, encoding="utf-8").read()
    docs = text.split("<|endoftext|>")
    eot = tok.token_to_id("<|endoftext|>")
    out = []
    for d in docs:
        out.extend(tok.encode(d).ids)
        out.append(eot)
    return torch.tensor(out, dtype=torch.long)


@torch.no_grad()
def eval_loss(model, data, seq, max_windows=64):
    """Mean next-token loss over non-overlapping windows of data (fp32)."""
    n = min(max_windows, (len(data) - 1) // seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, 8):
        b = torch.stack([data[j * seq: j * seq + seq + 1] for j in range(i, min(n, i + 8))])
        _, lg, _ = model(b[:, :-1])
        tot += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), b[:, 1:].reshape(-1), reduction="sum").item()
        cnt += b[:, 1:].numel()
    return tot / cnt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder written by data.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    from tokenizers import Tokenizer

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    tok = Tokenizer.from_file(os.path.join(a.data, "tokenizer", "tokenizer.json"))
    train = encode_file(tok, os.path.join(a.data, "train.txt"))
    held = encode_file(tok, os.path.join(a.data, "heldout.txt"))
    print(f"train {len(train)} tokens, held out {len(held)} tokens", flush=True)
    g = Geo(**GEO)
    model = Target(g, tie=True)
    nparam = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)
    warm = 50
    log = {"params": nparam, "geometry": GEO, "args": vars(a), "train_tokens": len(train),
           "heldout_tokens": len(held), "steps": [], "evals": []}
    t0 = time.time()
    for step in range(a.steps + 1):
        if step % 100 == 0 or step == a.steps:
            model.eval()
            hl = eval_loss(model, held, a.seq)
            log["evals"].append({"step": step, "heldout_loss": hl, "heldout_ppl": math.exp(hl),
                                 "seconds": time.time() - t0})
            print(f"step {step}: held-out loss {hl:.3f} ppl {math.exp(hl):.1f} ({time.time() - t0:.0f} s)", flush=True)
            model.train()
        if step == a.steps:
            break
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, len(train) - a.seq - 1, (a.batch,), generator=gen)
        b = torch.stack([train[s: s + a.seq + 1] for s in starts])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, lg, _ = model(b[:, :-1])
        loss = F.cross_entropy(lg.float().reshape(-1, g.vocab), b[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        log["steps"].append({"step": step, "loss": loss.item(), "lr": lr})
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e}", flush=True)
    eot = tok.token_to_id("<|endoftext|>")
    save_checkpoint(a.out, model.names(), target_config(g, True, eot, eot))
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": eot, "eos_token_id": eot, "do_sample": False}, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.data, "tokenizer", fn), os.path.join(a.out, fn))
    finish_log(a.out, log, t0, nparam)


if __name__ == "__main__":
    main()
