#!/usr/bin/env python3
"""Accuracy of online FP8 (`serve --quantization fp8`) on the default pair, against bf16.

Standard library only. Starts its own graphswap servers on loopback (port 0: each picks a free
port; logs in OUT/logs/) and measures, bf16 target vs the same target quantized online:

  1. greedy agreement: the bundled held-out prompts (eval/prompts/heldout.jsonl), N greedy tokens
     from each server (ignore_eos, so every completion has exactly N tokens); the share of prompts
     whose completions are identical, the mean first-divergence index / N, and the share of
     positions whose tokens are equal (position by position, over all N);
  2. held-out perplexity: teacher-forced prompt logprobs (vLLM's `prompt_logprobs`) over the
     held-out split of scripts/train/data.py, tokenized and windowed as train_target.py's
     eval_loss does (every document + <|endoftext|>, non-overlapping windows of --seq tokens, each
     window scored from its own start); reported over the first 64 windows (the protocol behind
     TRAINING.md's 17.62) and over every window. The top-1 id of each position also gives a
     teacher-forced argmax agreement;
  3. tau before / after for each drafter: `graphswap eval --url` on a bf16 server with the drafter
     and on an FP8 server with it (the drafter kept bf16, `--draft-quantization none`, and the
     drafter quantized online too), temperature 0, the plain run sent (--baseline-url) to a server
     of the same precision without a drafter, so `lossless` is speculative FP8 vs plain FP8.

Writes OUT/results.json and OUT/results.md.

    python3 bench/fp8_accuracy.py --out bench/results/2026-12-07-fp8-accuracy
"""
import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRAFTERS = ("dflash-b8", "dspark-b7")
# train_target.py's eval_loss: 64 windows of its --seq 256; TRAINING.md's figure is this protocol
TRAIN_EVAL_WINDOWS = 64


def log(msg):
    print(f"[fp8_accuracy {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Server:
    """One `graphswap serve` on a free loopback port."""

    def __init__(self, binary, model, name, logdir, threads, draft=None, fp8_block=None, draft_fp8=False):
        self.name = name
        self.cmd = [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                    "--threads", str(threads), "--log-interval", "0"]
        if draft:
            self.cmd += ["--draft", draft]
        if fp8_block:
            self.cmd += ["--quantization", "fp8", "--quantization-block", fp8_block]
            if draft and not draft_fp8:  # online FP8 reaches the drafter unless told otherwise
                self.cmd += ["--draft-quantization", "none"]
        self.logpath = os.path.join(logdir, f"{name}.log")
        self.proc = None
        self.url = None
        self.startup = {}

    def __enter__(self):
        self.logf = open(self.logpath, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited {self.proc.returncode} at start "
                                   f"({' '.join(self.cmd)}):\n{open(self.logpath).read()}")
            text = open(self.logpath).read()
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", text)
            if m and self.url is None:
                self.url = f"http://127.0.0.1:{m.group(1)}"
            if self.url:
                try:
                    with urllib.request.urlopen(self.url + "/health?ready=1", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError):
                    pass
            time.sleep(0.2)
        else:
            self.__exit__(None, None, None)
            raise RuntimeError(f"{self.name}: not ready within 120 s (log {self.logpath})")
        text = open(self.logpath).read()
        for key in ("dtype", "weight_bytes", "params", "draft_arch", "draft_params"):
            m = re.search(rf"\b{key}=(\S+)", text)
            if m:
                self.startup[key] = m.group(1)
        log(f"{self.name}: {self.url} ({' '.join(self.cmd[1:])})")
        return self

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()

    def post(self, path, body, timeout=600):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.name} {path}: HTTP {e.code}: {e.read().decode(errors='replace')}")


def chunks(xs, n):
    return [xs[i:i + n] for i in range(0, len(xs), n)]


def heldout_ids(srv, sources, eot):
    """Token ids of the held-out split exactly as train_target.py's encode_file builds them:
    data.py joins the held-out documents with <|endoftext|>, encode_file splits on it again and
    appends the id after every document (the last one too)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts", "train"))
    import data  # the repository's own split code, so the split is the training's by construction

    docs = list(data.documents(sources))
    held_paths = data.held_out_set(docs)
    held = [(rel, t) for rel, _, t in docs if rel in held_paths]
    ids, starts = [], []
    texts = data.SEP.join(t for _, t in held).split(data.SEP)
    assert len(texts) == len(held), "a held-out document contains <|endoftext|>"
    for (rel, _), d in zip(held, texts):
        starts.append((rel, len(ids)))
        ids += srv.post("/tokenize", {"prompt": d})["tokens"] + [eot]
    return ids, {"doc_starts": starts, "source": "held-out split of scripts/train/data.py", "sources": sources,
                 "documents": len(held), "documents_total": len(docs),
                 "chars": sum(len(t) for _, t in held), "categories": sorted({r.split("/")[0] for r in held_paths})}


def score_windows(srv, windows, batch):
    """Per window: the logprob of each target token (positions 1..seq) and the model's top-1 id."""
    out = []
    for group in chunks(windows, batch):
        r = srv.post("/v1/completions", {"prompt": group, "max_tokens": 1, "temperature": 0,
                                         "prompt_logprobs": 1})
        for ch, w in zip(sorted(r["choices"], key=lambda c: c["index"]), group):
            lps, top = [], []
            for tok, pos in zip(w[1:], ch["prompt_logprobs"][1:]):
                lps.append(pos[str(tok)]["logprob"])
                top.append(int(next(k for k, v in pos.items() if v["rank"] == 1)))
            out.append((lps, top))
    return out


def ppl_stats(scored, n_windows):
    lps = [lp for s in scored[:n_windows] for lp in s[0]]
    nll = -sum(lps) / len(lps)
    return {"windows": min(n_windows, len(scored)), "tokens": len(lps), "loss": nll, "ppl": math.exp(nll)}


def greedy(srv, prompts, n, batch):
    out = []
    for group in chunks(prompts, batch):
        r = srv.post("/v1/completions", {"prompt": group, "max_tokens": n, "temperature": 0,
                                         "ignore_eos": True, "return_token_ids": True})
        out += [c["token_ids"] for c in sorted(r["choices"], key=lambda c: c["index"])]
    return out


def agreement(a_runs, b_runs, n):
    first_div, same_pos, identical = [], 0, 0
    for a, b in zip(a_runs, b_runs):
        assert len(a) == len(b) == n, (len(a), len(b), n)
        d = next((i for i in range(n) if a[i] != b[i]), n)
        first_div.append(d)
        identical += d == n
        same_pos += sum(x == y for x, y in zip(a, b))
    k = len(a_runs)
    return {"prompts": k, "tokens_per_prompt": n, "identical_prompts": identical,
            "identical_fraction": identical / k,
            "mean_first_divergence_fraction": sum(first_div) / (k * n),
            "token_agreement": same_pos / (k * n),
            "first_divergence": first_div}


def run_eval(binary, url, baseline_url, out, a):
    cmd = [binary, "eval", "--url", url, "--baseline-url", baseline_url, "--temperature", "0",
           "--max-tokens", str(a.tokens), "--prompts", a.prompts, "--out", out]
    if a.limit:
        cmd += ["--limit", str(a.limit)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(out, "eval.stderr"), "w") as f:
        f.write(p.stderr)
    if p.returncode not in (0, 1):  # 1 = the lossless check failed: a result, not an error
        raise RuntimeError(f"eval exited {p.returncode}: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    ev = json.load(open(os.path.join(out, "eval.json")))
    o = ev["overall"]
    return {"command": " ".join(cmd), "exit": p.returncode, "seconds": time.time() - t0,
            "prompts": o["prompts"], "completion_tokens": o["completion_tokens"], "tau": o["tau"],
            "accept_rate_per_position": o["accept_rate_per_position"], "lossless": o["lossless"],
            "mismatches": o.get("mismatches", []),
            "spec_tok_s": o["spec_tok_s"], "plain_tok_s": o["plain_tok_s"], "speedup": o["speedup"]}


def eval_selection(prompt_file, limit):
    """Indices (in the prompt file) of the prompts eval runs, in its order: file order, the first
    `limit` of each category."""
    seen, out = {}, []
    for i, l in enumerate(x for x in open(prompt_file) if x.strip()):
        cat = json.loads(l).get("category", "default")
        seen[cat] = seen.get(cat, 0) + 1
        if not limit or seen[cat] <= limit:
            out.append((i, cat))
    return out


def cross_check(out, greedy_runs, selection):
    """Eval's plain run (batch 1, stops at eos) must be a prefix of this script's batched greedy
    run of the same precision: it checks that batching does not change a greedy token, so the
    agreement figures and eval's losslessness speak of the same decoding."""
    reqs = [json.loads(l) for l in open(os.path.join(out, "eval-requests.jsonl"))]
    bad = []
    for r in reqs:
        i, cat = selection[r["prompt"]]
        assert cat == r["category"], (cat, r["category"])
        plain = r["plain"]["token_ids"]
        if plain != greedy_runs[i][:len(plain)]:
            bad.append(i)
    return {"requests": len(reqs), "plain_is_prefix_of_batched_greedy": not bad, "differing_prompts": bad}


def matched_tau(out16, out8):
    """tau over only the prompts whose plain completions are the same text in both precisions:
    elsewhere the two runs draft different continuations, so their tau differ by the text as
    much as by the target's precision."""
    R = [[json.loads(l) for l in open(os.path.join(o, "eval-requests.jsonl"))] for o in (out16, out8)]
    same = [i for i, (x, y) in enumerate(zip(*R)) if x["plain"]["token_ids"] == y["plain"]["token_ids"]]
    tau = []
    for reqs in R:
        steps = sum(reqs[i]["spec"]["steps"] for i in same)
        tau.append(1 + sum(reqs[i]["spec"]["accepted_tokens"] for i in same) / steps if steps else None)
    return {"prompts": len(same), "of": len(R[0]), "bf16": tau[0], "fp8": tau[1]}


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags"))
    except (OSError, StopIteration):
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if re.search(rf"\b{f}\b", flags)]
    return {"cpu": cpu, "cpus": os.cpu_count(), "isa": isa, "system": platform.platform()}


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def fmt(x, d=4):
    return "-" if x is None else f"{x:.{d}f}"


def write_md(res, path):
    a, p, g = res["args"], res["perplexity"], res["greedy_agreement"]
    L = [f"# Online FP8 vs bf16 on the default pair ({res['date']})", "",
         f"Machine: {res['machine']['cpu']}, {res['machine']['cpus']} CPUs ({', '.join(res['machine']['isa'])}), "
         f"CPU backend, {a['threads']} engine threads; shared with other builds. "
         f"Commit: {res['commit']['describe']} ({res['commit']['head']}).", "",
         f"FP8: `serve --quantization fp8 --quantization-block {a['block']}` (online, from the bf16 checkpoint; "
         f"W8A16, activations f32). Target weight bytes: bf16 {res['servers']['bf16']['weight_bytes']}, "
         f"FP8 {res['servers']['fp8']['weight_bytes']}.", "",
         "Reproduce: `" + res["command"] + "`", "",
         f"Total run time: {res['seconds']:.0f} s.", "",
         "## Greedy agreement", "",
         f"{g['prompts']} held-out prompts ({os.path.relpath(a['prompts'], ROOT)}), {g['tokens_per_prompt']} greedy tokens each "
         "(ignore_eos, so every completion is full length), plain decoding on a server without a drafter.", "",
         "| identical completions | mean first divergence / N | token agreement (position by position) |",
         "|---|---|---|",
         f"| {g['identical_prompts']}/{g['prompts']} ({g['identical_fraction']:.3f}) | "
         f"{g['mean_first_divergence_fraction']:.4f} | {g['token_agreement']:.4f} |", "",
         "Free-running greedy texts diverge after the first flipped argmax (each continues its own text), so a "
         f"per-position argmax agreement of {100 * res['perplexity']['all']['top1_agreement']:.1f}% (teacher-forced, "
         f"below) still leaves {g['prompts'] - g['identical_prompts']} of the {g['prompts']} "
         f"{g['tokens_per_prompt']}-token completions different.", ""]
    L += ["## Held-out perplexity", "",
          f"Text: {p['data']['source']} ({p['data']['documents']} of {p['data']['documents_total']} documents, "
          f"{p['data']['chars']} characters, {p['heldout_tokens']} tokens with one <|endoftext|> per document). "
          f"Non-overlapping windows of {a['seq']} + 1 tokens from the start of the split, each scored from its own "
          f"start with no bos (train_target.py's eval_loss), {a['seq']} predicted tokens per window; "
          "teacher-forced `prompt_logprobs` (raw logprobs).", "",
          "| windows | tokens scored | ppl bf16 | ppl FP8 | relative change | loss bf16 | loss FP8 | teacher-forced top-1 agreement |",
          "|---|---|---|---|---|---|---|---|"]
    for key, label in (("train_protocol", f"first {TRAIN_EVAL_WINDOWS} (TRAINING.md's protocol)"), ("all", "all")):
        r = p.get(key)
        if r:
            L.append(f"| {label}: {r['bf16']['windows']} | {r['bf16']['tokens']} | {r['bf16']['ppl']:.4f} | "
                     f"{r['fp8']['ppl']:.4f} | {100 * r['relative_change']:+.3f}% | {r['bf16']['loss']:.5f} | "
                     f"{r['fp8']['loss']:.5f} | {r['top1_agreement']:.4f} |")
    L += ["", p["vs_training_md"], ""]
    if res.get("tau"):
        L += ["## Drafters: tau before / after", "",
              f"`graphswap eval --url` (temperature 0, {a['tokens']} tokens, the bundled held-out prompts"
              + (f", --limit {a['limit']} per category" if a['limit'] else "")
              + ") on a server of the target with the drafter; the plain run goes (--baseline-url) to a server "
              "of the same precision without a drafter, so FP8's `lossless` compares speculative FP8 with plain FP8 "
              "decoding. Rows `fp8` keep the drafter bf16 (`--draft-quantization none`); rows `fp8d` quantize the "
              "drafter too (online FP8 of its layers and fc; its stacked context K/V derived from the FP8 "
              "projections).", "",
              "Speedup and tok/s are not reported: this 2-core machine is shared with other builds, so its "
              "timings are not meaningful (they are in results.json and the eval folders, for completeness only).", "",
              "Where the greedy texts diverge the two runs draft different continuations, so the overall tau "
              "compares different texts; the same-text rows take only the prompts whose plain completions are "
              "identical in both precisions, where the tau change is the target's precision alone.", "",
              "| drafter | target (drafter) | prompts | tokens | tau | lossless | acceptance per position |",
              "|---|---|---|---|---|---|---|"]
        for d, t in res["tau"].items():
            for prec in [p for p in ("bf16", "fp8", "fp8d") if p in t]:
                e = t[prec]
                L.append(f"| {d} | {prec[:4]} ({e.get('drafter', 'bf16')}) | {e['prompts']} | {e['completion_tokens']} | {e['tau']:.4f} | "
                         f"{'yes' if e['lossless'] else '**no**' if e['lossless'] is False else '-'} | "
                         + ", ".join(f"{x:.3f}" for x in e["accept_rate_per_position"]) + " |")
            for prec in [p for p in ("fp8", "fp8d") if p in t]:
                L.append(f"| {d} | change, {prec[:4]} ({t[prec].get('drafter', 'bf16')}) vs bf16 | | | "
                         f"{t[prec]['tau'] - t['bf16']['tau']:+.4f} "
                         f"({100 * (t[prec]['tau'] / t['bf16']['tau'] - 1):+.2f}%) | | |")
            m = t["matched"]
            if m["prompts"]:
                L.append(f"| {d} | same-text prompts only ({m['prompts']}/{m['of']}): bf16 / FP8 | | | "
                         f"{m['bf16']:.4f} / {m['fp8']:.4f} ({100 * (m['fp8'] / m['bf16'] - 1):+.2f}%) | | |")
        cc = [t[p]["cross_check"]["plain_is_prefix_of_batched_greedy"] for t in res["tau"].values()
              for p in ("bf16", "fp8", "fp8d") if p in t]
        L += ["", "Cross-check: in every eval run, each plain completion (batch 1, stopped at eos) "
              + ("is" if all(cc) else "is **not** always")
              + " a prefix of the same precision's batched greedy completion above, so the greedy agreement and "
              "eval's lossless check describe the same decoding."]
        L += ["", "Eval folders: " + ", ".join(f"`eval/{d}-{prec}/`" for d in res["tau"]
                                              for prec in ("bf16", "fp8", "fp8d") if prec in res["tau"][d]), ""]
    L += ["## Servers", ""] + [f"- {k}: `{v['command']}`" for k, v in res["servers"].items()] + [""]
    with open(path, "w") as f:
        f.write("\n".join(L))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "graphswap"))
    ap.add_argument("--pair", default=os.path.join(ROOT, "artifacts", "default"),
                    help="folder with target/ and the drafters (default artifacts/default)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", default=os.path.join(ROOT, "eval", "prompts", "heldout.jsonl"))
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens per prompt (agreement and eval)")
    ap.add_argument("--block", default="128,128", help="--quantization-block ROWS,COLS")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256, help="perplexity window (train_target.py's --seq)")
    ap.add_argument("--ppl-windows", type=int, default=0, help="windows scored (0 = every window of the split)")
    ap.add_argument("--sources", default="/usr/share/doc/python3.11/html/_sources",
                    help="the corpus data.py reads (Debian's python3.11-doc)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per request (the CPU backend is batch-invariant)")
    ap.add_argument("--limit", type=int, default=0, help="eval --limit (prompts per category; 0 = all)")
    ap.add_argument("--no-tau", action="store_true", help="skip the drafter evals")
    a = ap.parse_args()
    a.binary, a.pair, a.prompts = (os.path.abspath(x) for x in (a.binary, a.pair, a.prompts))
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    t_start = time.time()
    target = os.path.join(a.pair, "target")
    eot = json.load(open(os.path.join(target, "generation_config.json")))["eos_token_id"]
    prompts = [json.loads(l)["prompt"] for l in open(a.prompts) if l.strip()]
    logs = os.path.join(a.out, "logs")
    res = {"date": time.strftime("%Y-%m-%d"), "machine": machine(),
           "commit": {"describe": git("describe", "--always", "--dirty"), "head": git("rev-parse", "HEAD")},
           "command": "python3 " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
           "args": {k: v for k, v in vars(a).items()}, "servers": {}}

    with Server(a.binary, target, "bf16", logs, a.threads) as s16, \
         Server(a.binary, target, "fp8", logs, a.threads, fp8_block=a.block) as s8:
        for s in (s16, s8):
            res["servers"][s.name] = {"command": " ".join(s.cmd), **s.startup}

        log(f"greedy: {len(prompts)} prompts x {a.tokens} tokens")
        g16, g8 = greedy(s16, prompts, a.tokens, a.batch), greedy(s8, prompts, a.tokens, a.batch)
        res["greedy_agreement"] = agreement(g16, g8, a.tokens)
        log(f"greedy agreement: {res['greedy_agreement']['identical_prompts']}/{len(prompts)} identical, "
            f"token agreement {res['greedy_agreement']['token_agreement']:.4f}")

        if os.path.isdir(a.sources):
            ids, info = heldout_ids(s16, a.sources, eot)
        else:
            # no corpus here: the bundled prompts are held-out text too (cut from held-out documents)
            ids = []
            for p in prompts:
                ids += s16.post("/tokenize", {"prompt": p})["tokens"] + [eot]
            info = {"source": f"fallback: the bundled held-out prompts ({a.prompts}), {a.sources} missing",
                    "documents": len(prompts), "documents_total": len(prompts), "chars": sum(map(len, prompts)),
                    "doc_starts": []}
        n = (len(ids) - 1) // a.seq
        if a.ppl_windows:
            n = min(n, a.ppl_windows)
        windows = [ids[j * a.seq: j * a.seq + a.seq + 1] for j in range(n)]
        log(f"perplexity: {len(ids)} held-out tokens, {n} windows of {a.seq}")
        t0 = time.time()
        sc16 = score_windows(s16, windows, a.batch)
        t1 = time.time()
        sc8 = score_windows(s8, windows, a.batch)
        t2 = time.time()
        covered = [rel for rel, st in info.pop("doc_starts") if st < TRAIN_EVAL_WINDOWS * a.seq + 1]
        perp = {"data": info, "heldout_tokens": len(ids), "seconds": {"bf16": t1 - t0, "fp8": t2 - t1}}
        for key, k in (("train_protocol", TRAIN_EVAL_WINDOWS), ("all", n)):
            if k > n or (key == "all" and n == TRAIN_EVAL_WINDOWS and "train_protocol" in perp):
                continue
            b, f = ppl_stats(sc16, k), ppl_stats(sc8, k)
            same = sum(x == y for s, t in zip(sc16[:k], sc8[:k]) for x, y in zip(s[1], t[1]))
            perp[key] = {"bf16": b, "fp8": f, "relative_change": f["ppl"] / b["ppl"] - 1,
                         "top1_agreement": same / b["tokens"]}
        tl = json.load(open(os.path.join(target, "train_log.json")))
        last = tl["evals"][-1]
        tp = perp.get("train_protocol")
        perp["training_md"] = {"heldout_ppl": last["heldout_ppl"], "heldout_loss": last["heldout_loss"],
                               "heldout_tokens": tl["heldout_tokens"], "seq": tl["args"]["seq"]}
        perp["vs_training_md"] = (
            f"TRAINING.md: perplexity {last['heldout_ppl']:.2f} over \"{tl['heldout_tokens']} held-out tokens\": that count is "
            f"the size of the held-out split (reproduced here: {len(ids)} tokens), but train_target.py's eval_loss scores only "
            f"its first {TRAIN_EVAL_WINDOWS} windows of {tl['args']['seq']} ({TRAIN_EVAL_WINDOWS * tl['args']['seq']} predicted "
            f"tokens), each from its own start (context 0..{tl['args']['seq'] - 1}), with the float32 weights of the last step. "
            + (f"The same windows on the bf16 server give {tp['bf16']['ppl']:.4f} "
               f"({100 * (tp['bf16']['ppl'] / last['heldout_ppl'] - 1):+.3f}%): what is left is the checkpoint's rounding "
               f"of those float32 weights to bf16 (save_checkpoint) and float summation order. "
               if tp else "")
            + (f"Over every window of the split ({perp['all']['bf16']['tokens']} tokens) bf16 gives "
               f"{perp['all']['bf16']['ppl']:.4f}: the split is in path order, and its first {TRAIN_EVAL_WINDOWS} windows "
               f"cover only {len(covered)} of its {info['documents']} documents ({', '.join(covered)})."
               if "all" in perp else ""))
        res["perplexity"] = perp
        for key in ("train_protocol", "all"):
            if key in perp:
                log(f"ppl {key}: bf16 {perp[key]['bf16']['ppl']:.4f} fp8 {perp[key]['fp8']['ppl']:.4f} "
                    f"({100 * perp[key]['relative_change']:+.3f}%)")

        if not a.no_tau:
            res["tau"] = {}
            selection = eval_selection(a.prompts, a.limit)
            for d in DRAFTERS:
                res["tau"][d] = {}
                for prec, base, blk in (("bf16", s16, None), ("fp8", s8, a.block), ("fp8d", s8, a.block)):
                    with Server(a.binary, target, f"{d}-{prec}", logs, a.threads, draft=os.path.join(a.pair, d),
                                fp8_block=blk, draft_fp8=prec == "fp8d") as sd:
                        res["servers"][sd.name] = {"command": " ".join(sd.cmd), **sd.startup}
                        out = os.path.join(a.out, "eval", f"{d}-{prec}")
                        os.makedirs(out, exist_ok=True)
                        e = run_eval(a.binary, sd.url, base.url, out, a)
                        e["cross_check"] = cross_check(out, g16 if prec == "bf16" else g8, selection)
                        e["drafter"] = "fp8" if prec == "fp8d" else "bf16"
                        res["tau"][d][prec] = e
                        log(f"{d} {prec}: tau {e['tau']:.4f} lossless {e['lossless']} ({e['seconds']:.0f} s)")
                res["tau"][d]["matched"] = matched_tau(*(os.path.join(a.out, "eval", f"{d}-{p}") for p in ("bf16", "fp8")))

    res["seconds"] = time.time() - t_start
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    write_md(res, os.path.join(a.out, "results.md"))
    log(f"wrote {a.out}/results.json and results.md ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
