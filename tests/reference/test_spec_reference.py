"""Speculative decoding (DFlash / DSpark drafters) of graphswap against the float64 numpy reference
(ref_spec.py; semantics in tests/reference/SPEC-NOTES.md).

Skips (prints "graphswap has no --draft support yet" and "0 passed, 0 failed", exit 0) only when
`$GS_BIN generate --help` does not mention --draft. Otherwise, for several random qwen3 targets:
  * drafters built by `graphswap mkmodel --arch dflash|dspark --target T ...` (block sizes 4..16,
    1..3 layers, Markov ranks) load in the reference's strict loader (exact z-lab / DeepSpec
    layout, config fields),
  * drafters written by the reference's own writer in the exact published layouts (random, and
    engineered so that drafts get accepted: a DFlash whose mask token / small layer outputs make
    it propose the target's frequent token, a DSpark whose Markov head encodes the target's
    bigrams), so acceptance paths, multi-row context updates and budget cuts are exercised,
  * `generate --model T --draft D --prompt-ids ... --max-tokens N --ignore-eos --trace FILE`:
    every trace line's start / anchor / drafts / accepted / bonus, the final token_ids and
    acceptance_lengths equal the reference; token_ids also equal graphswap's own plain greedy run
    and the reference's plain greedy decoding (lossless);
  * short budgets (the last step verifies at most the tokens still allowed), an eos stop inside a
    step (target config eos set to a token the greedy output produces, when plain generation honours
    it), and the confidence threshold (when generate --help lists a confidence flag).
Reference argmax near-ties (top-2 gap < 1e-5) are avoided by trying another prompt; when no prompt
is tie-free the case is reported as a TEST SETUP PROBLEM.
"""

import json
import os
import re
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402
import ref_spec as rs  # noqa: E402

TIE_GAP = 1e-5
NEAR = 1e-3            # gaps below this are mentioned in failure messages as possible numerics
MAX_TOKENS = 64
TRACE_KEYS = ("step", "start", "anchor", "drafts", "accepted", "bonus")

C = H.Checker("spec_reference")
STATS = {"runs": 0, "steps": 0, "accepting_steps": 0, "full_steps": 0, "drafts": 0, "accepted": 0}

# targets: name, mkmodel geometry, seed
TARGETS = [
    ("t_h64_l5_tied", dict(hidden=64, layers=5, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=512, tie=True), 3),
    ("t_h64_l4_untied", dict(hidden=64, layers=4, heads=4, kv_heads=4, head_dim=16, inter=96, vocab=640, tie=False), 4),
    ("t_h96_l6_gqa4", dict(hidden=96, layers=6, heads=8, kv_heads=2, head_dim=12, inter=160, vocab=512, tie=True), 5),
]

# drafters built by mkmodel: (target index, kind, layers, block size, markov rank or None, seed)
MK_DRAFTERS = [
    (0, "dflash", 1, 4, None, 11),
    (0, "dflash", 2, 16, None, 12),
    (1, "dflash", 3, 8, None, 13),
    (2, "dflash", 2, 12, None, 14),
    (0, "dspark", 1, 7, 16, 21),
    (1, "dspark", 2, 4, 8, 22),
    (2, "dspark", 3, 16, 32, 23),
    (1, "dspark", 1, 10, 0, 24),
]


def mkmodel_target(binary, out, g, seed):
    shutil.rmtree(out, ignore_errors=True)
    args = [binary, "mkmodel", "--arch", "qwen3", "--out", out, "--hidden", str(g["hidden"]),
            "--layers", str(g["layers"]), "--heads", str(g["heads"]), "--kv-heads", str(g["kv_heads"]),
            "--head-dim", str(g["head_dim"]), "--intermediate", str(g["inter"]), "--vocab", str(g["vocab"]),
            "--tie" if g["tie"] else "--no-tie", "--dtype", "bf16", "--seed", str(seed)]
    return H.run(args)


def mkmodel_drafter(binary, out, kind, target_dir, layers, block, rank, seed):
    shutil.rmtree(out, ignore_errors=True)
    args = [binary, "mkmodel", "--arch", kind, "--target", target_dir, "--out", out,
            "--layers", str(layers), "--block-size", str(block), "--seed", str(seed)]
    if rank is not None:
        args += ["--markov-rank", str(rank)]
    return H.run(args)


def load_target(name, d):
    try:
        return rm.RefModel(d, strict=True)
    except (rm.FormatError, KeyError, ValueError, OSError) as e:
        C.fail("%s: target checkpoint rejected by the reference loader: %s" % (name, e))
        return None


def load_drafter(name, d, target):
    try:
        return rs.Drafter(d, target, strict=True)
    except (rm.FormatError, KeyError, ValueError, OSError) as e:
        C.fail("%s: drafter checkpoint does not follow the published layout (strict reference loader): %s"
               % (name, e))
        return None


def prompt_candidates(vocab, seed, n=4):
    rng = np.random.default_rng(seed)
    lens = [7, 1, 19, 33, 4, 12][:n]
    return [[int(x) for x in rng.integers(0, vocab - 2, size=k)] for k in lens]


def ref_run(target, drafter, prompt, max_tokens, stop_ids=(), thr=0.0, nst=None):
    return rs.spec_generate(target, drafter, prompt, max_tokens, stop_ids, thr, nst)


def tie_free(res, thr=0.0):
    g = min(res["draft_gaps"] + res["target_gaps"]) if (res["draft_gaps"] or res["target_gaps"]) else 1.0
    if g < TIE_GAP:
        return False
    if thr > 0 and res["conf_margins"] and min(res["conf_margins"]) < TIE_GAP:
        return False
    return True


def read_trace(path):
    steps = []
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s:
                steps.append(json.loads(s))
    return steps


def step_gaps(target, drafter, prompt, ref_tokens, st, thr):
    """Reference top-2 gaps (drafts, verify) at one step, for failure messages."""
    n = len(prompt)
    committed = list(prompt) + ref_tokens[:st["start"] - n]
    cache = rm.KVCache(target.cfg)
    _, hid = target.forward(committed, cache, return_hidden=True)
    drafter.reset()
    drafter.add_context(rs.target_feats(target, committed, hid, drafter.cfg.target_layer_ids), range(len(committed)))
    prop = drafter.propose(st["anchor"], st["start"], thr)
    dg = rs.top2_gap_rows(prop.logits[:max(1, len(st["drafts"]))])
    vl = target.forward([st["anchor"]] + list(st["drafts"]), cache)
    tg = rs.top2_gap_rows(vl)
    return dg, tg


def compare(what, binary, tdir, ddir, target, drafter, prompt, max_tokens, ignore_eos=True, stop_ids=(),
            thr=0.0, thr_flag=None, tmp=None, want_accept=False, nst=None, extra_args=()):
    """Runs graphswap with the drafter and compares with the reference run. Returns the reference
    result (or None when graphswap failed). extra_args: more generate flags (e.g. --prefill-chunk)."""
    ref = ref_run(target, drafter, prompt, max_tokens, stop_ids, thr, nst)
    trace_path = os.path.join(tmp, "trace.jsonl")
    if os.path.exists(trace_path):
        os.remove(trace_path)
    extra = ["--draft", ddir, "--trace", trace_path]
    if thr_flag:
        extra += [thr_flag, repr(float(thr))]
    if nst is not None:
        extra += ["--num-spec-tokens", str(nst)]
    extra += list(extra_args)
    obj = H.generate(C, what, binary, tdir, prompt_ids=prompt, max_tokens=max_tokens, ignore_eos=ignore_eos,
                     extra=extra)
    if obj is None:
        return None
    toks = obj.get("token_ids")
    C.check(toks == ref["tokens"], "%s: token_ids differ from the reference\n  got %s\n  ref %s"
            % (what, toks, ref["tokens"]))
    base, _ = rs.target_greedy(target, prompt, max_tokens, stop_ids)
    C.check(ref["tokens"] == base, "%s: REFERENCE BUG: speculative reference != plain greedy" % what)
    C.check(obj.get("acceptance_lengths") == ref["acceptance_lengths"],
            "%s: acceptance_lengths %s, reference %s" % (what, obj.get("acceptance_lengths"), ref["acceptance_lengths"]))
    C.check(obj.get("finish_reason") == ref["finish_reason"],
            "%s: finish_reason %r, reference %r" % (what, obj.get("finish_reason"), ref["finish_reason"]))
    if not C.check(os.path.exists(trace_path), "%s: --trace wrote no file %s" % (what, trace_path)):
        return ref
    try:
        steps = read_trace(trace_path)
    except ValueError as e:
        C.fail("%s: trace is not JSONL: %s" % (what, e))
        return ref
    C.check(len(steps) == len(ref["trace"]), "%s: %d trace lines, reference %d steps"
            % (what, len(steps), len(ref["trace"])))
    for i, (got, exp) in enumerate(zip(steps, ref["trace"])):
        missing = [k for k in TRACE_KEYS if k not in got]
        if not C.check(not missing, "%s: trace line %d lacks %s: %s" % (what, i, missing, got)):
            break
        bad = [k for k in TRACE_KEYS if got[k] != exp[k]]
        if bad:
            try:
                dg, tg = step_gaps(target, drafter, prompt, ref["tokens"], exp, thr)
                note = " (reference min gaps at this step: drafts %.2e, verify %.2e%s)" % (
                    float(np.min(dg)), float(np.min(tg)),
                    "; NEAR TIE, possibly numerics" if min(np.min(dg), np.min(tg)) < NEAR else "")
            except Exception as e:  # diagnostics only
                note = " (gap diagnostics failed: %s)" % e
            C.fail("%s: trace step %d differs in %s\n  got %s\n  ref %s%s"
                   % (what, i, bad, {k: got[k] for k in TRACE_KEYS}, exp, note))
            break
        C.check(True, "")
    STATS["runs"] += 1
    for st in ref["trace"]:
        STATS["steps"] += 1
        STATS["drafts"] += len(st["drafts"])
        STATS["accepted"] += st["accepted"]
        STATS["accepting_steps"] += st["accepted"] > 0
        STATS["full_steps"] += 0 < len(st["drafts"]) == st["accepted"]
    if want_accept:
        accs = [s["accepted"] for s in ref["trace"]]
        C.check(any(a > 0 for a in accs), "%s: TEST SETUP PROBLEM: engineered drafter accepted nothing" % what)
    return ref


def pick_prompt(what, target, drafter, vocab, seed, max_tokens, thr=0.0):
    for p in prompt_candidates(vocab, seed):
        res = ref_run(target, drafter, p, max_tokens, (), thr)
        if tie_free(res, thr):
            return p
    C.fail("TEST SETUP PROBLEM: %s: every candidate prompt has a reference near-tie (top-2 gap < %g); "
           "change the seeds" % (what, TIE_GAP))
    return None


def layout_checks(name, ddir, kind, layers, block, rank, tcfg):
    with open(os.path.join(ddir, "config.json")) as f:
        c = json.load(f)
    arch = "DFlashDraftModel" if kind == "dflash" else "Qwen3DSparkModel"
    C.check(c.get("architectures") == [arch], "%s: architectures %r" % (name, c.get("architectures")))
    C.check(c.get("num_hidden_layers") == layers, "%s: num_hidden_layers %r != --layers %d"
            % (name, c.get("num_hidden_layers"), layers))
    C.check(c.get("hidden_size") == tcfg.hidden, "%s: hidden_size not copied from the target" % name)
    C.check(c.get("num_target_layers") == tcfg.layers, "%s: num_target_layers %r" % (name, c.get("num_target_layers")))
    tl = (c.get("dflash_config") or {}).get("target_layer_ids", c.get("target_layer_ids"))
    C.check(isinstance(tl, list) and tl and all(isinstance(j, int) and 0 <= j <= tcfg.layers - 2 for j in tl)
            and all(a < b for a, b in zip(tl, tl[1:])),
            "%s: target_layer_ids %r: mkmodel should write strictly increasing ids in [0, L-2] (-1 and L-1 "
            "have HF-specific meanings, see SPEC-NOTES.md)" % (name, tl))
    st = sorted(f for f in os.listdir(ddir) if f.endswith(".safetensors"))
    C.check(st == ["model.safetensors"], "%s: drafter files %s" % (name, st))
    if kind == "dflash":
        dc = c.get("dflash_config") or {}
        C.check(isinstance(dc, dict) and "mask_token_id" in dc and "target_layer_ids" in dc,
                "%s: dflash_config lacks mask_token_id / target_layer_ids: %r" % (name, dc))
        bs = dc.get("block_size", c.get("block_size"))
        C.check(bs == block, "%s: block_size %r != --block-size %d" % (name, bs, block))
    else:
        for f in ("block_size", "num_target_layers", "target_layer_ids", "mask_token_id", "markov_rank",
                  "enable_confidence_head"):
            C.check(f in c, "%s: DSpark config.json lacks %s" % (name, f))
        C.check(c.get("block_size") == block, "%s: block_size %r != %d" % (name, c.get("block_size"), block))
        if rank is not None:
            C.check(c.get("markov_rank") == rank, "%s: markov_rank %r != %d" % (name, c.get("markov_rank"), rank))
        if c.get("markov_rank", 0) > 0:
            C.check(c.get("markov_head_type", "vanilla") == "vanilla", "%s: markov_head_type" % name)
        names = [t.name for t in rm.read_safetensors(os.path.join(ddir, st[0]))[0]] if st else []
        C.check("embed_tokens.weight" in names and "lm_head.weight" in names,
                "%s: DSpark checkpoint lacks its own embed_tokens / lm_head (DeepSpec saves both)" % name)


def main():
    binary = H.require_bin(C)
    hr = H.run([binary, "generate", "--help"])
    help_text = hr.stdout + hr.stderr
    if "--draft" not in help_text:
        print("graphswap has no --draft support yet")
        print("0 passed, 0 failed", flush=True)
        return 0
    C.check("--trace" in help_text, "generate --help mentions --draft but not --trace")
    m = re.search(r"--[A-Za-z0-9-]*confidence[A-Za-z0-9-]*", help_text)
    thr_flag = m.group(0) if m else None
    if not thr_flag:
        print("note: generate --help lists no confidence-threshold flag; threshold mode not tested", flush=True)

    has_nst = "--num-spec-tokens" in help_text
    tmp = H.scratch_dir("spec_reference")
    targets = []
    for name, g, seed in TARGETS:
        tdir = os.path.join(tmp, name)
        r = mkmodel_target(binary, tdir, g, seed)
        if not C.check(r.rc == 0, "%s: mkmodel exited %s: %s" % (name, r.rc, r.stderr.strip()[-1000:])):
            targets.append(None)
            continue
        ref = load_target(name, tdir)
        targets.append((name, tdir, ref, g) if ref is not None else None)

    # 1. drafters built by mkmodel
    for ti, kind, layers, block, rank, seed in MK_DRAFTERS:
        if targets[ti] is None:
            continue
        tname, tdir, target, g = targets[ti]
        name = "%s/%s-mk l=%d B=%d%s" % (tname, kind, layers, block, "" if rank is None else " r=%d" % rank)
        ddir = os.path.join(tmp, "d_%s_%d_%d_%d" % (kind, ti, layers, block))
        r = mkmodel_drafter(binary, ddir, kind, tdir, layers, block, rank, seed)
        if not C.check(r.rc == 0, "%s: mkmodel exited %s: %s\n  cmd: %s" % (name, r.rc, r.stderr.strip()[-1000:], r.cmd())):
            continue
        layout_checks(name, ddir, kind, layers, block, rank, target.cfg)
        drafter = load_drafter(name, ddir, target)
        if drafter is None:
            continue
        p = pick_prompt(name, target, drafter, g["vocab"], seed, MAX_TOKENS)
        if p is None:
            continue
        compare(name, binary, tdir, ddir, target, drafter, p, MAX_TOKENS, tmp=tmp)
        plain = H.generate(C, name + " plain", binary, tdir, prompt_ids=p, max_tokens=MAX_TOKENS, ignore_eos=True)
        if plain is not None:
            ref_plain, _ = rs.target_greedy(target, p, MAX_TOKENS)
            C.check(plain.get("token_ids") == ref_plain, "%s: graphswap plain greedy differs from the reference" % name)
        if kind == "dspark" and thr_flag and drafter.cfg.conf:
            thr_cases(name, binary, tdir, ddir, target, drafter, g, seed, thr_flag, tmp)

    # 2. drafters written by the reference writer (exact layouts), random and engineered
    for ti, (tname, tdir, target, g) in ((i, t) for i, t in enumerate(targets) if t is not None):
        L = g["layers"]
        tdict = json.load(open(os.path.join(tdir, "config.json")))
        p0 = prompt_candidates(g["vocab"], 100 + ti)[0]
        greedy, _ = rs.target_greedy(target, p0, MAX_TOKENS)
        freq = max(set(greedy), key=greedy.count)
        pairs = list(zip([p0[-1]] + greedy[:-1], greedy))
        specs = [
            ("dflash-rand", "dflash", dict(layers=2, block_size=5 + 3 * ti, target_layer_ids=[0, L - 2]),
             dict(layer_out_scale=1.0), False),
            ("dflash-eng", "dflash", dict(layers=1 + ti % 3, block_size=(4, 9, 16)[ti],
                                          target_layer_ids=([1], [0, L - 2], [0, L - 3, L - 2])[ti % 3],
                                          mask_token_id=freq),
             dict(layer_out_scale=(0.0, 0.3, 0.5)[ti]), True),
            ("dspark-rand", "dspark", dict(layers=1 + ti % 2, block_size=(6, 13, 4)[ti], target_layer_ids=[0, 2],
                                           markov_rank=16, enable_conf=True, conf_markov=bool(ti % 2)),
             dict(own_head="random"), False),
            ("dspark-eng", "dspark", dict(layers=2, block_size=(7, 4, 15)[ti], target_layer_ids=[1, L - 2],
                                          markov_rank=32, enable_conf=True, conf_markov=True), dict(), True),
        ]
        for label, kind, ckw, wkw, engineered in specs:
            name = "%s/%s l=%d B=%d" % (tname, label, ckw["layers"], ckw["block_size"])
            ddir = os.path.join(tmp, "w_%s_%d" % (label, ti))
            shutil.rmtree(ddir, ignore_errors=True)
            cd = rs.make_drafter_config(kind, tdict, **ckw)
            dcfg = rs.DraftConfig(cd)
            overrides = None
            if label == "dspark-eng":
                overrides = rs.markov_override(dcfg, pairs, scale=8.0, seed=ti, noise=0.3)
            w = rs.random_drafter_weights(dcfg, seed=200 + ti, target=target,
                                          own_head=wkw.get("own_head", "perturb"), overrides=overrides,
                                          layer_out_scale=wkw.get("layer_out_scale", 1.0))
            if label == "dflash-eng":
                # a mask token whose (nearly unchanged) embedding makes every slot propose `freq`
                m = rs.dflash_mask_for(target, w["norm.weight"], dcfg.eps, freq)
                if m is not None:
                    cd["dflash_config"]["mask_token_id"] = m
            rs.write_drafter(ddir, cd, w)
            drafter = load_drafter(name, ddir, target)
            if drafter is None:
                continue
            prompts = [p0] if engineered else []
            if not engineered or not tie_free(ref_run(target, drafter, p0, MAX_TOKENS)):
                pp = pick_prompt(name, target, drafter, g["vocab"], 300 + ti, MAX_TOKENS)
                prompts = [pp] if pp is not None else []
            for p in prompts:
                compare(name, binary, tdir, ddir, target, drafter, p, MAX_TOKENS, tmp=tmp,
                        want_accept=engineered and p is p0)
                for budget in (1, 2, 5, 17):
                    if tie_free(ref_run(target, drafter, p, budget)):
                        compare("%s max_tokens=%d" % (name, budget), binary, tdir, ddir, target, drafter, p,
                                budget, tmp=tmp)
                if has_nst:
                    for nst in (1, 3):
                        if tie_free(ref_run(target, drafter, p, 32, nst=nst)):
                            compare("%s num-spec-tokens=%d" % (name, nst), binary, tdir, ddir, target, drafter,
                                    p, 32, tmp=tmp, nst=nst)
            if kind == "dspark" and thr_flag:
                thr_cases(name, binary, tdir, ddir, target, drafter, g, 400 + ti, thr_flag, tmp)
        eos_case(binary, tmp, tname, tdir, target, g, ti)

    print("coverage: %(runs)d speculative runs, %(steps)d steps compared, %(drafts)d drafts verified, "
          "%(accepted)d accepted; %(accepting_steps)d steps accepted >= 1 draft, %(full_steps)d accepted all"
          % STATS, flush=True)
    return C.finish()


def thr_cases(name, binary, tdir, ddir, target, drafter, g, seed, thr_flag, tmp):
    """Confidence threshold: a middle value (cuts some steps) and 1.0 (every step verifies no draft)."""
    p = prompt_candidates(g["vocab"], seed)[0]
    res = ref_run(target, drafter, p, 24)
    confs = []
    for st in res["trace"][:4]:
        n = len(p)
        committed = list(p) + res["tokens"][:st["start"] - n]
        cache = rm.KVCache(target.cfg)
        _, hid = target.forward(committed, cache, return_hidden=True)
        drafter.reset()
        drafter.add_context(rs.target_feats(target, committed, hid, drafter.cfg.target_layer_ids),
                            range(len(committed)))
        confs.extend(drafter.propose(st["anchor"], st["start"]).conf.tolist())
    for thr in (round(float(np.median(confs)), 3), 1.0):
        for cand in prompt_candidates(g["vocab"], seed):
            r = ref_run(target, drafter, cand, 24, (), thr)
            if tie_free(r, thr):
                compare("%s thr=%g" % (name, thr), binary, tdir, ddir, target, drafter, cand, 24, thr=thr,
                        thr_flag=thr_flag, tmp=tmp)
                break
        else:
            C.fail("TEST SETUP PROBLEM: %s thr=%g: no tie-free prompt" % (name, thr))


def eos_case(binary, tmp, tname, tdir, target, g, ti):
    """Target with eos_token_id = a token its greedy output produces mid-way: generation must stop
    right after the first occurrence, also when it is inside an accepted run of drafts."""
    p = prompt_candidates(g["vocab"], 500 + ti)[0]
    greedy, _ = rs.target_greedy(target, p, 40)
    cands = [t for t in greedy[3:30] if greedy.index(t) >= 3]
    if not cands:
        print("note: %s: no eos candidate in the greedy output; eos case skipped" % tname, flush=True)
        return
    eos = cands[0]
    edir = os.path.join(tmp, "%s_eos" % tname)
    shutil.rmtree(edir, ignore_errors=True)
    shutil.copytree(tdir, edir)
    cp = os.path.join(edir, "config.json")
    cfg = json.load(open(cp))
    cfg["eos_token_id"] = int(eos)
    json.dump(cfg, open(cp, "w"), indent=2)
    for fn in ("generation_config.json",):
        gp = os.path.join(edir, fn)
        if os.path.exists(gp):
            gc = json.load(open(gp))
            gc["eos_token_id"] = int(eos)
            json.dump(gc, open(gp, "w"), indent=2)
    plain = H.generate(C, tname + " eos plain", binary, edir, prompt_ids=p, max_tokens=40, ignore_eos=False)
    if plain is None:
        return
    want = greedy[:greedy.index(eos) + 1]
    if plain.get("token_ids") != want:
        print("note: %s: plain generation does not stop at config eos_token_id %d (got %d tokens); "
              "eos case skipped" % (tname, eos, len(plain.get("token_ids") or [])), flush=True)
        return
    etarget = rm.RefModel(edir, strict=True)
    L = g["layers"]
    ddir = os.path.join(tmp, "%s_eos_draft" % tname)
    shutil.rmtree(ddir, ignore_errors=True)
    # engineered DFlash proposing the frequent token: eos tends to land inside accepted runs
    freq = max(set(greedy), key=greedy.count)
    cd = rs.make_drafter_config("dflash", cfg, layers=1, block_size=8, target_layer_ids=[L - 2])
    w = rs.random_drafter_weights(rs.DraftConfig(cd), seed=600 + ti, layer_out_scale=0.0)
    m = rs.dflash_mask_for(etarget, w["norm.weight"], cd["rms_norm_eps"], freq)
    if m is not None:
        cd["dflash_config"]["mask_token_id"] = m
    rs.write_drafter(ddir, cd, w)
    drafter = rs.Drafter(ddir, etarget)
    ref = compare("%s eos=%d" % (tname, eos), binary, edir, ddir, etarget, drafter, p, 40, ignore_eos=False,
                  stop_ids=[eos], tmp=tmp)
    if ref is not None:
        C.check(ref["tokens"] == want and ref["finish_reason"] == "stop",
                "%s eos: REFERENCE BUG: %s vs %s" % (tname, ref["tokens"], want))


if __name__ == "__main__":
    sys.exit(main())
