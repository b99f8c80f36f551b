#!/usr/bin/env python3
"""graphswap eval: the speculative-decoding evaluation command.

- --model/--draft --sequential (in the process: `serve` with the drafter, then the target alone, its log in
  OUT/server.log and not on eval's stderr) on a small random Qwen3 target with a
  tokenizer and a DFlash drafter whose Markov-free block still accepts some drafts: exit 0, eval.json
  has the documented schema (per category and overall: prompts, requests, completion_tokens,
  spec_steps, accepted_tokens, tau, accept_rate_per_position, spec_tok_s, plain_tok_s, speedup,
  lossless, mismatches), tau == 1 + accepted / steps, per-position rates in [0, 1] and
  non-increasing, rate sums consistent with tau (1 + sum of rates == tau), lossless true at
  temperature 0; eval.md holds the table; eval.svg parses as XML. All three prompt shapes
  (Spec-Bench turns, prompt, messages) in one file, a category filter and --limit.
  eval.json's run description (baseline "plain-server", machine, threads, commit key) and
  eval-requests.jsonl (a line per request, token ids of both runs, first_diff -1).
- --model/--draft alternated (the default): one server, the plain run with "speculative": false,
  a block per prompt with the order flipped each block: order "alternate", baseline "same-server",
  one server in server.log, lossless, speedup_spread over one block per prompt (min <= p10 <=
  median <= p90 <= max, all > 0; eval.md and stderr say so); --bf16-activations=amx passed to the
  server (eval.json "bf16_activations": "amx"; a bad value: exit 2 naming it);
  eval.svg's speedup panel has a y-axis.
- --url against a server the test starts (concurrency 2) with --baseline-url a plain server: the
  same tau, the same per-position rates, the same token ids request by request (the CPU backend is
  batch-invariant: a row's logits do not depend on the other rows) and lossless; --url alone: the
  plain run goes to the same server with "speculative": false (baseline "same-server"): lossless,
  speedup reported, the same token ids and tau; --no-baseline: speedup, plain_tok_s and lossless null;
  temperature 0.8 with --seed: no lossless check, and a rerun gives the same tokens in both runs.
- The losslessness check can fail: (1) a baseline server on a DIFFERENT target makes the outputs
  differ; (2) the speculative path itself is broken: a drafter with the TEST-ONLY
  "graphswap_test_accept_drafts" (every draft accepted whatever the target says) served alone, its
  plain run on the same server -> lossless false, mismatches listed with first_diff (the same index
  eval-requests.jsonl gives), eval.md says **no**, exit status 1.
- Bad inputs: a missing file, a line that is not JSON, a line with neither prompt, messages nor
  turns, an empty prompt (each: exit 2, the message names FILE:LINE, nothing is sent); an
  unreachable --url (exit 2 within seconds, the message names the address); --model on a missing
  folder (exit 2, the reason on eval's stderr though the server log is redirected); --sequential
  with --no-baseline, --bf16-activations with --url (exit 2).
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402

KEYS = ["prompts", "requests", "completion_tokens", "spec_steps", "accepted_tokens", "tau",
        "accept_rate_per_position", "spec_tok_s", "plain_tok_s", "speedup", "lossless"]


def run(gs, args, timeout=600):
    t0 = time.time()
    p = subprocess.run([gs, "eval"] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr, time.time() - t0


def requests(d):
    with open(os.path.join(d, "eval-requests.jsonl")) as f:
        return [json.loads(l) for l in f]


def check_schema(C, what, ev, lossless_expected):
    for name, o in list(ev["categories"].items()) + [("overall", ev["overall"])]:
        missing = [k for k in KEYS if k not in o]
        if not C.check(not missing, "%s: %s lacks %s" % (what, name, missing)):
            continue
        if o["spec_steps"]:
            C.check(abs(o["tau"] - (1 + o["accepted_tokens"] / o["spec_steps"])) < 1e-9,
                    "%s: %s tau %r != 1 + accepted / steps" % (what, name, o["tau"]))
        r = o["accept_rate_per_position"]
        C.check(len(r) == ev["draft_positions"] and all(0 <= x <= 1 for x in r) and
                all(r[i] >= r[i + 1] for i in range(len(r) - 1)),
                "%s: %s rates not in [0,1] and non-increasing: %r" % (what, name, r))
        C.check(abs(1 + sum(r) - o["tau"]) < 1e-9, "%s: %s 1 + sum(rates) %r != tau %r" % (what, name, 1 + sum(r), o["tau"]))
        C.check(o["lossless"] == lossless_expected, "%s: %s lossless %r, expected %r" % (what, name, o["lossless"], lossless_expected))


def main():
    C = H.Checker("eval")
    gs = H.gs_bin(C)
    tmp = H.scratch("eval")
    target = H.mkmodel(C, gs, os.path.join(tmp, "t"), vocab=1024, extra=["--seed", "3"])
    other = H.mkmodel(C, gs, os.path.join(tmp, "t2"), vocab=1024, extra=["--seed", "4"])
    draft = os.path.join(tmp, "d")
    p = subprocess.run([gs, "mkmodel", "--arch", "dflash", "--target", target, "--out", draft, "--layers", "1",
                        "--seed", "5"], capture_output=True, text=True)
    C.check(p.returncode == 0, "mkmodel dflash: %s" % p.stderr[-300:])
    prompts = os.path.join(tmp, "prompts.jsonl")
    lines = [
        {"question_id": 1, "category": "writing", "turns": ["Write a short note.", "Now shorter."]},
        {"question_id": 2, "category": "writing", "turns": ["Another one."]},
        {"category": "code", "prompt": "def f(x):"},
        {"category": "code", "prompt": "import os"},
        {"category": "chat", "messages": [{"role": "user", "content": "Hello there"}]},
        {"prompt": "no category here"},
    ]
    with open(prompts, "w") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")

    # (a) --model / --draft
    out_a = os.path.join(tmp, "a")
    rc, err, _ = run(gs, ["--model", target, "--draft", draft, "--prompts", prompts, "--max-tokens", "24",
                          "--out", out_a, "--threads", "2", "--sequential"])
    if C.check(rc == 0, "--model eval exited %d: %s" % (rc, err[-800:])):
        ev = json.load(open(os.path.join(out_a, "eval.json")))
        C.check(sorted(ev["categories"]) == ["chat", "code", "default", "writing"], "categories %r" % sorted(ev["categories"]))
        C.check(ev["categories"]["writing"]["requests"] == 3 and ev["categories"]["writing"]["prompts"] == 2,
                "Spec-Bench turns: %r" % ev["categories"]["writing"])
        C.check(ev["overall"]["completion_tokens"] > 0 and ev["overall"]["spec_steps"] > 0, "nothing generated: %r" % ev["overall"])
        C.check(ev["draft_positions"] == 7, "draft_positions %r (DFlash b8: 7)" % ev["draft_positions"])
        check_schema(C, "--model", ev, True)
        log = open(os.path.join(out_a, "server.log")).read()
        C.check(log.count("serving ") == 2 and log.count("stopped") == 2 and "serving " not in err,
                "--model: two in-process servers, their log in server.log only: %r" % err[-300:])
        C.check(ev["overall"]["speedup"] is not None and ev["overall"]["plain_tok_s"] > 0, "no speedup: %r" % ev["overall"])
        C.check(ev["order"] == "sequential" and ev["overall"]["speedup_spread"] is None and
                ev["bf16_activations"] is None, "--sequential: %r" % {k: ev.get(k) for k in ("order", "bf16_activations")})
        C.check(ev["baseline"] == "plain-server" and ev["threads"] == 2 and ev["machine"]["cpus"] >= 1 and
                "commit" in ev and ev["model"] == target and ev["draft"] == draft,
                "run description: %r" % {k: ev.get(k) for k in ("baseline", "threads", "machine", "commit", "model")})
        rq = requests(out_a)
        C.check(len(rq) == 7 and [(q["category"], q["turn"]) for q in rq[:3]] == [("writing", 0), ("writing", 1), ("writing", 0)]
                and all(q["first_diff"] == -1 and q["spec"]["token_ids"] == q["plain"]["token_ids"] and
                        len(q["spec"]["token_ids"]) > 0 for q in rq) and
                sum(q["spec"]["steps"] for q in rq) == ev["overall"]["spec_steps"],
                "eval-requests.jsonl: %r" % [(q["category"], q["turn"], q.get("first_diff")) for q in rq])
        md = open(os.path.join(out_a, "eval.md")).read()
        C.check("| category | prompts |" in md and "**overall**" in md and "| p7 |" in md, "eval.md table: %r" % md[:400])
        try:
            root = ET.parse(os.path.join(out_a, "eval.svg")).getroot()
            C.check(root.tag.endswith("svg") and len(list(root.iter("{http://www.w3.org/2000/svg}rect"))) >= 7 + 4,
                    "eval.svg has too few bars")
        except ET.ParseError as e:
            C.fail("eval.svg is not XML: %s" % e)
    # alternated (the default), with an engine option passed through
    out_t = os.path.join(tmp, "alt")
    rc, err, _ = run(gs, ["--model", target, "--draft", draft, "--prompts", prompts, "--max-tokens", "24",
                          "--out", out_t, "--threads", "2", "--bf16-activations=amx"])
    if C.check(rc == 0, "alternated --model eval exited %d: %s" % (rc, err[-800:])):
        et = json.load(open(os.path.join(out_t, "eval.json")))
        check_schema(C, "alternated", et, True)
        log = open(os.path.join(out_t, "server.log")).read()
        C.check(et["order"] == "alternate" and et["baseline"] == "same-server" and et["bf16_activations"] == "amx"
                and log.count("serving ") == 1, "alternated run description: %r, %d servers" %
                ({k: et.get(k) for k in ("order", "baseline", "bf16_activations")}, log.count("serving ")))
        sp = et["overall"].get("speedup_spread") or {}
        C.check(sp.get("blocks") == et["overall"]["prompts"] and sp.get("prompts_per_block") == 1 and
                0 < sp["min"] <= sp["p10"] <= sp["median"] <= sp["p90"] <= sp["max"],
                "speedup_spread: %r (prompts %r)" % (sp, et["overall"]["prompts"]))
        md = open(os.path.join(out_t, "eval.md")).read()
        C.check("Runs alternated in %d blocks of 1 prompt(s)" % et["overall"]["prompts"] in md and
                "blocks: median" in err, "eval.md / stderr lack the spread: %r / %r" % (md[-400:], err[-300:]))
        # (a bf16 target: the amx order's tokens may differ from the sequential run's, so no
        # comparison across the two; that the option reaches the server shows below with a bad value)
        try:
            texts = [t.text or "" for t in ET.parse(os.path.join(out_t, "eval.svg")).getroot().iter("{http://www.w3.org/2000/svg}text")]
            C.check("speedup (plain = 1)" in texts and "acceptance rate" in texts and
                    sum(1 for t in texts if t.endswith("x") and t[:-1].replace(".", "").isdigit()) >= 5,
                    "eval.svg: no y-axis on the speedup panel: %r" % texts[-12:])
        except ET.ParseError as e:
            C.fail("eval.svg is not XML: %s" % e)
    # --limit and --categories
    out_l = os.path.join(tmp, "l")
    rc, err, _ = run(gs, ["--model", target, "--draft", draft, "--prompts", prompts, "--max-tokens", "8",
                          "--out", out_l, "--limit", "1", "--categories", "code,writing"])
    if C.check(rc == 0, "--limit eval exited %d: %s" % (rc, err[-500:])):
        ev = json.load(open(os.path.join(out_l, "eval.json")))
        C.check(sorted(ev["categories"]) == ["code", "writing"] and ev["overall"]["prompts"] == 2,
                "--limit 1 --categories code,writing: %r" % {k: v["prompts"] for k, v in ev["categories"].items()})

    # (b) --url with a baseline, concurrency 2; then --url alone
    spec = H.Server(C, gs, target, args=["--draft", draft])
    plain = H.Server(C, gs, target)
    wrong = H.Server(C, gs, other)
    try:
        out_b = os.path.join(tmp, "b")
        rc, err, _ = run(gs, ["--url", "http://127.0.0.1:%d" % spec.port, "--baseline-url",
                              "http://127.0.0.1:%d" % plain.port, "--prompts", prompts, "--max-tokens", "24",
                              "--concurrency", "2", "--out", out_b])
        if C.check(rc == 0, "--url eval exited %d: %s" % (rc, err[-800:])) and os.path.exists(os.path.join(out_a, "eval.json")):
            ea, eb = (json.load(open(os.path.join(d, "eval.json"))) for d in (out_a, out_b))
            check_schema(C, "--url", eb, True)
            for k in ("tau", "accept_rate_per_position", "completion_tokens", "spec_steps"):
                C.check(ea["overall"][k] == eb["overall"][k],
                        "--url (concurrency 2) %s %r != --model %r" % (k, eb["overall"][k], ea["overall"][k]))
            C.check(eb["baseline"] == "baseline-url" and eb["url"] == "http://127.0.0.1:%d" % spec.port,
                    "--baseline-url run: %r" % {k: eb.get(k) for k in ("baseline", "url", "baseline_url")})
            C.check([q["spec"]["token_ids"] for q in requests(out_b)] == [q["spec"]["token_ids"] for q in requests(out_a)],
                    "--url (concurrency 2) token ids differ from --model's")
        # sampled (temperature 0.8, --seed): no lossless check, and a rerun gives the same tokens
        outs = [os.path.join(tmp, "t08-%d" % k) for k in range(2)]
        for o in outs:
            rc, err, _ = run(gs, ["--url", "http://127.0.0.1:%d" % spec.port, "--prompts", prompts, "--max-tokens", "24",
                                  "--temperature", "0.8", "--seed", "7", "--concurrency", "2", "--out", o])
            C.check(rc == 0, "--temperature 0.8 exited %d: %s" % (rc, err[-300:]))
        if all(os.path.exists(os.path.join(o, "eval.json")) for o in outs):
            et = json.load(open(os.path.join(outs[0], "eval.json")))
            C.check(et["temperature"] == 0.8 and et["seed"] == 7 and et["overall"]["lossless"] is None and
                    "mismatches" not in et["overall"] and et["overall"]["speedup"] is not None,
                    "sampled run: %r" % et["overall"])
            r0, r1 = (requests(o) for o in outs)
            C.check([(q["spec"]["token_ids"], q["plain"]["token_ids"]) for q in r0] ==
                    [(q["spec"]["token_ids"], q["plain"]["token_ids"]) for q in r1] and
                    all("first_diff" not in q for q in r0), "a seeded sampled rerun gives other tokens")
        # --url alone: the plain run on the same server with "speculative": false
        out_s = os.path.join(tmp, "s")
        rc, err, _ = run(gs, ["--url", "http://127.0.0.1:%d/" % spec.port, "--prompts", prompts, "--max-tokens", "24",
                              "--concurrency", "2", "--out", out_s])
        if C.check(rc == 0, "--url (same-server baseline) exited %d: %s" % (rc, err[-800:])) and \
                os.path.exists(os.path.join(out_a, "eval.json")):
            es = json.load(open(os.path.join(out_s, "eval.json")))
            ea = json.load(open(os.path.join(out_a, "eval.json")))
            check_schema(C, "--url same server", es, True)
            C.check(es["baseline"] == "same-server" and es["overall"]["speedup"] is not None and
                    es["overall"]["plain_tok_s"] > 0 and es["overall"]["tau"] == ea["overall"]["tau"],
                    "same-server baseline: %r" % es["overall"])
            C.check([(q["spec"]["token_ids"], q["plain"]["token_ids"]) for q in requests(out_s)] ==
                    [(q["spec"]["token_ids"], q["plain"]["token_ids"]) for q in requests(out_a)],
                    "same-server token ids differ from --model's")
        out_c = os.path.join(tmp, "c")
        rc, err, _ = run(gs, ["--url", "http://127.0.0.1:%d/" % spec.port, "--prompts", prompts, "--max-tokens", "24",
                              "--no-baseline", "--out", out_c])
        if C.check(rc == 0, "--url --no-baseline exited %d: %s" % (rc, err[-500:])):
            ec = json.load(open(os.path.join(out_c, "eval.json")))
            C.check(ec["overall"]["speedup"] is None and ec["overall"]["lossless"] is None and
                    ec["overall"]["plain_tok_s"] is None and ec["baseline"] is None, "no baseline: %r" % ec["overall"])
            C.check(all("plain" not in q and "first_diff" not in q for q in requests(out_c)),
                    "--no-baseline: eval-requests.jsonl has plain runs")
            C.check(ec["overall"]["tau"] == json.load(open(os.path.join(out_b, "eval.json")))["overall"]["tau"],
                    "tau without baseline differs")
        # (c) the check can fail: the baseline serves another target
        out_d = os.path.join(tmp, "d-out")
        rc, err, _ = run(gs, ["--url", "http://127.0.0.1:%d" % spec.port, "--baseline-url",
                              "http://127.0.0.1:%d" % wrong.port, "--prompts", prompts, "--max-tokens", "24",
                              "--out", out_d])
        C.check(rc == 1, "a differing baseline: exit %d, expected 1: %s" % (rc, err[-300:]))
        if os.path.exists(os.path.join(out_d, "eval.json")):
            ed = json.load(open(os.path.join(out_d, "eval.json")))
            C.check(ed["overall"]["lossless"] is False and len(ed["overall"]["mismatches"]) > 0 and
                    all("first_diff" in m for m in ed["overall"]["mismatches"]),
                    "differing baseline not reported: %r" % ed["overall"].get("mismatches"))
            C.check("**no**" in open(os.path.join(out_d, "eval.md")).read(), "eval.md does not flag the mismatch")
    finally:
        for s in (spec, plain, wrong):
            s.stop()
            s.kill()
    # (c2) the speculative path itself diverges (TEST-ONLY drafter switch); plain run on the same server
    lossy = H.gs_harness.accept_all_drafter(draft, os.path.join(tmp, "d-lossy"))
    bad_srv = H.Server(C, gs, target, args=["--draft", lossy])
    try:
        out_e = os.path.join(tmp, "e")
        rc, err, _ = run(gs, ["--url", "http://127.0.0.1:%d" % bad_srv.port, "--prompts", prompts, "--max-tokens", "24",
                              "--concurrency", "2", "--out", out_e])
        C.check(rc == 1 and "lossless NO" in err, "a lossy speculative path: exit %d, expected 1: %s" % (rc, err[-300:]))
        if os.path.exists(os.path.join(out_e, "eval.json")):
            ee = json.load(open(os.path.join(out_e, "eval.json")))
            mm = ee["overall"]["mismatches"]
            rq = requests(out_e)
            C.check(ee["overall"]["lossless"] is False and ee["baseline"] == "same-server" and len(mm) > 0,
                    "lossy speculative path not reported: %r" % ee["overall"])
            C.check(sorted((m["prompt"], m["turn"], m["first_diff"]) for m in mm) ==
                    sorted((q["prompt"], q["turn"], q["first_diff"]) for q in rq if q["first_diff"] >= 0),
                    "mismatches %r vs eval-requests.jsonl" % mm)
            for q in rq:
                fd = q["first_diff"]
                if fd >= 0:
                    a, b = q["spec"]["token_ids"], q["plain"]["token_ids"]
                    C.check(a[:fd] == b[:fd] and (fd >= min(len(a), len(b)) or a[fd] != b[fd]),
                            "first_diff %d is not the first differing index" % fd)
            C.check("**no**" in open(os.path.join(out_e, "eval.md")).read(), "eval.md does not flag the lossy run")
    finally:
        bad_srv.stop()
        bad_srv.kill()

    # (d) bad inputs: nothing is sent, exit 2, the message names the place
    def bad(name, content, want):
        path = os.path.join(tmp, name)
        if content is not None:
            with open(path, "w") as f:
                f.write(content)
        rc, err, _ = run(gs, ["--url", "http://127.0.0.1:9", "--prompts", path, "--out", os.path.join(tmp, "bad")])
        C.check(rc == 2 and want in err, "%s: exit %d, stderr %r (wanted %r)" % (name, rc, err[-300:], want))

    bad("missing.jsonl", None, "missing.jsonl: cannot open")
    bad("notjson.jsonl", '{"prompt": "ok"}\n{"prompt": \n', "notjson.jsonl:2: not a JSON object")
    bad("neither.jsonl", '{"prompt": "ok"}\n\n{"category": "x", "text": "hi"}\n',
        "neither.jsonl:3: needs exactly one of")
    bad("empty.jsonl", '{"prompt": ""}\n', "empty.jsonl:1: \"prompt\" must be a non-empty string")
    bad("turns.jsonl", '{"turns": [1, 2]}\n', "turns.jsonl:1: \"turns\" must be a non-empty list of strings")
    rc, err, dt = run(gs, ["--url", "http://127.0.0.1:9", "--prompts", prompts, "--out", os.path.join(tmp, "bad")],
                      timeout=60)
    C.check(rc == 2 and "cannot reach http://127.0.0.1:9" in err and dt < 15,
            "unreachable --url: exit %d after %.1f s: %r" % (rc, dt, err[-300:]))
    rc, err, _ = run(gs, ["--url", "ftp://x", "--prompts", prompts])
    C.check(rc == 2 and "expected http://HOST[:PORT]" in err, "bad --url: %d %r" % (rc, err[-200:]))
    rc, err, _ = run(gs, ["--model", target, "--prompts", prompts])
    C.check(rc == 2 and "--model needs --draft" in err, "--model without --draft: %d %r" % (rc, err[-200:]))
    rc, err, _ = run(gs, ["--model", os.path.join(tmp, "no-such-model"), "--draft", draft, "--prompts", prompts,
                          "--out", os.path.join(tmp, "bad")])
    C.check(rc == 2 and "cannot start the target with the drafter" in err and "no-such-model" in err,
            "--model on a missing folder: %d %r" % (rc, err[-300:]))
    rc, err, _ = run(gs, ["--url", "http://127.0.0.1:9", "--baseline-url", "http://127.0.0.1:9", "--no-baseline",
                          "--prompts", prompts])
    C.check(rc == 2 and "contradict" in err, "--baseline-url with --no-baseline: %d %r" % (rc, err[-200:]))
    rc, err, _ = run(gs, ["--model", target, "--draft", draft, "--sequential", "--no-baseline", "--prompts", prompts])
    C.check(rc == 2 and "--sequential orders the two runs" in err, "--sequential --no-baseline: %d %r" % (rc, err[-200:]))
    rc, err, _ = run(gs, ["--model", target, "--draft", draft, "--bf16-activations=bogus", "--prompts", prompts,
                          "--out", os.path.join(tmp, "bad")])
    C.check(rc == 2 and "--bf16-activations=bogus: must be amx, pairs or off" in err,
            "--bf16-activations=bogus: %d %r" % (rc, err[-300:]))
    rc, err, _ = run(gs, ["--url", "http://127.0.0.1:9", "--bf16-activations", "--prompts", prompts])
    C.check(rc == 2 and "configure the servers of --model" in err, "--bf16-activations with --url: %d %r" % (rc, err[-200:]))
    sys.exit(C.finish())


if __name__ == "__main__":
    main()
