"""Self-check of the speculative-decoding reference (tests/reference/ref_spec.py); no graphswap
binary needed. Float64 throughout.

Checks, for random and engineered (high-acceptance) DFlash / DSpark drafters over several block
sizes, drafter depths, Markov ranks and confidence-head variants:
  * lossless: greedy speculative output == plain greedy decoding of the target, token for token,
    also with stop tokens, tiny budgets and confidence thresholds;
  * the trace is consistent: accepted <= len(drafts) <= W, anchors chain, start positions advance
    by the committed count, tokens rebuild from the trace, acceptance_lengths sum to len - 1,
    the verify width never passes the budget, confidence cuts are where the threshold says;
  * context K/V built incrementally (once per committed position) == recomputed from scratch
    from one full target pass over the committed prefix;
  * every step's drafts == a deliberately naive re-implementation (per-position / per-head loops,
    context rebuilt from scratch each step, Markov and confidence heads by hand);
  * checkpoint layout: the writer's tensor names / shapes match the published layouts, the strict
    loader rejects missing / extra / mis-shaped tensors and bad configs; target_layer_ids default rule.
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_model as rm  # noqa: E402
import ref_spec as rs  # noqa: E402

PASSED = 0
FAILED = 0
STOP_IN_DRAFTS = []


def check(cond, msg):
    global PASSED, FAILED
    if cond:
        PASSED += 1
    else:
        FAILED += 1
        print("FAIL: " + msg, flush=True)
    return bool(cond)


# ---------------------------------------------------------------------------------------------
# naive second implementation of one draft step
# ---------------------------------------------------------------------------------------------

def naive_drafts(target, drafter, committed, anchor, conf_threshold=0.0):
    """Drafts of the step whose anchor follows `committed` (prompt + tokens before the anchor),
    recomputing everything from scratch with per-row / per-head loops."""
    cfg = drafter.cfg
    W = drafter.w
    tcfg = target.cfg
    _, hid = target.forward(list(committed), None, return_hidden=True)
    feats = []
    for t in range(len(committed)):
        parts = []
        for j in cfg.target_layer_ids:
            if j == -1:
                parts.append(target.w["model.embed_tokens.weight"][committed[t]])
            elif j == tcfg.layers - 1:
                x = hid[j][t]
                parts.append(x / np.sqrt(np.mean(x * x) + tcfg.eps) * target.w["model.norm.weight"])
            else:
                parts.append(hid[j][t])
        feats.append(np.concatenate(parts))
    hd, nh, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
    group = nh // nkv

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v) + cfg.eps) * w

    def lin(v, name):
        return W[name + ".weight"].dot(v)

    def rope(vec, p):
        out = np.empty_like(vec)
        half = hd // 2
        for i in range(half):
            a = p * cfg.theta ** (-(2.0 * i) / hd)
            c, s = np.cos(a), np.sin(a)
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    ctx = [rms(W["fc.weight"].dot(f), W["hidden_norm.weight"]) for f in feats]
    start = len(committed)
    B = cfg.block_size
    ids = [anchor] + [cfg.mask_token_id] * (B - 1)
    x = [drafter.embed[t].copy() for t in ids]
    for l in range(cfg.layers):
        p = "layers.%d." % l
        keys = [[None] * (start + B) for _ in range(nkv)]
        vals = [[None] * (start + B) for _ in range(nkv)]
        rows = [(c, pos) for pos, c in enumerate(ctx)]
        hs = [rms(xi, W[p + "input_layernorm.weight"]) for xi in x]
        rows += [(hs[i], start + i) for i in range(B)]
        for idx, (h, pos) in enumerate(rows):
            kf = lin(h, p + "self_attn.k_proj")
            vf = lin(h, p + "self_attn.v_proj")
            for g in range(nkv):
                keys[g][idx] = rope(rms(kf[g * hd:(g + 1) * hd], W[p + "self_attn.k_norm.weight"]), pos)
                vals[g][idx] = vf[g * hd:(g + 1) * hd]
        new_x = []
        for i in range(B):
            qf = lin(hs[i], p + "self_attn.q_proj")
            att = np.zeros(nh * hd)
            for hh in range(nh):
                q = rope(rms(qf[hh * hd:(hh + 1) * hd], W[p + "self_attn.q_norm.weight"]), start + i)
                g = hh // group
                sc = np.array([q.dot(kv) for kv in keys[g]]) / np.sqrt(hd)
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                att[hh * hd:(hh + 1) * hd] = sum(sc[s] * vals[g][s] for s in range(len(sc)))
            xi = x[i] + lin(att, p + "self_attn.o_proj")
            h2 = rms(xi, W[p + "post_attention_layernorm.weight"])
            gt = lin(h2, p + "mlp.gate_proj")
            xi = xi + lin(gt / (1.0 + np.exp(-gt)) * lin(h2, p + "mlp.up_proj"), p + "mlp.down_proj")
            new_x.append(xi)
        x = new_x
    out = [rms(xi, W["norm.weight"]) for xi in x]
    if cfg.kind == "dflash":
        return [int(np.argmax(target.lm_head.dot(o))) for o in out[1:]], None
    drafts, prev, conf = [], anchor, []
    for k in range(B):
        row = drafter.lm_head.dot(out[k])
        if cfg.markov_rank:
            e = W["markov_head.markov_w1.weight"][prev]
            row = row + W["markov_head.markov_w2.weight"].dot(e)
        if cfg.conf:
            f = out[k]
            if cfg.conf_markov:
                f = np.concatenate([f, W["markov_head.markov_w1.weight"][prev]])
            z = W["confidence_head.proj.weight"][0].dot(f) + W["confidence_head.proj.bias"][0]
            conf.append(1.0 / (1.0 + np.exp(-z)))
        prev = int(np.argmax(row))
        drafts.append(prev)
    width = B
    if cfg.conf and conf_threshold > 0:
        for k, c in enumerate(conf):
            if c < conf_threshold:
                width = k
                break
    return drafts[:width], conf


# ---------------------------------------------------------------------------------------------
# checks on one run
# ---------------------------------------------------------------------------------------------

def check_trace(what, cfg, res, prompt, max_tokens, stop_ids=(), conf_threshold=0.0, conf_fn=None):
    trace, toks = res["trace"], res["tokens"]
    n = len(prompt)
    W = cfg.width
    ok = True
    produced = 1
    for s, st in enumerate(trace):
        ok &= check(st["step"] == s, "%s: step numbering %r at %d" % (what, st["step"], s))
        ok &= check(0 <= st["accepted"] <= len(st["drafts"]) <= W,
                    "%s: step %d accepted %d drafts %d W %d" % (what, s, st["accepted"], len(st["drafts"]), W))
        ok &= check(st["start"] == n + produced - 1, "%s: step %d start %d, expected %d"
                    % (what, s, st["start"], n + produced - 1))
        ok &= check(len(st["drafts"]) <= max_tokens - produced - 1,
                    "%s: step %d verifies %d drafts with only %d tokens left"
                    % (what, s, len(st["drafts"]), max_tokens - produced))
        if st["bonus"] < 0:
            ok &= check(st["drafts"][st["accepted"] - 1] in set(stop_ids) and s == len(trace) - 1,
                        "%s: step %d has no bonus but did not stop on an accepted stop token" % (what, s))
        ok &= check(st["anchor"] == toks[produced - 1], "%s: step %d anchor %d != token %d"
                    % (what, s, st["anchor"], toks[produced - 1]))
        produced += res["acceptance_lengths"][s]
        if s + 1 < len(trace):
            ok &= check(res["acceptance_lengths"][s] == st["accepted"] + 1,
                        "%s: step %d committed %d but accepted %d (not the last step)"
                        % (what, s, res["acceptance_lengths"][s], st["accepted"]))
            ok &= check(trace[s + 1]["anchor"] == st["bonus"], "%s: step %d bonus does not become the next anchor" % (what, s))
    ok &= check(produced == len(toks), "%s: acceptance_lengths sum %d + 1 != %d tokens" % (what, produced - 1, len(toks)))
    rebuilt = rs.tokens_from_trace(trace, max_tokens, stop_ids, first=toks[0] if toks else None)
    ok &= check(rebuilt == toks, "%s: tokens not reconstructable from the trace" % what)
    return ok


def run_case(what, target, ddir, prompt, max_tokens, stop_ids=(), conf_threshold=0.0, naive=True,
             want_accept=False):
    drafter = rs.Drafter(ddir, target)
    cfg = drafter.cfg
    res = rs.spec_generate(target, drafter, prompt, max_tokens, stop_ids, conf_threshold)
    base, _ = rs.target_greedy(target, prompt, max_tokens, stop_ids)
    check(res["tokens"] == base, "%s: speculative output != plain greedy\n  spec   %s\n  greedy %s"
          % (what, res["tokens"], base))
    stopped = bool(stop_ids) and bool(base) and base[-1] in set(stop_ids)
    check(res["finish_reason"] == ("stop" if stopped else "length"), "%s: finish_reason %s" % (what, res["finish_reason"]))
    check_trace(what, cfg, res, prompt, max_tokens, stop_ids, conf_threshold)
    if want_accept:
        accs = [st["accepted"] for st in res["trace"]]
        check(any(a > 0 for a in accs), "%s: engineered drafter never accepted anything %s" % (what, accs))
    # context K/V: incremental == from scratch
    L = drafter.ctx_len()
    committed = list(prompt) + res["tokens"][:L - len(prompt)]
    check(len(committed) == L, "%s: context length %d vs committed %d" % (what, L, len(committed)))
    _, hid = target.forward(committed, None, return_hidden=True)
    scratch = drafter.context_kv(rs.target_feats(target, committed, hid, cfg.target_layer_ids), range(L))
    err = max(max(np.max(np.abs(k - drafter.ctx_k[l])), np.max(np.abs(v - drafter.ctx_v[l])))
              for l, (k, v) in enumerate(scratch))
    check(err < 1e-9, "%s: incremental context K/V differs from scratch by %.3g" % (what, err))
    # naive re-implementation of every step's drafts (a few steps to keep it quick)
    if naive:
        steps = res["trace"]
        pick = sorted(set([0, len(steps) // 2, len(steps) - 1])) if steps else []
        for s in pick:
            st = steps[s]
            committed = list(prompt) + res["tokens"][:st["start"] - len(prompt)]
            nd, _ = naive_drafts(target, drafter, committed, st["anchor"], conf_threshold)
            k = len(st["drafts"])
            exp = nd[:min(len(nd), k)]
            check(exp == st["drafts"] and (len(nd) >= k),
                  "%s: step %d drafts %s != naive %s" % (what, s, st["drafts"], nd))
            if conf_threshold > 0:
                left = len(prompt) + max_tokens - st["start"] - 2
                check(k == min(len(nd), left), "%s: step %d verify width %d, naive cut %d, budget %d"
                      % (what, s, k, len(nd), left))
    return res


# ---------------------------------------------------------------------------------------------
# layout / config checks
# ---------------------------------------------------------------------------------------------

def layout_checks(tmp, tdir, target):
    check(rs.default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33], "default ids 36/5")
    check(rs.default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25], "default ids 28/5")
    check(rs.default_target_layer_ids(36, 1) == [18], "default ids 36/1")
    check(rs.default_target_layer_ids(9, 3) == [1, 4, 6], "default ids 9/3 (round half even 3.5 -> 4)")
    check(rs.default_target_layer_ids(11, 3) == [1, 4, 8], "default ids 11/3 (round half even 4.5 -> 4)")

    tdict = json.load(open(os.path.join(tdir, "config.json")))
    H, V = tdict["hidden_size"], tdict["vocab_size"]
    # DFlash names (z-lab layout, no prefix, no embed / lm_head)
    d = os.path.join(tmp, "lay_dflash")
    cfg = rs.write_random_drafter(d, "dflash", tdir, seed=1, layers=2, block_size=5, target_layer_ids=[0, 2])
    names = {t.name: t.shape for t in rm.read_safetensors(os.path.join(d, "model.safetensors"))[0]}
    want = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,),
            "layers.1.self_attn.k_norm.weight": (cfg.head_dim,), "layers.0.mlp.down_proj.weight": (H, cfg.inter)}
    for n_, s_ in want.items():
        check(names.get(n_) == s_, "dflash layout: %s shape %s, expected %s" % (n_, names.get(n_), s_))
    check(not any(n_.startswith("model.") or "embed_tokens" in n_ or "lm_head" in n_ for n_ in names),
          "dflash layout: unexpected prefix / embed / head: %s" % sorted(names))
    check(len(names) == 3 + 2 * 11, "dflash layout: %d tensors" % len(names))
    c = json.load(open(os.path.join(d, "config.json")))
    check(c["architectures"] == ["DFlashDraftModel"] and c["block_size"] == 5 and
          c["dflash_config"]["target_layer_ids"] == [0, 2] and "mask_token_id" in c["dflash_config"],
          "dflash config fields: %s" % c)
    # DSpark names (DeepSpec layout)
    d2 = os.path.join(tmp, "lay_dspark")
    rs.write_random_drafter(d2, "dspark", tdir, seed=1, layers=1, block_size=4, target_layer_ids=[1],
                            markov_rank=8, enable_conf=True, conf_markov=True)
    names2 = {t.name: t.shape for t in rm.read_safetensors(os.path.join(d2, "model.safetensors"))[0]}
    for n_, s_ in {"embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "fc.weight": (H, H),
                   "markov_head.markov_w1.weight": (V, 8), "markov_head.markov_w2.weight": (V, 8),
                   "confidence_head.proj.weight": (1, H + 8), "confidence_head.proj.bias": (1,)}.items():
        check(names2.get(n_) == s_, "dspark layout: %s shape %s, expected %s" % (n_, names2.get(n_), s_))
    c2 = json.load(open(os.path.join(d2, "config.json")))
    for f in ("block_size", "num_target_layers", "target_layer_ids", "mask_token_id", "markov_rank",
              "markov_head_type", "enable_confidence_head", "confidence_head_with_markov", "num_anchors"):
        check(f in c2, "dspark config lacks %s" % f)
    check(c2["architectures"] == ["Qwen3DSparkModel"] and c2["tie_word_embeddings"] is False, "dspark arch / tie")
    d3 = os.path.join(tmp, "lay_dspark_nomk")
    rs.write_random_drafter(d3, "dspark", tdir, seed=1, layers=1, block_size=4, target_layer_ids=[1],
                            markov_rank=0, enable_conf=True, conf_markov=False)
    names3 = {t.name: t.shape for t in rm.read_safetensors(os.path.join(d3, "model.safetensors"))[0]}
    check(names3.get("confidence_head.proj.weight") == (1, H) and not any("markov" in n_ for n_ in names3),
          "dspark without Markov: %s" % sorted(names3))
    check("markov_head_type" not in json.load(open(os.path.join(d3, "config.json"))), "markov_head_type written with rank 0")

    # strict loader: missing / extra / shape / dtype / config problems
    base_w = rs.random_drafter_weights(cfg, seed=2)
    cdict = json.load(open(os.path.join(d, "config.json")))

    def expect_fail(label, cfgd, w, needle):
        dd = os.path.join(tmp, "bad")
        shutil.rmtree(dd, ignore_errors=True)
        try:
            rs.write_drafter(dd, cfgd, w)
            rs.Drafter(dd, target)
        except rm.FormatError as e:
            check(needle in str(e), "%s: error %r lacks %r" % (label, str(e), needle))
            return
        check(False, "%s: loader accepted a bad drafter" % label)

    w = dict(base_w)
    del w["layers.1.self_attn.k_norm.weight"]
    expect_fail("missing", cdict, w, "missing")
    w = dict(base_w)
    w["model.fc.weight"] = base_w["fc.weight"]
    expect_fail("extra", cdict, w, "unexpected")
    w = dict(base_w)
    w["fc.weight"] = np.zeros((H, 3 * H))
    expect_fail("shape", cdict, w, "shape")
    c_bad = json.loads(json.dumps(cdict))
    for bad_ids in ([0, 99], [-2, 0], [1, 1]):  # DeepSpec validate_target_layer_ids: refused by the config
        c_bad["dflash_config"]["target_layer_ids"] = bad_ids
        try:
            rs.DraftConfig(c_bad)
            check(False, "target_layer_ids %r accepted" % (bad_ids,))
        except rm.FormatError as e:
            check("target_layer_ids" in str(e), "layer ids %r: %s" % (bad_ids, e))
    c_bad = json.loads(json.dumps(cdict))
    c_bad["dflash_config"]["mask_token_id"] = V
    try:
        rs.DraftConfig(c_bad)
        check(False, "mask id outside vocab accepted")
    except rm.FormatError:
        check(True, "")
    c_bad = json.loads(json.dumps(cdict))
    c_bad["hidden_size"] = H * 2
    try:
        rs.write_drafter(os.path.join(tmp, "bad2"), c_bad, rs.random_drafter_weights(rs.DraftConfig(c_bad), seed=2))
        rs.Drafter(os.path.join(tmp, "bad2"), target)
        check(False, "hidden mismatch accepted")
    except rm.FormatError as e:
        check("hidden_size" in str(e), "hidden mismatch message %r" % str(e))
    # default rule used when target_layer_ids is absent
    c_def = json.loads(json.dumps(cdict))
    del c_def["dflash_config"]["target_layer_ids"]
    dc = rs.DraftConfig(c_def)
    check(dc.target_layer_ids == rs.default_target_layer_ids(c_def["num_target_layers"], 2),
          "absent target_layer_ids -> default rule: %s" % dc.target_layer_ids)
    # block_size nested in dflash_config (newer z-lab configs) wins over the top-level one
    c_nest = json.loads(json.dumps(cdict))
    c_nest["dflash_config"]["block_size"] = 9
    check(rs.DraftConfig(c_nest).block_size == 9, "dflash_config.block_size not honoured")
    # sharded drafter loads the same
    d4 = os.path.join(tmp, "lay_sharded")
    rs.write_drafter(d4, cdict, base_w, shards=3, order_seed=5)
    dr = rs.Drafter(d4, target)
    check(all(np.array_equal(dr.w[k], rm.round_to_dtype(rm.TORCH_DTYPE_TO_ST[cdict["torch_dtype"]], base_w[k]))
              for k in base_w), "sharded drafter round trip")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

def main():
    tmp = tempfile.mkdtemp(prefix="gs_spec_self_")
    try:
        targets = []
        for name, tie, seed, L, dt in (("t_untied", False, 1, 5, "float32"), ("t_tied", True, 2, 4, "bfloat16"),
                                       ("t_untied2", False, 2, 6, "bfloat16")):
            tdir = os.path.join(tmp, name)
            tc = rm.make_config_dict("qwen3", 48, L, 4, 2, 12, 96, 200, tie, dtype=dt)
            rm.write_random_checkpoint(tdir, tc, seed=seed, std=0.5)
            targets.append((name, tdir, rm.RefModel(tdir)))
        layout_checks(tmp, targets[0][1], targets[0][2])

        rng = np.random.default_rng(7)
        prompts = [[int(x) for x in rng.integers(0, 190, size=n)] for n in (1, 6, 13)]
        ddir = os.path.join(tmp, "draft")
        case = 0
        # random drafters: DFlash over block sizes / depths, DSpark over Markov / confidence variants
        for ti, (tname, tdir, target) in enumerate(targets):
            L = target.cfg.layers
            for bs, layers in ((2, 1), (4, 2), (7, 3), (16, 1)):
                tl = [0, L - 2] if layers > 1 else [L // 2]
                rs.write_random_drafter(ddir, "dflash", tdir, seed=10 + case, layers=layers, block_size=bs,
                                        target_layer_ids=tl)
                for pi, p in enumerate(prompts):
                    run_case("%s dflash B=%d l=%d p%d" % (tname, bs, layers, pi), target, ddir, p, 24,
                             naive=(pi == 1))
                case += 1
            for bs, layers, rank, conf, cm in ((1, 1, 0, False, False), (4, 2, 8, True, True),
                                               (7, 1, 16, True, False), (12, 3, 4, False, False)):
                rs.write_random_drafter(ddir, "dspark", tdir, seed=20 + case, layers=layers, block_size=bs,
                                        target_layer_ids=[-1, L - 1] if ti == 0 else [1], markov_rank=rank,
                                        enable_conf=conf, conf_markov=cm, own_head="perturb")
                for pi, p in enumerate(prompts):
                    run_case("%s dspark B=%d l=%d r=%d conf=%s/%s p%d" % (tname, bs, layers, rank, conf, cm, pi),
                             target, ddir, p, 24, naive=(pi == 1))
                case += 1

        # engineered drafters with real acceptance
        for tname, tdir, target in targets:
            L = target.cfg.layers
            p = prompts[1]
            g, _ = rs.target_greedy(target, p, 40)
            freq = max(set(g), key=g.count)
            for bs, scale in ((4, 0.0), (8, 0.3), (16, 0.0)):
                rs.write_random_drafter(ddir, "dflash", tdir, seed=30 + bs, layers=2, block_size=bs,
                                        target_layer_ids=[0, L - 2], mask_token_id=freq, layer_out_scale=scale)
                r = run_case("%s dflash-eng B=%d" % (tname, bs), target, ddir, p, 40, naive=True)
                run_case("%s dflash-eng B=%d budget 5" % (tname, bs), target, ddir, p, 5, naive=False)
                run_case("%s dflash-eng B=%d budget 1" % (tname, bs), target, ddir, p, 1, naive=False)
            tdict = json.load(open(os.path.join(tdir, "config.json")))
            pairs = list(zip([p[-1]] + g[:-1], g))
            for bs, rank, conf, cm, scale in ((3, 16, False, False, 8.0), (7, 32, True, True, 8.0),
                                               (10, 32, True, False, 3.0)):
                cd = rs.make_drafter_config("dspark", tdict, layers=2, block_size=bs, target_layer_ids=[0, L - 2],
                                            markov_rank=rank, enable_conf=conf, conf_markov=cm)
                dcfg = rs.DraftConfig(cd)
                ov = rs.markov_override(dcfg, pairs, scale=scale, seed=bs, noise=0.3)
                w = rs.random_drafter_weights(dcfg, seed=40 + bs, target=target, own_head="perturb", overrides=ov)
                rs.write_drafter(ddir, cd, w)
                what = "%s dspark-eng B=%d r=%d conf=%s/%s" % (tname, bs, rank, conf, cm)
                run_case(what, target, ddir, p, 40, naive=True, want_accept=True)
                run_case(what + " budget 6", target, ddir, p, 6, naive=False)
                if conf:
                    dr = rs.Drafter(ddir, target)
                    confs = []
                    rr = rs.spec_generate(target, dr, p, 40)
                    # thresholds: median-ish confidence, and 1.0 (every step cut to zero drafts)
                    for st in rr["trace"][:3]:
                        committed = list(p) + rr["tokens"][:st["start"] - len(p)]
                        _, c = naive_drafts(target, dr, committed, st["anchor"])
                        confs.extend(c)
                    thr = float(np.median(confs))
                    run_case(what + " thr=%.3f" % thr, target, ddir, p, 40, conf_threshold=thr, naive=True)
                    r1 = run_case(what + " thr=1", target, ddir, p, 12, conf_threshold=1.0, naive=True)
                    check(all(len(st["drafts"]) == 0 for st in r1["trace"]) and len(r1["trace"]) == 11,
                          "%s thr=1: expected 11 draft-free steps, got %s" % (what, [len(st["drafts"]) for st in r1["trace"]]))
                    r0 = rs.spec_generate(target, rs.Drafter(ddir, target), p, 40, conf_threshold=0.0)
                    check(r0["trace"] == rr["trace"], "%s: threshold 0 must not cut" % what)

            # stop tokens: the first occurrence of a token in the greedy output ends generation there
            stop_tok = g[7]
            rs.write_random_drafter(ddir, "dflash", tdir, seed=50, layers=1, block_size=6,
                                    target_layer_ids=[1], mask_token_id=freq, layer_out_scale=0.0)
            r = run_case("%s dflash stop" % tname, target, ddir, p, 40, stop_ids=[stop_tok], naive=False)
            check(r["tokens"] == g[:g.index(stop_tok) + 1] and r["finish_reason"] == "stop",
                  "%s: stop at first %d: %s" % (tname, stop_tok, r["tokens"]))
            r = run_case("%s dflash stop=first" % tname, target, ddir, p, 40, stop_ids=[g[0]], naive=False)
            check(r["tokens"] == [g[0]] and r["trace"] == [], "%s: stop on the prefill token" % tname)
            # a stop token inside an accepted run of drafts: accepted counts through it, no bonus
            for cand in sorted(set(g[3:30]), key=g.index):
                if g.index(cand) < 3:
                    continue
                r = run_case("%s dflash stop=%d" % (tname, cand), target, ddir, p, 40, stop_ids=[cand], naive=False)
                if r["trace"] and r["trace"][-1]["bonus"] == -1:
                    STOP_IN_DRAFTS.append(tname)
                    break

        check(len(STOP_IN_DRAFTS) > 0, "no run stopped on a stop token inside accepted drafts (coverage)")
        # incremental context rows really are position-by-position: adding in pieces == adding at once
        tname, tdir, target = targets[0]
        rs.write_random_drafter(ddir, "dflash", tdir, seed=3, layers=2, block_size=4, target_layer_ids=[0, 3])
        dr = rs.Drafter(ddir, target)
        seq = prompts[2]
        _, hid = target.forward(seq, None, return_hidden=True)
        feats = rs.target_feats(target, seq, hid, dr.cfg.target_layer_ids)
        dr.add_context(feats[:5], range(5))
        dr.add_context(feats[5:6], [5])
        dr.add_context(feats[6:], range(6, len(seq)))
        whole = dr.context_kv(feats, range(len(seq)))
        err = max(np.max(np.abs(whole[l][0] - dr.ctx_k[l])) for l in range(dr.cfg.layers))
        check(err < 1e-12, "piecewise context K differs by %.3g" % err)
        try:
            dr.add_context(feats[:1], [3])
            check(False, "non-contiguous context positions accepted")
        except ValueError:
            check(True, "")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (PASSED, FAILED), flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
