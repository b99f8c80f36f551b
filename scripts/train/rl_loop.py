"""The RL loop graphswap exists for, as a runnable demo on the CPU:

  a hot server serves the default pair (target + DFlash b8) while clients keep sending generation
  requests; a trainer fine-tunes the TARGET for K steps on shifted data (one corpus category), then,
  separately, the DRAFTER for K steps on the updated target's own greedy rollouts (taken from the
  hot server, as an RL trainer takes its samples); after every optimizer step it pushes the new
  weights over HTTP with the Python client (tensor order shuffled, small buckets so the parts of a
  fused weight - q/k/v, gate/up - land in different buckets); after every push `graphswap eval --url`
  measures tau on the hot server, and the same eval on a server cold-started from the same weights
  (written to disk) must give the identical tau and identical outputs.

  --negative-control: the hot server's drafter config sets the TEST-ONLY graphswap_test_skip_hook
  (its post-load hook does not refill the derived context K/V weights): drafter pushes then leave
  stale derived buffers, and hot tau must differ from the cold start's.

    python3 scripts/train/rl_loop.py --graphswap build/graphswap --out bench/results/rl-loop [--steps 10]
Needs torch, tokenizers, safetensors (scripts/train/build_default.sh makes the venv).
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from graphswap_client import GraphswapClient  # noqa: E402
from gs_torch import Drafter, Geo, Target, load_into, save_checkpoint  # noqa: E402
from train_drafter import block_logits  # noqa: E402
from train_target import GEO, encode_file  # noqa: E402

ART = os.path.join(ROOT, "artifacts", "default")


class Server:
    def __init__(self, gs, model, draft, log):
        self.p = subprocess.Popen([gs, "serve", "--model", model, "--draft", draft, "--port", "0"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        for line in self.p.stderr:
            log.write(line)
            m = re.search(r"on http://\S+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            raise SystemExit("server did not start: see the log")
        threading.Thread(target=lambda: [log.write(x) for x in self.p.stderr], daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.port

    def stop(self):
        self.p.terminate()
        self.p.wait(60)


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def greedy_outputs(url, prompts, n):
    """Token ids of greedy completions (the identity check next to eval's tau)."""
    return [post(url, "/v1/completions", {"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                                         "return_token_ids": True})["choices"][0]["token_ids"] for p in prompts]


def run_eval(gs, url, prompts_file, out, max_tokens):
    subprocess.run([gs, "eval", "--url", url, "--prompts", prompts_file, "--max-tokens", str(max_tokens),
                    "--temperature", "0", "--concurrency", "2", "--no-baseline", "--out", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.load(open(os.path.join(out, "eval.json")))


def load_pair():
    T = Target(Geo(**GEO), tie=True)
    load_into(T.names(), os.path.join(ART, "target", "model.safetensors"))
    cfg = json.load(open(os.path.join(ART, "dflash-b8", "config.json")))
    D = Drafter(Geo(**{**GEO, "layers": cfg["num_hidden_layers"]}), "dflash", cfg["block_size"],
                cfg["dflash_config"]["target_layer_ids"], cfg["dflash_config"]["mask_token_id"])
    load_into(D.names(), os.path.join(ART, "dflash-b8", "model.safetensors"))
    return T, D, cfg


def shuffled(names_map, rng):
    items = [(n, p.detach().to(torch.bfloat16)) for n, p in names_map.items()]
    rng.shuffle(items)
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphswap", default=os.path.join(ROOT, "build", "graphswap"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10, help="target optimizer steps (each one push)")
    ap.add_argument("--draft-steps", type=int, default=None, help="drafter optimizer steps (default: --steps)")
    ap.add_argument("--category", default="c-api", help="training-corpus category the target is tuned on")
    ap.add_argument("--prompts", type=int, default=2, help="held-out prompts per category for eval")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--negative-control", action="store_true")
    ap.add_argument("--seed", type=int, default=99)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "servers.log"), "w")
    tmp = tempfile.mkdtemp(prefix="gs-rl-")
    # eval prompts: the first `prompts` held-out prompts of every category
    seen, sub = {}, []
    for line in open(os.path.join(ROOT, "eval", "prompts", "heldout.jsonl")):
        p = json.loads(line)
        if seen.get(p["category"], 0) < a.prompts:
            seen[p["category"]] = seen.get(p["category"], 0) + 1
            sub.append(p)
    pfile = os.path.join(a.out, "prompts.jsonl")
    with open(pfile, "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in sub)
    texts = [p["prompt"] for p in sub]

    T, D, dcfg = load_pair()
    tok = Tokenizer.from_file(os.path.join(ART, "target", "tokenizer.json"))
    # shifted data: one category of the training corpus (python3.11-doc sources)
    import data as corpus
    docs = [t for rel, cat, t in corpus.documents() if cat == a.category]
    shift = torch.tensor([i for d in docs for i in tok.encode(d).ids], dtype=torch.long)
    hot_draft = os.path.join(ART, "dflash-b8")
    if a.negative_control:  # same weights, TEST-ONLY config switch
        hot_draft = os.path.join(tmp, "draft-skip-hook")
        shutil.copytree(os.path.join(ART, "dflash-b8"), hot_draft)
        c = dict(dcfg, graphswap_test_skip_hook=True)
        json.dump(c, open(os.path.join(hot_draft, "config.json"), "w"))
    hot = Server(a.graphswap, os.path.join(ART, "target"), hot_draft, log)
    client = GraphswapClient(hot.url)

    stop, load = threading.Event(), {"ok": 0, "err": 0}

    def traffic():  # requests keep arriving while the trainer pushes
        i = 0
        while not stop.is_set():
            try:
                post(hot.url, "/v1/completions", {"prompt": texts[i % len(texts)], "max_tokens": 24,
                                                  "temperature": 0.8, "seed": i})
                load["ok"] += 1
            except Exception:  # noqa: BLE001 - counted, reported
                load["err"] += 1
            i += 1
    th = threading.Thread(target=traffic, daemon=True)
    th.start()

    topt = torch.optim.AdamW([p for p in T.parameters()], lr=a.lr, weight_decay=0.0)
    dparams = [p for p in D.parameters() if p.requires_grad]
    dopt = torch.optim.AdamW(dparams, lr=a.lr * 3, weight_decay=0.0)
    rows = []
    ev0 = run_eval(a.graphswap, hot.url, pfile, os.path.join(a.out, "step-0"), a.max_tokens)
    rows.append({"step": 0, "phase": "start", "tau_hot": ev0["overall"]["tau"], "tau_cold": None})
    print("start: tau %.4f" % ev0["overall"]["tau"], flush=True)
    for phase in ("target", "draft"):
        for k in range(1, (a.steps if phase == "target" or a.draft_steps is None else a.draft_steps) + 1):
            t0 = time.time()
            if phase == "target":
                s = torch.randint(0, len(shift) - 257, (8,))
                b = torch.stack([shift[i: i + 257] for i in s])
                _, lg, _ = T(b[:, :-1])
                loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), b[:, 1:].reshape(-1))
                loss.backward()
                topt.step()
                topt.zero_grad(set_to_none=True)
                client.update_weights(shuffled(T.names(), rng), bucket_bytes=256 << 10, model="target",
                                      version="target-%d" % k)
            else:  # rollouts of the updated target, from the hot server itself
                prompts = [shift[i: i + 32].tolist() for i in torch.randint(0, len(shift) - 33, (8,))]
                outs = [post(hot.url, "/v1/completions", {"prompt": p, "max_tokens": 96, "temperature": 0,
                                                         "ignore_eos": True, "return_token_ids": True})
                        ["choices"][0]["token_ids"] for p in prompts]
                ids = torch.tensor([p + o for p, o in zip(prompts, outs)])
                with torch.no_grad():
                    feats = T(ids, D.target_ids, logits=False)[2]
                starts = torch.stack([torch.randperm(ids.shape[1] - 32 - D.block)[:16] + 32 for _ in range(len(ids))])
                h = D(feats, ids, starts, T.embed_tokens.weight)
                lg, lab, _, _ = block_logits(D, "dflash", h, ids, starts, T.head_weight())
                w = torch.exp(-torch.arange(D.block - 1, dtype=torch.float32) / 4.0)
                loss = (F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1), reduction="none")
                        .view(lab.shape) * w).sum(-1).mean() / w.sum()
                loss.backward()
                dopt.step()
                dopt.zero_grad(set_to_none=True)
                client.update_weights(shuffled(D.names(), rng), bucket_bytes=256 << 10, model="draft",
                                      version="draft-%d" % k)
            t_push = time.time() - t0
            evh = run_eval(a.graphswap, hot.url, pfile, os.path.join(a.out, "%s-%d-hot" % (phase, k)), a.max_tokens)
            gh = greedy_outputs(hot.url, texts, a.max_tokens)
            # the same weights, cold
            ct, cd = os.path.join(tmp, "cold-target"), os.path.join(tmp, "cold-draft")
            save_checkpoint(ct, T.names(), json.load(open(os.path.join(ART, "target", "config.json"))))
            for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                shutil.copy(os.path.join(ART, "target", fn), ct)
            save_checkpoint(cd, D.names(), dcfg)
            cold = Server(a.graphswap, ct, cd, log)
            try:
                evc = run_eval(a.graphswap, cold.url, pfile, os.path.join(a.out, "%s-%d-cold" % (phase, k)),
                               a.max_tokens)
                gc = greedy_outputs(cold.url, texts, a.max_tokens)
            finally:
                cold.stop()
            r = {"step": k, "phase": phase, "loss": round(loss.item(), 4), "step_and_push_s": round(t_push, 2),
                 "tau_hot": evh["overall"]["tau"], "tau_cold": evc["overall"]["tau"],
                 "outputs_equal": gh == gc}
            rows.append(r)
            print(json.dumps(r), flush=True)
    stop.set()
    th.join(60)
    hot.stop()
    same = all(r["tau_hot"] == r["tau_cold"] and r["outputs_equal"] for r in rows[1:])
    res = {"negative_control": a.negative_control, "steps": a.steps, "draft_steps": a.draft_steps, "category": a.category,
           "background_requests": load, "hot_equals_cold_every_step": same, "rows": rows}
    json.dump(res, open(os.path.join(a.out, "rl_loop.json"), "w"), indent=1)
    md = ["| phase | step | loss | tau hot | tau cold | outputs equal |", "|---|---|---|---|---|---|"]
    md += ["| %s | %d | %s | %.4f | %s | %s |" % (r["phase"], r["step"], r.get("loss", ""), r["tau_hot"],
                                                 "" if r["tau_cold"] is None else "%.4f" % r["tau_cold"],
                                                 r.get("outputs_equal", "")) for r in rows]
    open(os.path.join(a.out, "rl_loop.md"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))
    print("background requests: %(ok)d ok, %(err)d failed" % load)
    print("hot == cold after every push:", same)
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if same != a.negative_control else 1)


if __name__ == "__main__":
    main()
