"""Engine behaviour through the `graphswap generate` CLI.

(a) plan replay == eager (--eager): bitwise equal token_ids / logprobs / top_logprobs text
(b) chunked prefill (--prefill-chunk 1, 3, 7) == one-shot prefill, bitwise
(c) batch invariance: a --batch-file of ~10 prompts (different lengths and max_tokens) gives, for each
    request, exactly what that request gives alone (floats compared as printed)
(d) seeded sampling: same seed => same output, alone and inside a batch; different seed => different
(e) load errors: missing / unknown / mis-shaped / I32 tensor, truncated safetensors, unknown
    architecture => non-zero exit, "graphswap: error:" on stderr naming the tensor (or file / arch)
(f) prompt logprobs (--prompt-logprobs / "prompt_logprobs"): the same bits alone, in a 2-slot batch
    with small steps (scoring rows next to other sequences' sampling rows), chunked, eager, after the
    same prompt filled the prefix cache (scoring computes it again), and with a DFlash drafter; the
    generated tokens are unchanged by asking for them (values are checked against the numpy reference
    in tests/reference/test_reference.py)
(h) --bf16-activations (bf16 weights, activations rounded to bf16 in every matmul): plan replay ==
    eager, a batch == each request alone, and every instruction set (GS_KERN_ISA) gives the same
    bits; the logprobs move from the default mode's (the mode is on) by little (it is rounding);
    --backend cuda refuses the option; on an f32 checkpoint it warns that it changes nothing
(g) the command surface: `graphswap --help` lists every command, `graphswap bench --help` every
    bench; mkmodel reports the folder, its files and the parameter count of what it wrote;
    `generate --prompt TEXT` encodes as POST /tokenize does (same ids, BOS included) and prints the
    same tokens as --prompt-ids and the same text as /v1/completions; `bench spec` prints one
    acceptance column per draft position with a header explaining the columns, and warns when the
    machine measures below the expected memcpy figure
"""

import json
import os
import re
import shutil
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, HERE)
import gs_harness as H  # noqa: E402
import ref_model as rm  # noqa: E402

C = H.Checker("engine_cli")


def key(obj, with_top=True):
    """The bitwise-comparable part of an output object (floats are the printed text)."""
    k = {"token_ids": obj.get("token_ids"), "logprobs": obj.get("logprobs"), "finish_reason": obj.get("finish_reason")}
    if with_top:
        k["top_logprobs"] = obj.get("top_logprobs")
    return json.dumps(k, sort_keys=True)


def same(what, a, b, with_top=True):
    if a is None or b is None:
        return False
    ka, kb = key(a, with_top), key(b, with_top)
    if ka == kb:
        return C.check(True, "")
    # point at the first difference
    detail = ""
    for f in ("token_ids", "logprobs", "top_logprobs", "finish_reason"):
        va, vb = a.get(f), b.get(f)
        if va != vb:
            if isinstance(va, list) and isinstance(vb, list):
                idx = next((i for i in range(min(len(va), len(vb))) if va[i] != vb[i]), min(len(va), len(vb)))
                detail = "%s first differs at index %d: %r vs %r (lengths %d, %d)" % (
                    f, idx, va[idx] if idx < len(va) else None, vb[idx] if idx < len(vb) else None, len(va), len(vb))
            else:
                detail = "%s: %r vs %r" % (f, va, vb)
            break
    return C.fail("%s: outputs differ: %s" % (what, detail))


def build_models(binary, tmp):
    models = {}
    specs = {
        # head_dim != hidden/heads, GQA 2, 2 layers
        "qwen3": ("qwen3", dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, inter=128, vocab=512,
                                tie=False, dtype="bf16", seed=5)),
        "qwen2": ("qwen2", dict(hidden=64, layers=2, heads=4, kv_heads=1, head_dim=16, inter=96, vocab=384,
                                tie=True, dtype="bf16", seed=6)),
    }
    for name, (arch, g) in specs.items():
        d = os.path.join(tmp, "model_" + name)
        res = H.mkmodel(binary, d, arch, **g)
        if C.check(res.rc == 0, "mkmodel %s exited %s: %s" % (name, res.rc, res.stderr.strip())):
            models[name] = (d, g["vocab"])
    return models


def rand_prompt(rng, vocab, n):
    return [int(x) for x in rng.integers(0, vocab, size=n)]


# ------------------------------------------------------------------------------------------------
# (a) plan replay vs eager, (b) chunked prefill
# ------------------------------------------------------------------------------------------------

def test_eager_and_chunks(binary, tmp, models):
    rng = np.random.default_rng(21)
    for mname, (d, vocab) in models.items():
        prompts = [rand_prompt(rng, vocab, 5), rand_prompt(rng, vocab, 17)]
        for pi, p in enumerate(prompts):
            base_what = "%s prompt%d" % (mname, pi)
            base = H.generate(C, base_what + " default", binary, d, p, max_tokens=16, logprobs=3)
            if base is not None:
                H.validate_shape(C, base_what + " default", base, 16, 3)
            eager = H.generate(C, base_what + " --eager", binary, d, p, max_tokens=16, logprobs=3, eager=True)
            same("(a) %s: plan replay vs --eager" % base_what, base, eager)
            for ch in (1, 3, 7):
                o = H.generate(C, base_what + " --prefill-chunk %d" % ch, binary, d, p, max_tokens=16, logprobs=3,
                               prefill_chunk=ch)
                same("(b) %s: --prefill-chunk %d vs one-shot" % (base_what, ch), base, o)
            o = H.generate(C, base_what + " --eager --prefill-chunk 3", binary, d, p, max_tokens=16, logprobs=3,
                           prefill_chunk=3, eager=True)
            same("(a+b) %s: --eager --prefill-chunk 3 vs default" % base_what, base, o)
        # sampled: replay vs eager must also agree bitwise (same seed)
        p = prompts[1]
        s1 = H.generate(C, mname + " sampled", binary, d, p, max_tokens=16, logprobs=2, temperature=0.9, top_k=40,
                        seed=77)
        s2 = H.generate(C, mname + " sampled --eager", binary, d, p, max_tokens=16, logprobs=2, temperature=0.9,
                        top_k=40, seed=77, eager=True)
        same("(a) %s: sampled plan replay vs --eager" % mname, s1, s2)
        s3 = H.generate(C, mname + " sampled --prefill-chunk 3", binary, d, p, max_tokens=16, logprobs=2,
                        temperature=0.9, top_k=40, seed=77, prefill_chunk=3)
        same("(b) %s: sampled --prefill-chunk 3 vs one-shot" % mname, s1, s3)


# ------------------------------------------------------------------------------------------------
# (c) batch invariance, (d) seeded sampling
# ------------------------------------------------------------------------------------------------

def alone(binary, d, req, what, eager=False):
    return H.generate(C, what, binary, d, req["prompt_ids"], max_tokens=req["max_tokens"],
                      temperature=req.get("temperature"), top_k=req.get("top_k"), top_p=req.get("top_p"),
                      min_p=req.get("min_p"), seed=req.get("seed"), logprobs=req.get("logprobs"),
                      ignore_eos=req.get("ignore_eos", False), eager=eager)


def test_batch(binary, tmp, models):
    rng = np.random.default_rng(33)
    for mname, (d, vocab) in models.items():
        lens = [1, 2, 3, 5, 8, 13, 21, 4, 30, 9, 16]
        maxt = [7, 12, 3, 16, 1, 9, 5, 14, 11, 2, 20]
        reqs = []
        for i, (n, m) in enumerate(zip(lens, maxt)):
            r = {"prompt_ids": rand_prompt(rng, vocab, n), "max_tokens": m, "logprobs": 2 if i % 3 else 0,
                 "ignore_eos": True, "temperature": 0.0}
            reqs.append(r)
        # seeded sampling requests mixed in (d)
        sp = rand_prompt(rng, vocab, 6)
        reqs.append({"prompt_ids": sp, "max_tokens": 12, "temperature": 1.0, "seed": 1234, "logprobs": 1,
                     "ignore_eos": True})
        reqs.append({"prompt_ids": rand_prompt(rng, vocab, 11), "max_tokens": 10, "temperature": 0.8, "top_k": 30,
                     "top_p": 0.9, "seed": 99, "logprobs": 0, "ignore_eos": True})
        reqs.append({"prompt_ids": rand_prompt(rng, vocab, 4), "max_tokens": 8, "temperature": 1.0, "min_p": 0.2,
                     "seed": 5, "ignore_eos": True})
        # a request without ignore_eos: must still be batch invariant (may stop at eos)
        reqs.append({"prompt_ids": rand_prompt(rng, vocab, 7), "max_tokens": 15, "temperature": 0.0})
        bpath = os.path.join(tmp, "batch_%s.jsonl" % mname)
        outs = H.generate_batch(C, "(c) %s batch" % mname, binary, d, reqs, bpath)
        outs_e = H.generate_batch(C, "(a) %s batch --eager" % mname, binary, d, reqs, bpath + ".eager", eager=True)
        if outs is None:
            continue
        for i, r in enumerate(reqs):
            what = "%s request %d (prompt len %d, max_tokens %d, T %s)" % (
                mname, i, len(r["prompt_ids"]), r["max_tokens"], r.get("temperature"))
            k = r.get("logprobs") or 0
            H.validate_shape(C, "(c) batch " + what, outs[i], r["max_tokens"] if r.get("ignore_eos") else None, k)
            a = alone(binary, d, r, "alone " + what)
            same("(c/d) %s: in batch vs alone" % what, outs[i], a, with_top=k > 0)
            if outs_e is not None:
                same("(a) %s: batch plan replay vs batch --eager" % what, outs[i], outs_e[i], with_top=k > 0)
        # the same batch in reverse order: each request's output unchanged
        rev = list(reversed(reqs))
        outs_r = H.generate_batch(C, "(c) %s reversed batch" % mname, binary, d, rev, bpath + ".rev")
        if outs_r is not None:
            for i in range(len(reqs)):
                same("(c) %s request %d: batch order reversed" % (mname, i), outs[i], outs_r[len(reqs) - 1 - i])
        # (d) seeded sampling
        sreq = reqs[len(lens)]
        a1 = alone(binary, d, sreq, "(d) %s seed 1234 run 1" % mname)
        a2 = alone(binary, d, sreq, "(d) %s seed 1234 run 2" % mname)
        same("(d) %s: same seed twice" % mname, a1, a2)
        other = dict(sreq, seed=4321)
        b1 = alone(binary, d, other, "(d) %s seed 4321" % mname)
        if a1 is not None and b1 is not None and len(a1.get("logprobs") or []) == len(a1["token_ids"]):
            # at temperature 1 without filters the sampling distribution is the raw one, so the chance that
            # another seed reproduces a1 exactly is about exp(sum of a1's logprobs)
            p_same = float(np.exp(sum(H.num(x) for x in a1["logprobs"])))
            if p_same < 1e-6:
                C.check(a1["token_ids"] != b1["token_ids"], "(d) %s: seeds 1234 and 4321 gave identical samples %s "
                        "(chance about %.1e)" % (mname, a1["token_ids"], p_same))
            else:
                print("  note: (d) %s: distribution too peaked to compare seeds (P(same) %.2e)" % (mname, p_same))
        # the same seeded request twice in one batch (different slots) -> identical outputs
        dup = [sreq, reqs[0], sreq]
        od = H.generate_batch(C, "(d) %s duplicate seeded batch" % mname, binary, d, dup, bpath + ".dup")
        if od is not None:
            same("(d) %s: same seeded request in two batch slots" % mname, od[0], od[2])
            same("(d) %s: seeded request in batch vs alone" % mname, od[0], a1)


# ------------------------------------------------------------------------------------------------
# (e) load errors
# ------------------------------------------------------------------------------------------------

def copy_model(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def rewrite(d, mutate):
    """Rewrites every safetensors file of d with mutate(list of RawTensor, file name) -> list.
    Keeps the index's weight_map consistent with what is written."""
    wm, index = rm.checkpoint_files(d)
    files = ["model.safetensors"] if wm is None else sorted(set(wm.values()))
    for fn in files:
        path = os.path.join(d, fn)
        tensors, meta = rm.read_safetensors(path)
        new = mutate(tensors, fn)
        rm.write_safetensors(path, new, meta)
        if wm is not None:
            for t in tensors:
                wm.pop(t.name, None)
            for t in new:
                wm[t.name] = fn
    if wm is not None:
        total = 0
        for fn in files:
            total += sum(len(t.data) for t in rm.read_safetensors(os.path.join(d, fn))[0])
        index["weight_map"] = wm
        index.setdefault("metadata", {})["total_size"] = total
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)


def expect_error(what, binary, d, must_contain, any_of=()):
    res = H.run(H.generate_args(binary, d, [1, 2, 3], max_tokens=2))
    err = res.stderr
    if not C.check(res.rc != 0 and res.rc != "timeout",
                   "(e) %s: generate should fail but exited %s (stdout %r)" % (what, res.rc, res.stdout[-300:])):
        return
    C.check(isinstance(res.rc, int) and res.rc > 0,
            "(e) %s: generate died from a signal / timeout (rc %s) instead of a clean error" % (what, res.rc))
    C.check("graphswap: error:" in err, "(e) %s: stderr lacks 'graphswap: error:': %r" % (what, err[-500:]))
    for s in must_contain:
        C.check(s.lower() in err.lower(), "(e) %s: error message does not mention %r: %r" % (what, s, err[-500:]))
    if any_of:
        C.check(any(s.lower() in err.lower() for s in any_of),
                "(e) %s: error message mentions none of %s: %r" % (what, list(any_of), err[-500:]))
    C.check("token_ids" not in res.stdout, "(e) %s: printed a result despite the error: %r" % (what, res.stdout[-300:]))


def test_load_errors(binary, tmp):
    src = os.path.join(tmp, "err_src")
    res = H.mkmodel(binary, src, "qwen3", hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, inter=64, vocab=256,
                    tie=False, dtype="bf16", seed=9)
    if not C.check(res.rc == 0, "(e) mkmodel exited %s: %s" % (res.rc, res.stderr.strip())):
        return
    src_sh = os.path.join(tmp, "err_src_sharded")
    res = H.mkmodel(binary, src_sh, "qwen3", hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, inter=64,
                    vocab=256, tie=False, dtype="bf16", seed=9, shards=3)
    C.check(res.rc == 0, "(e) mkmodel --shards 3 exited %s: %s" % (res.rc, res.stderr.strip()))

    # control: a copy rewritten by our writer without changes loads and gives the same output
    ctl = copy_model(src, os.path.join(tmp, "err_control"))
    rewrite(ctl, lambda ts, fn: list(reversed(ts)))  # different tensor order in the file, same content
    o1 = H.generate(C, "(e) original", binary, src, [1, 2, 3], max_tokens=4, logprobs=2)
    o2 = H.generate(C, "(e) control rewrite (reordered tensors)", binary, ctl, [1, 2, 3], max_tokens=4, logprobs=2)
    same("(e) control: rewritten checkpoint vs original", o1, o2)
    if os.path.isdir(src_sh):
        # sharding is a storage detail: when mkmodel wrote the same values, outputs must be identical
        try:
            t1 = rm.read_checkpoint_tensors(src)
            t3 = rm.read_checkpoint_tensors(src_sh)
            same_values = set(t1) == set(t3) and all(t1[n].data == t3[n].data for n in t1)
        except rm.FormatError as e:
            C.fail("(e) control: cannot read mkmodel checkpoints: %s" % e)
            same_values = False
        if same_values:
            o3 = H.generate(C, "(e) sharded original", binary, src_sh, [1, 2, 3], max_tokens=4, logprobs=2)
            same("(e) control: --shards 3 vs unsharded (same tensor values)", o1, o3)

    # (i) drop one tensor
    name = "model.layers.1.mlp.up_proj.weight"
    d = copy_model(src, os.path.join(tmp, "err_drop"))
    rewrite(d, lambda ts, fn: [t for t in ts if t.name != name])
    expect_error("missing tensor", binary, d, [name], any_of=["missing"])
    if os.path.isdir(src_sh):
        d = copy_model(src_sh, os.path.join(tmp, "err_drop_sharded"))
        rewrite(d, lambda ts, fn: [t for t in ts if t.name != name])  # also removed from the index
        expect_error("missing tensor (sharded, index updated)", binary, d, [name], any_of=["missing"])

    # (ii) extra unknown tensor
    extra = "model.layers.0.mlp.extra_proj.weight"
    d = copy_model(src, os.path.join(tmp, "err_extra"))
    rewrite(d, lambda ts, fn: ts + [rm.RawTensor(extra, "BF16", (4, 32), rm.encode_array("BF16", np.ones((4, 32))))])
    expect_error("unknown tensor", binary, d, [extra], any_of=["unknown", "unexpected"])

    # (iii) wrong shape (one row fewer)
    shp = "model.layers.0.self_attn.k_proj.weight"

    def shrink(ts, fn):
        out = []
        for t in ts:
            if t.name == shp:
                a = t.to_f64()[:-1]
                t = rm.RawTensor(t.name, t.dtype, a.shape, rm.encode_array(t.dtype, a))
            out.append(t)
        return out
    d = copy_model(src, os.path.join(tmp, "err_shape"))
    rewrite(d, shrink)
    expect_error("wrong shape", binary, d, [shp], any_of=["shape"])

    # (iii-b) wrong shape of a 1-D tensor (q_norm over head_dim)
    shp2 = "model.layers.1.self_attn.q_norm.weight"

    def grow(ts, fn):
        out = []
        for t in ts:
            if t.name == shp2:
                a = np.concatenate([t.to_f64(), np.ones(2)])
                t = rm.RawTensor(t.name, t.dtype, a.shape, rm.encode_array(t.dtype, a))
            out.append(t)
        return out
    d = copy_model(src, os.path.join(tmp, "err_shape2"))
    rewrite(d, grow)
    expect_error("wrong shape (1-D)", binary, d, [shp2], any_of=["shape"])

    # (iv) integer dtype
    i32 = "model.norm.weight"

    def to_i32(ts, fn):
        out = []
        for t in ts:
            if t.name == i32:
                t = rm.RawTensor(t.name, "I32", t.shape, rm.encode_array("I32", np.ones(t.shape, dtype=np.int32)))
            out.append(t)
        return out
    d = copy_model(src, os.path.join(tmp, "err_i32"))
    rewrite(d, to_i32)
    expect_error("I32 dtype", binary, d, [i32], any_of=["dtype", "I32"])

    # truncated safetensors (data section cut short)
    d = copy_model(src, os.path.join(tmp, "err_trunc"))
    p = os.path.join(d, "model.safetensors")
    with open(p, "rb") as f:
        raw = f.read()
    with open(p, "wb") as f:
        f.write(raw[:len(raw) - 100])
    expect_error("truncated safetensors (data)", binary, d, ["model.safetensors"])
    # truncated inside the header
    with open(p, "wb") as f:
        f.write(raw[:40])
    expect_error("truncated safetensors (header)", binary, d, ["model.safetensors"])
    # empty file
    with open(p, "wb") as f:
        pass
    expect_error("empty safetensors", binary, d, ["model.safetensors"])

    # bad config.json: unknown architecture
    d = copy_model(src, os.path.join(tmp, "err_arch"))
    cp = os.path.join(d, "config.json")
    with open(cp) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["FooBarForCausalLM"]
    cfg["model_type"] = "foobar"
    with open(cp, "w") as f:
        json.dump(cfg, f)
    expect_error("unknown architecture", binary, d, [], any_of=["FooBarForCausalLM", "architecture"])

    # config.json that is not JSON
    d = copy_model(src, os.path.join(tmp, "err_cfgjson"))
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"architectures": ["Qwen3ForCausalLM"], "hidden_size": ')
    expect_error("malformed config.json", binary, d, ["config.json"])

    # model directory that does not exist
    expect_error("missing model dir", binary, os.path.join(tmp, "no_such_model_dir"), [])


def prompt_key(o):
    return None if o is None else json.dumps([o.get(f) for f in ("prompt_logprobs", "prompt_ranks",
                                                                 "prompt_top_logprobs")])


def test_prompt_logprobs(binary, tmp, models):
    rng = np.random.default_rng(44)
    d, vocab = models["qwen3"]
    P = rand_prompt(rng, vocab, 40)  # 2 full KV blocks of 16, cached after the first request
    Q = rand_prompt(rng, vocab, 9)
    pl = ["--prompt-logprobs", "3"]
    base = H.generate(C, "(f) prompt logprobs alone", binary, d, P, max_tokens=6, logprobs=2, extra=pl)
    plain = H.generate(C, "(f) no prompt logprobs", binary, d, P, max_tokens=6, logprobs=2)
    if base is None or plain is None:
        return
    C.check(len(base.get("prompt_logprobs") or []) == len(P) and base["prompt_logprobs"][0] is None and
            all(isinstance(x, str) for x in base["prompt_logprobs"][1:]),
            "(f) prompt_logprobs not [null, numbers...]: %r" % base.get("prompt_logprobs"))
    C.check("prompt_logprobs" not in plain, "(f) prompt_logprobs reported without being asked for")
    same("(f) generated tokens with vs without prompt logprobs", base, plain)
    for what, kw in (("--prefill-chunk 5", dict(prefill_chunk=5)), ("--eager", dict(eager=True)),
                     ("--max-seqs 1", dict(extra=["--max-seqs", "1"]))):
        o = H.generate(C, "(f) " + what, binary, d, P, max_tokens=6, logprobs=2, extra=pl + kw.pop("extra", []), **kw)
        C.check(prompt_key(o) == prompt_key(base), "(f) prompt logprobs with %s differ from alone" % what)
        same("(f) generated tokens with %s" % what, base, o)
    # a batch: P plain first (fills the prefix cache), then P scored twice, Q scored with 0 alternatives,
    # P plain again; two slots and 8-row steps, so scoring rows share steps with sampling rows
    reqs = [{"prompt_ids": P, "max_tokens": 6, "logprobs": 2, "temperature": 0},
            {"prompt_ids": P, "max_tokens": 6, "logprobs": 2, "temperature": 0, "prompt_logprobs": 3},
            {"prompt_ids": Q, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 0},
            {"prompt_ids": P, "max_tokens": 6, "logprobs": 2, "temperature": 0, "prompt_logprobs": 3},
            {"prompt_ids": P, "max_tokens": 6, "logprobs": 2, "temperature": 0}]
    outs = H.generate_batch(C, "(f) prompt logprobs batch", binary, d, reqs, os.path.join(tmp, "plp.jsonl"),
                            extra=["--max-seqs", "2", "--prefill-chunk", "7", "--max-step-tokens", "8"])
    if outs is not None:
        for i in (1, 3):
            C.check(prompt_key(outs[i]) == prompt_key(base), "(f) batch request %d: prompt logprobs differ" % i)
        for i in (0, 1, 3, 4):
            same("(f) batch request %d: generated tokens" % i, outs[i], base)
        q = H.generate(C, "(f) Q alone", binary, d, Q, max_tokens=4, extra=["--prompt-logprobs", "0"])
        C.check(q is not None and prompt_key(outs[2]) == prompt_key(q) and "prompt_top_logprobs" not in q,
                "(f) batch request 2 (0 alternatives): %r vs alone %r" % (prompt_key(outs[2]), prompt_key(q)))
    # with a drafter: the verify/draft/context steps leave the prompt scores alone
    dd = os.path.join(tmp, "draft_qwen3")
    res = H.run([binary, "mkmodel", "--arch", "dflash", "--target", d, "--out", dd, "--layers", "1", "--seed", "3"])
    if C.check(res.rc == 0, "(f) mkmodel dflash: %s" % res.stderr.strip()):
        o = H.generate(C, "(f) with a drafter", binary, d, P, max_tokens=6, logprobs=2, prefill_chunk=5,
                       extra=pl + ["--draft", dd])
        C.check(prompt_key(o) == prompt_key(base), "(f) prompt logprobs with a drafter differ from alone")
        same("(f) generated tokens with a drafter", base, o)


# ------------------------------------------------------------------------------------------------
# (g) the command surface: help, mkmodel report, --prompt, bench spec columns
# ------------------------------------------------------------------------------------------------

def listed(text, names):
    """The names that have a line of their own ('  name  description') in text."""
    return [n for n in names if re.search(r"^  %s\s+\S" % re.escape(n), text, re.M)]


def test_cli_surface(binary, tmp, models):
    cmds = ["serve", "generate", "mkmodel", "bench", "help"]
    res = H.run([binary, "--help"])
    C.check(res.rc == 0 and listed(res.stdout, cmds) == cmds, "(g) --help lists %r: %r" % (cmds, res.stdout))
    res = H.run([binary])
    C.check(res.rc == 2 and listed(res.stderr, cmds) == cmds, "(g) no command: rc %r, %r" % (res.rc, res.stderr))
    benches = ["decode", "prefill", "blas", "spec", "serve", "update", "transfer"]
    res = H.run([binary, "bench", "--help"])
    C.check(res.rc == 0 and listed(res.stdout, benches) == benches, "(g) bench --help: %r" % res.stdout)
    res = H.run([binary, "bench", "nosuch"])
    C.check(res.rc == 2 and "unknown bench nosuch" in res.stderr and listed(res.stderr, benches) == benches,
            "(g) bench nosuch: %r" % res.stderr)
    for c in [["serve"], ["generate"], ["mkmodel"]] + [["bench", b] for b in benches]:
        res = H.run([binary] + c + ["--help"])
        C.check(res.rc == 0 and res.stdout.startswith("usage: graphswap " + " ".join(c)),
                "(g) %s --help: rc %r %r" % (" ".join(c), res.rc, res.stdout[:200]))
    res = H.run([binary, "generate", "--help"])
    C.check("--prompt TEXT" in res.stdout, "(g) generate --help lacks --prompt")

    # mkmodel says what it wrote
    out = os.path.join(tmp, "mk_report")
    res = H.mkmodel(binary, out, "qwen3", hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, inter=64, vocab=512,
                    shards=2, seed=9)
    if C.check(res.rc == 0, "(g) mkmodel: %s" % res.stderr):
        n = sum(int(np.prod(t.shape)) for t in rm.read_checkpoint_tensors(out).values())
        m = re.search(r"^wrote (\S+): Qwen3ForCausalLM, (\d+) parameters .*, (\d+) files$", res.stdout, re.M)
        files = sorted(os.listdir(out))
        C.check(m is not None and m.group(1) == out and int(m.group(2)) == n and int(m.group(3)) == len(files),
                "(g) mkmodel report (%d parameters, %d files): %r" % (n, len(files), res.stdout))
        for f in files:
            sz = os.path.getsize(os.path.join(out, f))
            C.check(re.search(r"^  %s\s+%d bytes$" % (re.escape(f), sz), res.stdout, re.M) is not None,
                    "(g) mkmodel report lacks %s (%d bytes): %r" % (f, sz, res.stdout))

    # --prompt TEXT: the ids of POST /tokenize, the tokens of --prompt-ids, the text of /v1/completions
    d, _ = models["qwen3"]
    import test_http_basic as HB
    srv = HB.Server(C, binary, d)
    try:
        for text in ("Hello world, this is graphswap.", "caf\u00e9 <|im_start|>user\n\u4e2d\u6587 tokens"):
            r = HB.post(srv, "/tokenize", {"prompt": text})
            want = (r.json or {}).get("tokens")
            if not C.check(r.status == 200 and want, "(g) /tokenize %r: %r" % (text, r)):
                continue
            res = H.run([binary, "generate", "--model", d, "--prompt", text, "--max-tokens", "6", "--ignore-eos"])
            o = H.parse_objects(res.stdout)[0] if res.rc == 0 and res.stdout.strip() else None
            if not C.check(o is not None, "(g) generate --prompt %r: %s" % (text, res.stderr)):
                continue
            C.check(o.get("prompt_token_ids") == want, "(g) --prompt %r ids %r, /tokenize %r" % (text, o.get("prompt_token_ids"), want))
            ids = H.generate(C, "(g) --prompt-ids", binary, d, want, max_tokens=6)
            same("(g) --prompt %r vs --prompt-ids" % text, o, ids)
            r = HB.post(srv, "/v1/completions", {"prompt": text, "max_tokens": 6, "temperature": 0, "ignore_eos": True})
            C.check(r.status == 200 and o.get("text") == r.json["choices"][0]["text"],
                    "(g) --prompt text %r vs /v1/completions %r" % (o.get("text"), r))
        HB.stop_clean(C, srv)
    finally:
        srv.kill()
    res = H.run([binary, "generate", "--model", d, "--prompt", "x", "--prompt-ids", "1"])
    C.check(res.rc != 0 and "exactly one of" in res.stderr, "(g) --prompt with --prompt-ids: %r" % res.stderr)

    # bench spec: one column per draft position (DFlash block 6: 5 drafts), a header, the load warning
    dd = os.path.join(tmp, "bench_dflash")
    res = H.run([binary, "mkmodel", "--arch", "dflash", "--target", d, "--out", dd, "--block-size", "6", "--seed", "4"])
    if C.check(res.rc == 0, "(g) mkmodel dflash: %s" % res.stderr):
        env = dict(os.environ, GRAPHSWAP_BENCH_MEMCPY_GBS="1000000")
        p = H.subprocess.run([binary, "bench", "spec", "--model", d, "--draft", dd, "--tokens", "8", "--threads", "1"],
                             stdout=H.subprocess.PIPE, stderr=H.subprocess.PIPE, env=env, timeout=300)
        out_s, err_s = p.stdout.decode(), p.stderr.decode()
        C.check(p.returncode == 0 and out_s.startswith("graphswap bench spec: "), "(g) bench spec: %r %r" % (out_s, err_s))
        C.check("columns:" in out_s and "p1..p5" in out_s, "(g) bench spec header: %r" % out_s)
        head = [l for l in out_s.splitlines() if l.startswith("batch")]
        C.check(len(head) == 1 and head[0].split()[-5:] == ["p1", "p2", "p3", "p4", "p5"] and "p6" not in head[0],
                "(g) bench spec column header: %r" % head)
        rows = [l.split() for l in out_s.splitlines() if re.match(r"^\d+\s+spec\s", l)]
        C.check(len(rows) == 2 and all(len(r) == 9 + 5 for r in rows), "(g) bench spec rows: %r" % rows)
        C.check("warning: single-thread memcpy" in err_s and "warning: single-thread memcpy" in out_s,
                "(g) bench spec: no memcpy warning with an unreachable expected figure: %r" % err_s)
        p = H.subprocess.run([binary, "bench", "spec", "--model", d, "--draft", dd, "--tokens", "4", "--threads", "1",
                              "--num-spec-tokens", "2"], stdout=H.subprocess.PIPE, stderr=H.subprocess.PIPE,
                             env=dict(os.environ, GRAPHSWAP_BENCH_MEMCPY_GBS="0.001"), timeout=300)
        head = [l for l in p.stdout.decode().splitlines() if l.startswith("batch")]
        C.check(len(head) == 1 and head[0].split()[-2:] == ["p1", "p2"] and "p3" not in head[0],
                "(g) bench spec --num-spec-tokens 2 header: %r" % head)
        C.check("memcpy" not in p.stderr.decode(), "(g) memcpy warning below a low expected figure: %r" % p.stderr)
        p = H.subprocess.run([binary, "bench", "spec", "--model", d, "--draft", dd, "--tokens", "4", "--threads", "1",
                              "--batches", "2", "--reps", "3"], stdout=H.subprocess.PIPE, stderr=H.subprocess.PIPE,
                             timeout=300)
        rows = [l.split()[:2] for l in p.stdout.decode().splitlines() if re.match(r"^\d+\s+(spec|plain)\s", l)]
        C.check(p.returncode == 0 and rows == [["2", "plain"], ["2", "spec"]], "(g) bench spec --batches 2: %r" % rows)
        pairs = re.findall(r"^  step/dec of each alternated pair:((?: \d+\.\d\d)+)$", p.stdout.decode(), re.M)
        C.check(len(pairs) == 1 and len(pairs[0].split()) == 3, "(g) bench spec --reps 3 pairs: %r" % p.stdout.decode())
        # the counters summed over --reps: with the TEST-ONLY accept-all drafter every position accepts
        acc = H.accept_all_drafter(dd, os.path.join(tmp, "bench_dflash_accept"))
        p = H.subprocess.run([binary, "bench", "spec", "--model", d, "--draft", acc, "--tokens", "64", "--threads", "1",
                              "--batches", "1", "--reps", "2"], stdout=H.subprocess.PIPE, stderr=H.subprocess.PIPE,
                             timeout=300)
        row = [l.split() for l in p.stdout.decode().splitlines() if re.match(r"^1\s+spec\s", l)]
        C.check(p.returncode == 0 and len(row) == 1 and float(row[0][7]) > 4.0 and row[0][9] == "1.00",
                "(g) bench spec with every draft accepted: mean AL > 4, p1 1.00: %r" % p.stdout.decode())

    # bench blas: the graphswap rows are row-invariant (a row alone == the same row of the product, bit
    # for bit); each BLAS library is either measured or reported missing (CI installs none of them)
    p = H.subprocess.run([binary, "bench", "blas", "--model", d, "--lengths", "5,70", "--reps", "1", "--threads", "2"],
                         stdout=H.subprocess.PIPE, stderr=H.subprocess.PIPE, timeout=300)
    out_b = p.stdout.decode()
    gs = [l.split() for l in out_b.splitlines() if re.match(r"^\d+\s+graphswap\s", l)]
    C.check(p.returncode == 0 and [r[0] for r in gs] == ["5", "70"] and all(r[-1] == "yes" for r in gs),
            "(g) bench blas graphswap rows: %r %r" % (out_b, p.stderr.decode()))
    for lib in ("openblas", "blis", "onednn"):
        C.check(re.search(r"^%s: (not installed \(apt-get install \S+\), skipped|\S.*)$" % lib, out_b, re.M) is not None,
                "(g) bench blas %s line: %r" % (lib, out_b))


# ------------------------------------------------------------------------------------------------
# (h) --bf16-activations
# ------------------------------------------------------------------------------------------------

def test_bf16_activations(binary, tmp, models, mode="--bf16-activations"):
    """mode: the bf16-pairs order, or "--bf16-activations=amx" (TDPBF16PS's order: natively where the
    CPU has AMX, emulated bit for bit on every other ISA, so every check below holds everywhere)."""
    rng = np.random.default_rng(55)
    x = [mode]
    amx = mode.endswith("=amx")
    for mname, (d, vocab) in models.items():
        p = rand_prompt(rng, vocab, 19)
        what = "(h) %s %s" % (mname, mode)
        base = H.generate(C, what, binary, d, p, max_tokens=12, logprobs=3, extra=x)
        if base is None:
            continue
        H.validate_shape(C, what, base, 12, 3)
        same(what + ": plan replay vs --eager", base,
             H.generate(C, what + " --eager", binary, d, p, max_tokens=12, logprobs=3, eager=True, extra=x))
        same(what + ": --prefill-chunk 5 vs one-shot", base,
             H.generate(C, what + " --prefill-chunk 5", binary, d, p, max_tokens=12, logprobs=3, prefill_chunk=5,
                        extra=x))
        reqs = [{"prompt_ids": rand_prompt(rng, vocab, n), "max_tokens": m, "logprobs": 2, "ignore_eos": True,
                 "temperature": 0.0} for n, m in ((3, 9), (11, 4), (27, 7))]
        reqs.append({"prompt_ids": p, "max_tokens": 12, "logprobs": 3, "ignore_eos": True, "temperature": 0.0})
        outs = H.generate_batch(C, what + " batch", binary, d, reqs, os.path.join(tmp, "bf16x_%s_%d.jsonl" % (mname, amx)),
                                extra=x)
        if outs is not None:
            same(what + ": request in a batch vs alone", outs[3], base)
            for i, r in enumerate(reqs[:3]):
                same(what + ": batch request %d vs alone" % i, outs[i],
                     H.generate(C, what + " alone %d" % i, binary, d, r["prompt_ids"], max_tokens=r["max_tokens"],
                                logprobs=2, extra=x))
        saved = os.environ.get("GS_KERN_ISA")
        try:
            # capped at what the CPU has: then a repeat, still valid; in the amx mode, AVX512_BF16 runs
            # the emulation where the best ISA runs the instruction
            for isa in ("scalar", "avx2", "avx512") + (("avx512bf16",) if amx else ()):
                os.environ["GS_KERN_ISA"] = isa
                same(what + ": GS_KERN_ISA=%s vs the best ISA" % isa, base,
                     H.generate(C, what + " " + isa, binary, d, p, max_tokens=12, logprobs=3, extra=x))
        finally:
            if saved is None:
                os.environ.pop("GS_KERN_ISA", None)
            else:
                os.environ["GS_KERN_ISA"] = saved
        # against the default (f32 activations): the same first token's logprob up to bf16 rounding of
        # the activations, and not bitwise the same (the option took effect)
        f32 = H.generate(C, "(h) %s default" % mname, binary, d, p, max_tokens=1, logprobs=3)
        if f32 is not None:
            a, b = H.num(base["logprobs"][0]), H.num(f32["logprobs"][0])
            C.check(base["logprobs"][0] != f32["logprobs"][0],
                    what + ": first logprob bitwise equal to the default mode's (%r): option not in effect" % a)
            C.check(abs(a - b) < 0.05, what + ": first logprob %r vs %r with f32 activations" % (a, b))
    if amx:
        return
    # an f32 checkpoint: runs, and says the option changes nothing there
    d32 = os.path.join(tmp, "model_f32")
    res = H.mkmodel(binary, d32, "qwen3", hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, inter=64,
                    vocab=256, tie=True, dtype="f32", seed=3)
    if C.check(res.rc == 0, "(h) mkmodel f32: %s" % res.stderr.strip()):
        res = H.run([binary, "generate", "--model", d32, "--bf16-activations", "--prompt-ids", "1,2",
                     "--max-tokens", "1"])
        C.check(res.rc == 0 and "has no effect" in res.stderr,
                "(h) --bf16-activations on an f32 checkpoint: rc %s, stderr %r" % (res.rc, res.stderr[-300:]))
    res = H.run([binary, "generate", "--model", next(iter(models.values()))[0], "--backend", "cuda",
                 "--bf16-activations", "--prompt-ids", "1,2", "--max-tokens", "1"])
    C.check(res.rc != 0 and "CPU-backend option" in res.stderr,
            "(h) --backend cuda --bf16-activations: rc %s, stderr %r" % (res.rc, res.stderr[-300:]))


def main():
    binary = H.require_bin(C)
    tmp = H.scratch_dir("engine_cli")
    models = build_models(binary, tmp)
    test_eager_and_chunks(binary, tmp, models)
    test_batch(binary, tmp, models)
    test_prompt_logprobs(binary, tmp, models)
    test_load_errors(binary, tmp)
    test_cli_surface(binary, tmp, models)
    test_bf16_activations(binary, tmp, models)
    test_bf16_activations(binary, tmp, models, "--bf16-activations=amx")
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
