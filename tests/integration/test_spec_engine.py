#!/usr/bin/env python3
"""Speculative decoding through the real binary (issue: DFlash / DSpark under captured plans).

- Lossless (I9): for random target/drafter pairs (DFlash and DSpark, several block sizes and drafter
  depths, qwen3 / llama / qwen2 targets), greedy output with the drafter equals greedy output without
  it, token for token and logprob for logprob (bitwise, as printed), batched and alone.
- Plan replay equals eager for the context, draft and verify steps: same tokens, same trace.
- Chunked prefill and the DSpark confidence cut stay lossless.
- Stop conditions are exact: a stop token accepted inside a block ends the output there.
- Usage counts (spec.drafts / draft_tokens / accepted_tokens, acceptance_lengths) equal what the trace
  shows.
- Seeded sampling with a drafter is reproducible and independent of batch composition.
"""
import json
import os
import subprocess
import sys

BIN = os.environ.get("GS_BIN", "build/graphswap")
TMP = os.environ.get("GS_TEST_TMP", "/tmp/gs-spec-test")
os.makedirs(TMP, exist_ok=True)
passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", msg)
    return cond


def run(args):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("graphswap %s failed: %s" % (" ".join(args), p.stderr.strip()))
    return p.stdout


def mk(name, *args):
    d = os.path.join(TMP, name)
    if not os.path.exists(os.path.join(d, "config.json")):
        run(["mkmodel", "--out", d, "--no-tokenizer"] + list(args))
    return d


def gen_batch(model, reqs, *extra, trace=None):
    path = os.path.join(TMP, "batch.jsonl")
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    args = ["generate", "--model", model, "--batch-file", path] + list(extra)
    if trace:
        args += ["--trace", trace]
    # keep floats as printed text: bitwise comparisons
    out = run(args)
    return [json.loads(line, parse_float=str) for line in out.splitlines() if line.strip()]


def prompts(n, vocab, seed):
    out = []
    x = seed * 7919 + 13
    for i in range(n):
        ln = 1 + (x % 37)
        ids = []
        for _ in range(ln):
            x = (x * 1103515245 + 12345) % (1 << 31)
            ids.append(x % (vocab - 8))
        out.append(ids)
    return out


def core(o):
    return {k: o[k] for k in ("token_ids", "logprobs", "finish_reason")}


pairs = [
    # (name, target args, drafter arch, drafter args)
    ("q3a", ["--arch", "qwen3", "--layers", "4", "--hidden", "64", "--vocab", "384", "--seed", "5"], "dflash",
     ["--layers", "1", "--block-size", "4"]),
    ("q3b", ["--arch", "qwen3", "--layers", "5", "--hidden", "96", "--heads", "6", "--kv-heads", "2",
             "--head-dim", "24", "--vocab", "300", "--no-tie", "--seed", "6"], "dflash",
     ["--layers", "3", "--block-size", "16"]),
    ("q3c", ["--arch", "qwen3", "--layers", "3", "--hidden", "64", "--vocab", "256", "--seed", "7"], "dspark",
     ["--layers", "2", "--block-size", "7", "--markov-rank", "8"]),
    ("llm", ["--arch", "llama", "--layers", "3", "--hidden", "64", "--vocab", "320", "--seed", "8"], "dspark",
     ["--layers", "1", "--block-size", "4", "--markov-rank", "0", "--no-confidence"]),
    ("qw2", ["--arch", "qwen2", "--layers", "4", "--hidden", "64", "--vocab", "300", "--seed", "9"], "dflash",
     ["--layers", "2", "--block-size", "8"]),
]

for name, targs, arch, dargs in pairs:
    T = mk("T_" + name, *targs)
    D = os.path.join(TMP, "D_" + name)
    if not os.path.exists(os.path.join(D, "config.json")):
        run(["mkmodel", "--arch", arch, "--target", T, "--out", D] + dargs)
    vocab = json.load(open(os.path.join(T, "config.json")))["vocab_size"]
    ps = prompts(6, vocab, len(name))
    reqs = [{"prompt_ids": p, "max_tokens": 20 + 7 * i, "ignore_eos": True, "logprobs": 2} for i, p in enumerate(ps)]
    plain = gen_batch(T, reqs)
    tr = os.path.join(TMP, "trace_%s.jsonl" % name)
    spec = gen_batch(T, reqs, "--draft", D, trace=tr)
    for i in range(len(reqs)):
        check(core(plain[i]) == core(spec[i]), "%s request %d: speculative batch output differs from plain" % (name, i))
        check(plain[i].get("top_logprobs") == spec[i].get("top_logprobs"), "%s request %d: top_logprobs differ" % (name, i))
    # alone
    for i in (0, 3):
        alone = gen_batch(T, [reqs[i]], "--draft", D)
        check(core(alone[0]) == core(plain[i]), "%s request %d: speculative alone differs from plain" % (name, i))
    # eager replay gives the same tokens and the same trace
    tr_e = os.path.join(TMP, "trace_%s_eager.jsonl" % name)
    eager = gen_batch(T, reqs, "--draft", D, "--eager", trace=tr_e)
    check([core(o) for o in eager] == [core(o) for o in spec], "%s: eager speculative output differs from plan replay" % name)
    check(open(tr).read() == open(tr_e).read(), "%s: eager trace differs from plan replay trace" % name)
    # chunked prefill
    chunked = gen_batch(T, reqs, "--draft", D, "--prefill-chunk", "5")
    check([core(o) for o in chunked] == [core(o) for o in plain], "%s: chunked prefill speculative output differs" % name)
    # usage and acceptance lengths vs trace
    lines = [json.loads(l) for l in open(tr)]
    for i in range(len(reqs)):
        mine = [l for l in lines if l["request"] == i]
        drafted = [l for l in mine if l["drafts"]]
        sp = spec[i]["spec"]
        check(int(sp["drafts"]) == len(drafted), "%s req %d: spec.drafts %s vs trace %d" % (name, i, sp["drafts"], len(drafted)))
        check(int(sp["draft_tokens"]) == sum(len(l["drafts"]) for l in mine), "%s req %d: draft_tokens" % (name, i))
        check(int(sp["accepted_tokens"]) == sum(l["accepted"] for l in mine), "%s req %d: accepted_tokens" % (name, i))
        al = [int(x) for x in spec[i]["acceptance_lengths"]]
        check(sum(al) == len(spec[i]["token_ids"]) - 1, "%s req %d: acceptance lengths sum %d vs %d tokens" % (name, i, sum(al), len(spec[i]["token_ids"])))
        # the trace reconstructs the output: anchor chain + accepted drafts + bonus
        toks = list(spec[i]["token_ids"])
        ok = True
        for k, l in enumerate(mine):
            emitted = l["drafts"][:l["accepted"]] + ([l["bonus"]] if l["bonus"] >= 0 else [])
            start = sum(al[:k]) + 1
            ok &= toks[start:start + len(emitted)] == emitted[:len(toks) - start]
            ok &= l["accepted"] <= len(l["drafts"])
        check(ok, "%s req %d: trace does not reconstruct the output" % (name, i))
    print("%s: %d steps, accepted %d of %d drafted tokens" % (
        name, len(lines), sum(l["accepted"] for l in lines), sum(len(l["drafts"]) for l in lines)))

# DSpark confidence cut: lossless, and it verifies fewer drafts
T, D = os.path.join(TMP, "T_q3c"), os.path.join(TMP, "D_q3c")
vocab = 256
reqs = [{"prompt_ids": p, "max_tokens": 30, "ignore_eos": True} for p in prompts(4, vocab, 3)]
plain = gen_batch(T, reqs)
full = gen_batch(T, reqs, "--draft", D)
cut = gen_batch(T, reqs, "--draft", D, "--spec-confidence-threshold", "0.5")
check([core(o) for o in cut] == [core(o) for o in plain], "confidence cut changes greedy output")
check(sum(int(o["spec"]["draft_tokens"]) for o in cut) < sum(int(o["spec"]["draft_tokens"]) for o in full),
      "confidence threshold 0.5 did not reduce the verified drafts")
n3 = gen_batch(T, reqs, "--draft", D, "--num-spec-tokens", "3")
check([core(o) for o in n3] == [core(o) for o in plain], "--num-spec-tokens 3 changes greedy output")
tr3 = os.path.join(TMP, "trace_n3.jsonl")
gen_batch(T, reqs, "--draft", D, "--num-spec-tokens", "3", trace=tr3)
check(all(len(json.loads(l)["drafts"]) <= 3 for l in open(tr3)), "--num-spec-tokens 3 verified more than 3 drafts")

# exact stops: stop at a token that appears mid-output; drafts accepted past it are dropped
T, D = os.path.join(TMP, "T_q3a"), os.path.join(TMP, "D_q3a")
base = gen_batch(T, [{"prompt_ids": [5, 6, 7], "max_tokens": 40, "ignore_eos": True}])[0]["token_ids"]
stop_tok = base[len(base) // 2]
req = [{"prompt_ids": [5, 6, 7], "max_tokens": 40, "ignore_eos": True, "stop_token_ids": [stop_tok]}]
a = gen_batch(T, req)[0]
b = gen_batch(T, req, "--draft", D)[0]
check(core(a) == core(b), "stop token: speculative output differs")
check(a["token_ids"][-1] == stop_tok and a["finish_reason"] == "stop" and stop_tok not in a["token_ids"][:-1],
      "stop token: output does not end at its first occurrence")
maxed = gen_batch(T, [{"prompt_ids": [5, 6, 7], "max_tokens": 9, "ignore_eos": True}], "--draft", D)[0]
check(len(maxed["token_ids"]) == 9 and maxed["finish_reason"] == "length", "max_tokens not exact with a drafter")

# seeded sampling with a drafter: reproducible, batch-independent
sreq = [{"prompt_ids": p, "max_tokens": 16, "ignore_eos": True, "temperature": 0.8, "seed": 100 + i}
        for i, p in enumerate(prompts(5, 384, 11))]
s1 = gen_batch(T, sreq, "--draft", D)
s2 = gen_batch(T, sreq[::-1], "--draft", D)[::-1]
check([core(o) for o in s1] == [core(o) for o in s2], "seeded speculative sampling depends on batch order")
s3 = gen_batch(T, [sreq[2]], "--draft", D)
check(core(s3[0]) == core(s1[2]), "seeded speculative sampling alone differs from batched")

# a drafter that does not fit its target is refused with a clear error
def refused(model, draft, words):
    p = subprocess.run([BIN, "generate", "--model", model, "--draft", draft, "--prompt-ids", "1,2", "--max-tokens", "2"],
                       capture_output=True, text=True, timeout=120)
    return p.returncode != 0 and all(w in p.stderr for w in words), p.stderr.strip()


Tq3b, Dq3a = os.path.join(TMP, "T_q3b"), os.path.join(TMP, "D_q3a")
ok, msg = refused(Tq3b, Dq3a, ["hidden_size", "does not match"])
check(ok, "drafter with another hidden size not refused clearly: %s" % msg)
T5 = mk("T_5layers", "--arch", "qwen3", "--layers", "5", "--hidden", "64", "--vocab", "384", "--seed", "31")
ok, msg = refused(T5, Dq3a, ["num_target_layers"])
check(ok, "drafter trained on another layer count not refused clearly: %s" % msg)
T_voc = mk("T_vocab", "--arch", "qwen3", "--layers", "4", "--hidden", "64", "--vocab", "400", "--seed", "32")
ok, msg = refused(T_voc, Dq3a, ["vocab_size"])
check(ok, "drafter with another vocabulary not refused clearly: %s" % msg)
ok, msg = refused(Dq3a, Dq3a, ["drafter"])
check(ok, "a drafter served as the target not refused clearly: %s" % msg)

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
