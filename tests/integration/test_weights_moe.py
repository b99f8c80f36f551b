#!/usr/bin/env python3
"""Qwen3-MoE weight updates over HTTP and disk: every update equals a cold start, expert by expert.

The bugs this guards against (other servers shipped them): a post-load swap of w1/w3 that made the
next reload write into the swapped layout (vLLM #42821), a per-chunk finalize that restored the
experts a chunk did not carry (SkyRL #1680), grouped expert exports split across buckets never
applied (SkyRL #1471). graphswap keeps one destination per checkpoint name (each expert part writes
its rows of the stacked w13 / w2 directly), coverage per expert part and one post-load hook.

Checkpoints (graphswap mkmodel --arch qwen3_moe, 3 layers: 0 and 1 sparse with 8 experts, top-2,
layer 2 dense through mlp_only_layers): T0 / T1 (seeds 1 / 2) per expert, T0f / T1f the same weights
in transformers 5's fused layout (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]).
In every one the router rows 5, 6 and 7 of layer 0 equal row 4: the four experts tie, ties go to the
lower id, so with top-2 experts 6 and 7 of layer 0 are never routed to (checked: changing them leaves
the greedy tokens unchanged while their checksums change).

One server (MoE target + DSpark drafter, prefix cache on) takes, and is compared after each with a
fresh cold start (checksums of every expert part and of the drafter, greedy tokens and spec counters
of prompts that repeat, so a stale prefix-cache hit would show):
  - T0 -> T1 per-expert names, shuffled, the parts of layer 1's experts spread over many buckets;
  - T1 -> T0 fused names, one tensor per bucket; T0 -> T1 mixed: layer 0 fused, layer 1 per expert;
  - the same weights twice (T1 again): a new version, a hook run, nothing else changes;
  - partial: only the unrouted expert 7 of layer 0 (its checksums move, the tokens do not) and only
    layer 1's fused gate_up_proj;
  - disk: /v1/weights/load of T1f and SGLang /update_weights_from_disk of T0;
  - a full update missing one expert's up_proj: 422 naming it, then repaired; one missing layer 1's
    fused down_proj: 422 naming an expert's down_proj;
  - bad buckets (an expert part of the wrong shape, an expert id >= num_experts, a fused tensor with
    the wrong expert count or 2I, the router's shape): 400 naming the tensor, nothing written;
  - sleep level 1 + wake: identical; level 2 + wake + a full fused update: identical;
  - every generation route (completions, chat, SGLang /generate, streaming) answers on the MoE model;
  - a replica started on the fused T1f joins with --weights-from the server (at T0): equals T0;
  - the Python client's verify_state_dict takes either layout (fused tensors hashed per expert);
  - a DFlash drafter on the MoE target: greedy tokens equal the plain target's (I9), drafts accepted.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import os
import random
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "clients", "python")))
import graphswap_client as gc  # noqa: E402
import ref_model as R  # noqa: E402
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

E, K, LAYERS = 8, 2, 3
MOE = ["--arch", "qwen3_moe", "--layers", str(LAYERS), "--experts", str(E), "--experts-per-tok", str(K),
       "--mlp-only", "2", "--vocab", "1024"]
ARGS = W.SPEC_ARGS + ["--enable-prompt-tokens-details"]
UNROUTED = 7  # (and 6) of layer 0
ROUTER0 = "model.layers.0.mlp.gate.weight"


def expert_part(layer, e, part):
    return "model.layers.%d.mlp.experts.%d.%s_proj.weight" % (layer, e, part)


def mk_target(C, binary, out, seed, fused):
    """A MoE checkpoint whose layer-0 router rows 5..7 equal row 4 (experts 6, 7 never routed)."""
    raw = out + ".raw"
    H.mkmodel(C, binary, raw, extra=MOE + ["--seed", str(seed)] + (["--moe-fused"] if fused else []))
    w = R.read_checkpoint_tensors(raw)[ROUTER0].to_f64().copy()
    w[5:8] = w[4]
    return W.write_merged(raw, out, {ROUTER0: Arr(w)})  # (config and tokenizer files are copied)


class Arr:
    """A replacement tensor for W.write_merged (only to_f64 is read)."""

    def __init__(self, arr):
        self.arr = arr

    def to_f64(self):
        return self.arr


def spread_buckets(names, rng, layer=1, n_buckets=12):
    """Shuffled buckets where the parts of layer `layer`'s experts land in many different buckets:
    no bucket holds two parts of one expert, and no bucket holds all of one part kind."""
    names = sorted(names)
    rng.shuffle(names)
    buckets = [[] for _ in range(n_buckets)]
    pre = "model.layers.%d.mlp.experts." % layer
    for e in range(E):
        for part, b in zip(("gate", "up", "down"), rng.sample(range(n_buckets), 3)):
            buckets[b].append(expert_part(layer, e, part))
    special = set(n for b in buckets for n in b)
    for i, n in enumerate(x for x in names if x not in special):
        buckets[i % n_buckets].append(n)
    for b in buckets:
        rng.shuffle(b)
    rng.shuffle(buckets)
    where = {n: i for i, b in enumerate(buckets) for n in b}
    assert all(len(set(where[expert_part(layer, e, p)] for p in ("gate", "up", "down"))) == 3 for e in range(E))
    assert len(set(where[n] for n in where if n.startswith(pre))) >= 6
    return [b for b in buckets if b]


def checksums(srv, model):
    """Checksums by checkpoint name: one entry per expert part (and the drafter's, derived ones too)."""
    r = H.get(srv, "/v1/weights/checksums?model=%s&names=checkpoint" % model)
    if r.status != 200 or not isinstance((r.json or {}).get("tensors"), dict):
        return {"_error": repr(r)}
    return r.json["tensors"]


def snap(srv):
    return {"target": checksums(srv, "target"), "draft": checksums(srv, "draft"),
            "gen": [W.greedy(srv, p) for p in W.PROMPTS]}


def cold(C, binary, target, draft):
    srv = H.Server(C, binary, target, args=ARGS + ["--draft", draft])
    try:
        return snap(srv)
    finally:
        srv.stop()
        srv.kill()


def full(C, srv, what, tensors, buckets, version, **begin):
    b = {"mode": "full", "model": "target", "version": version}
    b.update(begin)
    return W.push(C, srv, what, tensors, buckets, b)


def test_updates(C, binary, srv, ck, refs, rng):
    T0, T1 = W.ckpt(ck["T0"]), W.ckpt(ck["T1"])
    T0f, T1f = W.ckpt(ck["T0f"]), W.ckpt(ck["T1f"])
    C.check(expert_part(1, 3, "up") in T1 and "model.layers.1.mlp.experts.gate_up_proj" in T1f and
            expert_part(1, 3, "up") not in T1f, "the two layouts do not differ in names")
    # T0 -> T1, per expert, layer 1's experts over many buckets
    h0 = W.hooks(srv)
    res = full(C, srv, "T0 -> T1 per expert, spread", T1, spread_buckets(list(T1), rng), "moe-1")
    C.check(res is not None and res["last_update"]["tensors"] == len(T1), "spread: %r" % res)
    W.check_hooks(C, "spread", h0, W.hooks(srv), 1, 0)
    W.same(C, "T0 -> T1 per expert, spread", snap(srv), refs[1], version="moe-1")
    # T1 -> T0, fused names, one tensor per bucket
    full(C, srv, "T1 -> T0 fused, one per bucket", T0f, W.make_buckets(list(T0f), "one", rng), "moe-2")
    W.same(C, "T1 -> T0 fused", snap(srv), refs[0], version="moe-2")
    # T0 -> T1 with layer 0 fused and layer 1 per expert in one session
    mixed = {n: t for n, t in T1f.items() if not n.startswith("model.layers.1.mlp.experts.")}
    mixed.update({n: t for n, t in T1.items() if n.startswith("model.layers.1.mlp.experts.")})
    C.check("model.layers.0.mlp.experts.down_proj" in mixed and expert_part(1, 0, "down") in mixed,
            "mixed layouts: %r" % sorted(mixed)[:5])
    full(C, srv, "T0 -> T1 mixed layouts", mixed, W.make_buckets(list(mixed), "mixed", rng), "moe-3",
         pause="abort")
    W.same(C, "T0 -> T1 mixed layouts", snap(srv), refs[1], version="moe-3")
    # the same weights twice
    h0 = W.hooks(srv)
    v0 = W.weights_info(srv).get("version_number")
    full(C, srv, "T1 again", T1, spread_buckets(list(T1), rng), "moe-4")
    W.check_hooks(C, "T1 again", h0, W.hooks(srv), 1, 0)
    C.check(W.weights_info(srv).get("version_number") == (v0 or 0) + 1, "the same weights twice: no new version")
    W.same(C, "T1 again", snap(srv), refs[1], version="moe-4")


def test_partial(C, binary, srv, ck, tmp):
    """The server is at (T1, D0)."""
    T0 = W.ckpt(ck["T0"])
    # only the unrouted expert 7 of layer 0, from T0
    part = {n: T0[n] for n in (expert_part(0, UNROUTED, p) for p in ("gate", "up", "down"))}
    M = W.write_merged(ck["T1"], os.path.join(tmp, "M_unrouted"), part)
    want = cold(C, binary, M, ck["D0"])
    cur = snap(srv)
    d = W.diff_sums(want["target"], cur["target"])
    C.check(d == sorted(part), "the merged checkpoint differs from T1 in %r, expected %r" % (d, sorted(part)))
    C.check([g[0] for g in want["gen"]] == [g[0] for g in cur["gen"]],
            "expert %d of layer 0 is routed to: changing it changed the greedy tokens" % UNROUTED)
    h0 = W.hooks(srv)
    push_ok = W.push(C, srv, "partial: unrouted expert", part, [[n] for n in sorted(part)],
                     {"mode": "partial", "model": "target", "version": "p-1"})
    C.check(push_ok is not None, "partial unrouted expert refused")
    W.check_hooks(C, "partial unrouted", h0, W.hooks(srv), 1, 0)
    W.same(C, "partial: unrouted expert 7 of layer 0", snap(srv), want, version="p-1")
    # only layer 1's fused gate_up_proj (from T0f): every expert's gate and up rows of layer 1
    T0f = W.ckpt(ck["T0f"])
    gu = "model.layers.1.mlp.experts.gate_up_proj"
    repl = dict(part)
    repl.update({expert_part(1, e, p): T0[expert_part(1, e, p)] for e in range(E) for p in ("gate", "up")})
    M2 = W.write_merged(ck["T1"], os.path.join(tmp, "M_gate_up"), repl)
    want2 = cold(C, binary, M2, ck["D0"])
    W.push(C, srv, "partial: fused gate_up_proj of layer 1", {gu: T0f[gu]}, [[gu]],
           {"mode": "partial", "model": "target", "version": "p-2"})
    W.same(C, "partial: fused gate_up_proj of layer 1", snap(srv), want2, version="p-2")


def test_disk(C, srv, ck, refs):
    r = H.post(srv, "/v1/weights/load", {"path": ck["T1f"], "model": "target", "version": "disk-f"})
    C.check(r.status == 200 and r.json.get("state") == "ready", "load T1f: %r" % r)
    W.same(C, "disk load of the fused T1f", snap(srv), refs[1], version="disk-f")
    r = H.post(srv, "/update_weights_from_disk", {"model_path": ck["T0"], "weight_version": "sg-0"})
    C.check(r.status == 200 and r.json.get("success") is True, "SGLang load T0: %r" % r)
    W.same(C, "SGLang update_weights_from_disk T0", snap(srv), refs[0], version="sg-0")


def test_missing(C, srv, ck, refs):
    """The server is at (T0, D0)."""
    T1, T1f = W.ckpt(ck["T1"]), W.ckpt(ck["T1f"])
    for what, tensors, drop, needle in (
            ("per expert", T1, expert_part(1, 3, "up"), expert_part(1, 3, "up")),
            ("fused", T1f, "model.layers.1.mlp.experts.down_proj", "down_proj")):
        part = {n: t for n, t in T1.items() if n != drop} if tensors is T1 else \
            {n: t for n, t in T1f.items() if n != drop}
        r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target"})
        names = sorted(part)
        for b in (names[::2], names[1::2]):
            r = W.post_bucket(srv, W.st_encode([part[n] for n in b]))
            C.check(r.status == 200, "missing %s: bucket %r" % (what, r))
        r = H.post(srv, "/v1/weights/finish", {})
        H.error_ok(C, "a full update missing %s" % drop, r, 422, needle)
        msg = (((r.json or {}).get("error") or {}).get("message") or "")
        C.check("model.layers.1.mlp.experts." in msg, "missing %s: the 422 names no expert: %r" % (what, msg))
        info = W.weights_info(srv)
        C.check(info.get("state") == "inconsistent", "missing %s: state %r" % (what, info.get("state")))
        full(C, srv, "repair after missing %s" % what, W.ckpt(ck["T0"]),
             W.make_buckets(list(W.ckpt(ck["T0"])), "all", random.Random(1)), "repaired")
        W.same(C, "repaired after missing %s" % what, snap(srv), refs[0])


def bad_tensor(name, shape):
    n = int(np.prod(shape))
    return R.RawTensor(name, "F32", tuple(shape), R.encode_array("F32", np.zeros(n).reshape(shape)))


def test_bad_buckets(C, srv, ck):
    """The server is at (T0, D0)."""
    T1, T1f = W.ckpt(ck["T1"]), W.ckpt(ck["T1f"])
    base = {"target": checksums(srv, "target"), "draft": checksums(srv, "draft")}
    up = T1[expert_part(1, 2, "gate")]
    I_, Hd = up.shape
    gu = T1f["model.layers.1.mlp.experts.gate_up_proj"]
    C.check(tuple(gu.shape) == (E, 2 * I_, Hd), "fused gate_up_proj shape %r" % (gu.shape,))
    table = [
        ("an expert part of the wrong shape", [bad_tensor(expert_part(1, 2, "gate"), (I_ + 1, Hd))],
         expert_part(1, 2, "gate")),
        ("down_proj transposed", [bad_tensor(expert_part(0, 1, "down"), (I_, Hd))], expert_part(0, 1, "down")),
        ("an expert id >= num_experts", [bad_tensor(expert_part(1, E, "up"), (I_, Hd))], expert_part(1, E, "up")),
        ("experts of the dense layer 2", [bad_tensor(expert_part(2, 0, "up"), (I_, Hd))], expert_part(2, 0, "up")),
        ("fused gate_up_proj with E - 1 experts", [bad_tensor(gu.name, (E - 1, 2 * I_, Hd))], gu.name),
        ("fused gate_up_proj with I rows", [bad_tensor(gu.name, (E, I_, Hd))], gu.name),
        ("fused gate_up_proj flattened", [bad_tensor(gu.name, (E * 2 * I_, Hd))], gu.name),
        ("fused down_proj [E, I, H]", [bad_tensor("model.layers.0.mlp.experts.down_proj", (E, I_, Hd))],
         "model.layers.0.mlp.experts.down_proj"),
        ("the router with E + 1 rows", [bad_tensor(ROUTER0, (E + 1, Hd))], ROUTER0),
        ("a good expert then a bad one: nothing written", [T1[expert_part(1, 0, "gate")],
                                                           bad_tensor(expert_part(1, 1, "gate"), (I_, Hd + 1))],
         expert_part(1, 1, "gate")),
    ]
    r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target"})
    C.check(r.status == 200, "bad buckets: begin %r" % r)
    for what, ts, needle in table:
        r = W.post_bucket(srv, W.st_encode(ts))
        H.error_ok(C, "bad bucket: %s" % what, r, 400)
        msg = (((r.json or {}).get("error") or {}).get("message") or "") if isinstance(r.json, dict) else ""
        C.check(needle in msg, "bad bucket: %s: the message does not name %s: %r" % (what, needle, msg))
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "abort after the bad buckets: %r" % r)
    now = {"target": checksums(srv, "target"), "draft": checksums(srv, "draft")}
    for m in now:
        d = W.diff_sums(now[m], base[m])
        C.check(not d, "bad buckets wrote %s weights: %s" % (m, d[:5]))
    H.healthy(C, srv, "after the bad MoE buckets")


def test_sleep(C, srv, ck, refs):
    """The server is at (T0, D0)."""
    r = H.post(srv, "/sleep?level=1", None)
    C.check(r.status == 200, "sleep level 1: %r" % r)
    r = H.post(srv, "/wake_up", None)
    C.check(r.status == 200, "wake_up: %r" % r)
    W.same(C, "sleep level 1 + wake", snap(srv), refs[0])
    r = H.post(srv, "/sleep?level=2", None)
    C.check(r.status == 200, "sleep level 2: %r" % r)
    r = H.post(srv, "/wake_up", None)
    C.check(r.status == 200, "wake_up after level 2: %r" % r)
    both = dict(W.ckpt(ck["T1f"]), **W.ckpt(ck["D0"], "draft."))  # level 2 discarded both models
    full(C, srv, "full fused update after level 2", both, W.make_buckets(list(both), "mixed", random.Random(3)),
         "woken", model="all")
    W.same(C, "sleep level 2 + wake + fused T1f", snap(srv), refs[1], version="woken")


def test_routes(C, srv):
    P = [(i * 53 + 7) % 1000 for i in range(50)]
    body = {"prompt": P, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    got = []
    for _ in range(2):
        r = H.post(srv, "/v1/completions", body)
        got.append(r.json["usage"].get("prompt_tokens_details") if r.status == 200 else r)
    C.check(got[1] == {"cached_tokens": 48}, "prefix cache on the MoE target: prompt_tokens_details %r" % got)
    toks = W.greedy(srv, P, 4)[0]
    r = H.post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello experts"}],
                                              "max_tokens": 4, "temperature": 0})
    C.check(r.status == 200 and r.json["choices"][0]["message"]["content"] is not None, "chat on MoE: %r" % r)
    r = H.post(srv, "/generate", {"input_ids": P, "sampling_params": {"temperature": 0, "max_new_tokens": 4,
                                                                      "ignore_eos": True}})
    # SGLang answers {text, output_ids, meta_info} (sglang_generate.c): the greedy tokens exactly
    C.check(r.status == 200 and r.json.get("output_ids") == toks and len(toks) == 4,
            "SGLang /generate on MoE: %r, want output_ids %r" % (r, toks))
    plain = H.post(srv, "/v1/completions", body)
    st, evs, _ = H.stream_all(srv, "/v1/completions", dict(body, stream=True))
    text = "".join(c.get("text", "") for e in evs if isinstance(e, dict) for c in e.get("choices", []))
    C.check(st == 200 and plain.status == 200 and text == plain.json["choices"][0]["text"],
            "streaming on MoE: %r %r, plain %r" % (st, evs[:3], plain))
    r = H.post(srv, "/v1/completions", dict(body, temperature=0.8, seed=3, n=2))
    C.check(r.status == 200 and len(r.json["choices"]) == 2, "sampling n=2 on MoE: %r" % r)


def test_client_verify(C, srv, ck):
    """The Python client hashes transformers 5's fused expert tensors per expert part, as the server
    reports them: both layouts of the served checkpoint verify, a change in one expert is named."""
    cl = gc.GraphswapClient("http://127.0.0.1:%d" % srv.port)
    for lay in ("T0", "T0f"):
        sd = {n: gc.Tensor(t.dtype, t.shape, t.data) for n, t in W.ckpt(ck[lay]).items()}
        C.check(cl.verify_state_dict(sd) == [], "client verify_state_dict of %s: %r" % (lay, cl.verify_state_dict(sd)))
    sd = {n: gc.Tensor(t.dtype, t.shape, t.data) for n, t in W.ckpt(ck["T0f"]).items()}
    gu = sd["model.layers.1.mlp.experts.gate_up_proj"]
    row = gu.shape[2] * gc._WIDTH[gu.dtype]
    b = bytearray(gu.data)
    at = (5 * gu.shape[1] + gu.shape[1] // 2) * row  # expert 5's first up row
    b[at:at + 2] = bytes([b[at] ^ 0x40, b[at + 1] ^ 0x01])
    sd["model.layers.1.mlp.experts.gate_up_proj"] = gc.Tensor(gu.dtype, gu.shape, bytes(b))
    C.check(cl.verify_state_dict(sd) == [expert_part(1, 5, "up")],
            "client verify_state_dict after changing expert 5's up rows: %r" % cl.verify_state_dict(sd))


def test_pull(C, binary, srv, ck, want):
    """A replica started on T1f (fused names) joins with the live weights of srv (at T0): the export
    carries the per-expert names, and the replica equals a cold start on T0."""
    b = H.Server(C, binary, ck["T1f"], args=["--draft", ck["D0"], "--weights-from", "http://127.0.0.1:%d" % srv.port,
                                             "--weights-from-timeout", "120"] + ARGS)
    try:
        t0 = time.time()
        while time.time() - t0 < 60 and (H.get(b, "/health?ready=1").status != 200):
            time.sleep(0.1)
        W.same(C, "a replica joining with --weights-from the MoE server", snap(b), want)
    finally:
        H.stop_clean(C, b)


def test_dflash(C, binary, ck, tmp):
    D = W.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "DF"), 9, arch="dflash")
    plain = H.Server(C, binary, ck["T0"])
    try:
        want = [W.greedy(plain, p)[0] for p in W.PROMPTS]
    finally:
        H.stop_clean(C, plain)
    spec = H.Server(C, binary, ck["T0"], args=["--draft", D])
    try:
        got = [W.greedy(spec, p) for p in W.PROMPTS]
        C.check([g[0] for g in got] == want, "DFlash on MoE: greedy tokens differ from the plain target (I9)")
        C.check(all(g[1] is not None and g[1][0] > 0 for g in got), "DFlash on MoE: no drafts %r" % got)
    finally:
        H.stop_clean(C, spec)


def main():
    C = H.Checker("weights_moe")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_moe")
    root = os.path.realpath(os.path.join(tmp, "root"))
    os.makedirs(root, exist_ok=True)
    ck = {}
    for name, seed, fused in (("T0", 1, False), ("T1", 2, False), ("T0f", 1, True), ("T1f", 2, True)):
        ck[name] = mk_target(C, binary, os.path.join(root, name), seed, fused)
    ck["D0"] = W.mk_drafter(C, binary, ck["T0"], os.path.join(root, "D0"), 3)
    try:
        refs = {1: cold(C, binary, ck["T1"], ck["D0"])}
        C.check(cold(C, binary, ck["T1f"], ck["D0"]) == refs[1],
                "a cold start on the fused T1f differs from the per-expert T1")
        rng = random.Random(25)
        srv = H.Server(C, binary, ck["T0"], args=["--draft", ck["D0"], "--weights-root", root,
                                                  "--update-bucket-bytes", "65536"] + ARGS)
        refs[0] = snap(srv)
        C.check(refs[0]["gen"][0][0] != refs[1]["gen"][0][0], "T0 and T1 give the same greedy output")
        C.check(len([n for n in refs[0]["target"] if ".mlp.experts." in n]) == 2 * E * 3 and
                all(n.endswith("_proj.weight") for n in refs[0]["target"] if ".mlp.experts." in n),
                "checksums are not per expert part: %r" % sorted(refs[0]["target"])[:8])
        C.check(any(g[1] is not None and g[1][2] > 0 for g in refs[0]["gen"]), "no draft accepted on the MoE target")
        try:
            test_routes(C, srv)
            test_client_verify(C, srv, ck)
            test_updates(C, binary, srv, ck, refs, rng)
            test_partial(C, binary, srv, ck, tmp)
            test_disk(C, srv, ck, refs)
            test_missing(C, srv, ck, refs)
            test_bad_buckets(C, srv, ck)
            test_sleep(C, srv, ck, refs)
            full(C, srv, "back to T0", W.ckpt(ck["T0"]), W.make_buckets(list(W.ckpt(ck["T0"])), "all", rng), "t0")
            test_pull(C, binary, srv, ck, refs[0])
            H.healthy(C, srv, "weights_moe")
        finally:
            H.stop_clean(C, srv)
        test_dflash(C, binary, ck, tmp)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
