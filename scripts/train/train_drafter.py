"""Train a DFlash (block 8) or DSpark (block 7, Markov head, confidence head) drafter for the default
target, on the CPU, with fixed seeds, the way z-lab's DFlash and DeepSpec's DSpark are trained:

  data      the target's own greedy continuations (graphswap generate, bf16, exactly what serving
            verifies against) of random training-corpus windows: the drafter learns to predict
            what the target will say, not what the corpus says;
  features  the frozen target's hidden states at target_layer_ids over each whole sequence;
  blocks    A random anchors per sequence inside the generated part; block a is
            [token at start_a, MASK * (B-1)] at positions start_a.., attending to the context rows
            < start_a and to its own block (non-causal), all anchors in one pass;
  loss      DFlash: cross-entropy of slot i (1..B-1) against the token at start+i, weighted
            exp(-(i-1)/gamma) (early slots matter most: a miss ends the accepted run);
            DSpark: slot k (0..B-1) against the token at start+k+1 through lm_head + Markov bias
            w2(w1[prev]) with prev the true previous token (teacher forcing), same weights; plus the
            confidence head, binary cross-entropy of sigmoid(proj([h_k ; w1[prev_k]])) against
            "the drafter's argmax at k is right", on slots whose earlier slots were all right
            (the conditional probability it is served as).

    python3 scripts/train/train_drafter.py --kind dflash --target artifacts/default/target \
        --data work/ --out artifacts/default/dflash-b8 --graphswap build/graphswap
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gs_torch import Drafter, Geo, Target, finish_log, load_into, save_checkpoint  # noqa: E402
from train_target import GEO, encode_file  # noqa: E402

TARGET_IDS = [0, 2, 4]


def greedy_data(gs, target, train, n, prompt_len, gen_len, seed, threads):
    """n sequences: a random corpus window of prompt_len tokens + the target's greedy continuation."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        s = rng.randrange(0, len(train) - prompt_len)
        prompts.append(train[s: s + prompt_len].tolist())
    with tempfile.TemporaryDirectory() as td:
        bf = os.path.join(td, "batch.jsonl")
        with open(bf, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_ids": p, "max_tokens": gen_len, "ignore_eos": True}) + "\n")
        out = subprocess.run([gs, "generate", "--model", target, "--batch-file", bf, "--threads", str(threads),
                              "--max-seqs", "64", "--kv-cache-mb", "1024"],
                             check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    assert len(rows) == n
    return torch.tensor([p + r["token_ids"] for p, r in zip(prompts, rows)], dtype=torch.long)


def drafter_config(kind, g, tgt_cfg, block, mask_id, markov_rank):
    c = {"architectures": ["DFlashDraftModel" if kind == "dflash" else "Qwen3DSparkModel"],
         "num_target_layers": tgt_cfg["num_hidden_layers"], "block_size": block}
    if kind == "dflash":
        c["dflash_config"] = {"mask_token_id": mask_id, "target_layer_ids": TARGET_IDS}
    else:
        c.update({"mask_token_id": mask_id, "target_layer_ids": TARGET_IDS, "num_anchors": 512,
                  "markov_rank": markov_rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
                  "confidence_head_with_markov": True})
    c.update({"model_type": "qwen3", "hidden_size": g.hidden, "intermediate_size": g.inter,
              "num_hidden_layers": g.layers, "num_attention_heads": g.heads, "num_key_value_heads": g.kv_heads,
              "head_dim": g.head_dim, "vocab_size": g.vocab, "max_position_embeddings": 2048,
              "rms_norm_eps": g.eps, "rope_theta": g.theta, "rope_scaling": None, "tie_word_embeddings": False,
              "bos_token_id": tgt_cfg["bos_token_id"], "eos_token_id": tgt_cfg["eos_token_id"],
              "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
              "layer_types": ["full_attention"] * g.layers, "attention_dropout": 0.0,
              "initializer_range": 0.02, "use_cache": True, "transformers_version": "4.51.0"})
    return c


def block_logits(d, kind, h, ids, starts, head_w):
    """Logits and labels of every block slot. h [N, A, B, H]. DFlash: slots 1..B-1 -> tokens at
    start+1..start+B-1. DSpark: slots 0..B-1 -> start+1..start+B, plus Markov bias and the prev ids."""
    B = d.block
    off = torch.arange(1, B + 1) if kind == "dspark" else torch.arange(1, B)
    lab = torch.gather(ids, 1, (starts[:, :, None] + off).flatten(1)).view(*starts.shape, len(off))
    hs = h if kind == "dspark" else h[:, :, 1:]
    lg = hs.float() @ head_w.float().T
    prev = None
    if kind == "dspark":
        prev = torch.cat([torch.gather(ids, 1, starts)[:, :, None], lab[:, :, :-1]], -1)
        if d.markov_rank:
            lg = lg + F.embedding(prev, d.markov_w1) @ d.markov_w2.T
    return lg, lab, hs, prev


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=["dflash", "dspark"], required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--graphswap", default="build/graphswap")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block", type=int, default=0, help="default 8 (dflash) / 7 (dspark)")
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=1536)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--gen-len", type=int, default=176)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    from tokenizers import Tokenizer

    kind = a.kind
    B = a.block or (8 if kind == "dflash" else 7)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    t0 = time.time()
    tgt_cfg = json.load(open(os.path.join(a.target, "config.json")))
    target = Target(Geo(**GEO), tie=True)
    load_into(target.names(), os.path.join(a.target, "model.safetensors"))
    for p in target.parameters():
        p.requires_grad_(False)
    tok = Tokenizer.from_file(os.path.join(a.target, "tokenizer.json"))
    mask_id = tok.token_to_id("<|mask|>")
    train = encode_file(tok, os.path.join(a.data, "train.txt"))
    seqs = greedy_data(a.graphswap, a.target, train, a.seqs, a.prompt_len, a.gen_len, a.seed, a.threads)
    print(f"{len(seqs)} greedy sequences of {seqs.shape[1]} tokens ({time.time() - t0:.0f} s)", flush=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        feats = torch.cat([target(seqs[i: i + 32], TARGET_IDS, logits=False)[2].to(torch.bfloat16)
                           for i in range(0, len(seqs), 32)])
    print(f"features {tuple(feats.shape)} ({time.time() - t0:.0f} s)", flush=True)
    n_val = 64
    g = Geo(**{**GEO, "layers": a.layers})
    d = Drafter(g, kind, B, TARGET_IDS, mask_id, a.markov_rank if kind == "dspark" else 0,
                conf_head=kind == "dspark", target=target)
    embed_w = target.embed_tokens.weight if kind == "dflash" else d.embed_tokens
    head_w = target.head_weight() if kind == "dflash" else d.lm_head
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    W = B if kind == "dspark" else B - 1
    wts = torch.exp(-torch.arange(W, dtype=torch.float32) / a.gamma)
    gen = torch.Generator().manual_seed(a.seed)
    lo, hi = a.prompt_len, seqs.shape[1] - B - (1 if kind == "dspark" else 0)

    def sample_starts(n):
        return torch.stack([torch.randperm(hi - lo, generator=gen)[: a.anchors] + lo for _ in range(n)])

    val_starts = sample_starts(n_val)
    log = {"kind": kind, "args": vars(a), "block_size": B, "target_layer_ids": TARGET_IDS, "steps": [], "evals": []}

    def evaluate(step):
        """Held-out sequences: per-slot accuracy and the expected acceptance length of greedy
        drafting (1 + sum over k of P(slots 0..k all right)) under teacher forcing."""
        d.eval()
        with torch.no_grad():
            ids, f = seqs[:n_val], feats[:n_val].float()
            h = d(f, ids, val_starts, embed_w)
            lg, lab, hs, prev = block_logits(d, kind, h, ids, val_starts, head_w)
            ok = (lg.argmax(-1) == lab).float()
            run = ok.cumprod(-1)
            tau = 1 + run.sum(-1).mean().item()
            e = {"step": step, "slot_accuracy": [round(x, 4) for x in ok.mean((0, 1)).tolist()], "tau_tf": tau,
                 "seconds": time.time() - t0}
        d.train()
        log["evals"].append(e)
        print(f"step {step}: teacher-forced tau {tau:.2f} slot acc {e['slot_accuracy']}", flush=True)

    for step in range(a.steps + 1):
        if step % 250 == 0 or step == a.steps:
            evaluate(step)
        if step == a.steps:
            break
        lr = a.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        rows = torch.randint(n_val, len(seqs), (a.batch,), generator=gen)
        ids, f = seqs[rows], feats[rows]
        starts = sample_starts(a.batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = d(f, ids, starts, embed_w)
        lg, lab, hs, prev = block_logits(d, kind, h, ids, starts, head_w)
        ce = F.cross_entropy(lg.reshape(-1, g.vocab), lab.reshape(-1), reduction="none").view(lab.shape)
        loss = (ce * wts).sum(-1).mean() / wts.sum()
        if kind == "dspark":
            right = (lg.argmax(-1) == lab).float()
            live = torch.cat([torch.ones_like(right[..., :1]), right[..., :-1].cumprod(-1)], -1)
            z = d.conf_proj(torch.cat([hs.float().detach(), F.embedding(prev, d.markov_w1).detach()], -1))[..., 0]
            bce = F.binary_cross_entropy_with_logits(z, right, reduction="none")
            loss = loss + (bce * live).sum() / live.sum().clamp(min=1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        log["steps"].append({"step": step, "loss": loss.item(), "lr": lr})
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    save_checkpoint(a.out, d.names(), drafter_config(kind, g, tgt_cfg, B, mask_id, a.markov_rank))
    finish_log(a.out, log, t0, sum(p.numel() for p in d.parameters()))


if __name__ == "__main__":
    main()
