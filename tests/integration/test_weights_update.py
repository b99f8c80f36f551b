#!/usr/bin/env python3
"""Weight updates over HTTP, part 1: a hot update equals a cold start.

This file also holds the helpers the other test_weights_*.py scripts import (safetensors buckets in
memory, pushing a session, checksum / greedy snapshots, comparisons). Run as a script it tests, on one
server (qwen3 target + DSpark drafter) started on (T0, D0) and compared after every update with a
fresh server cold-started on the expected checkpoints:
  - full updates over /v1/weights/{begin,bucket,finish}: tensors shuffled, q/k/v and gate/up of one
    layer in different buckets, one tensor per bucket, everything in one bucket, mixed sizes (some
    tensors sent as F32): model "target", "draft" and "all" (drafter tensors prefixed "draft.");
  - the disk transport: /v1/weights/load (target, draft, all) and SGLang /update_weights_from_disk,
    confined to --weights-root (outside, a symlink out, "..": 403; nothing changes);
  - partial updates (mode "partial") of one target layer and of two drafter tensors equal a cold start
    on the merged checkpoint (written here with numpy);
  - equality means: sha256 of every parameter and derived buffer (target and drafter, derived.* too),
    greedy token ids and usage.spec (drafts, draft tokens, accepted) of several prompts, and the
    responses' weight_version is the version the update named;
  - hook counts in /metrics: target-only update -> target +1, draft +0; draft-only -> the reverse;
    "all" -> both +1; last_update reports the tensors and buckets pushed.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import random
import shutil
import struct
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import numpy as np  # noqa: E402

import ref_model as R  # noqa: E402
import test_http_basic as H  # noqa: E402

OCT = {"Content-Type": "application/octet-stream"}
PROMPTS = [[5, 6, 7, 8], list(range(50, 90)), [42] * 20]
GEN_TOKENS = 16
# DSpark: the confidence head cuts drafts, so spec counters depend on the drafter's weights
SPEC_ARGS = ["--spec-confidence-threshold", "0.5"]
HOOK_T = 'graphswap:weight_update_hook_runs_total{model="target"}'
HOOK_D = 'graphswap:weight_update_hook_runs_total{model="draft"}'


# ---------------------------------------------------------------------------------------------------
# helpers shared by the test_weights_*.py scripts
# ---------------------------------------------------------------------------------------------------

def st_raw(header, data=b"", pad=True):
    """safetensors bytes from a header dict (written as given) and a data section."""
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def st_encode(tensors, metadata=None):
    """A valid safetensors bucket from RawTensor-like objects (name, dtype, shape, data), in order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + len(t.data)]}
        off += len(t.data)
    return st_raw(header, b"".join(t.data for t in tensors))


def ckpt(model_dir, prefix=""):
    """{name: RawTensor} of a checkpoint folder, names prefixed (model "all": "draft.")."""
    out = {}
    for n, t in R.read_checkpoint_tensors(model_dir).items():
        out[prefix + n] = R.RawTensor(prefix + n, t.dtype, t.shape, t.data)
    return out


def as_f32(t):
    """The same tensor sent as F32 (exact for BF16 values)."""
    return R.RawTensor(t.name, "F32", t.shape, R.encode_array("F32", t.to_f64()))


def split_groups(names, prefix=""):
    """q/k/v and gate/up of one layer (target layer 1, drafter layer 0) present in names."""
    groups = []
    for layer in ("model.layers.1.", prefix + "layers.0."):
        for g in (["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["mlp.gate_proj", "mlp.up_proj"]):
            members = [layer + m + ".weight" for m in g]
            members = [m for m in members if m in names]
            if len(members) > 1:
                groups.append(members)
    return groups


def make_buckets(names, kind, rng, prefix=""):
    """Bucket layout of a shuffled tensor list: "one" tensor per bucket, "all" in one bucket, or
    "mixed" sizes where the parts of every fused weight (q/k/v, gate/up) land in different buckets."""
    names = sorted(names)
    rng.shuffle(names)
    if kind == "one":
        return [[n] for n in names]
    if kind == "all":
        return [names]
    groups = split_groups(names, prefix)
    special = set(n for g in groups for n in g)
    rest = [n for n in names if n not in special]
    k = max(4, len(names) // 4)
    buckets = [[] for _ in range(k)]
    for i, n in enumerate(rest):  # sizes vary: the first k fill one each, the rest land anywhere
        buckets[i if i < k else rng.randrange(k)].append(n)
    for g in groups:
        for n, b in zip(g, rng.sample(range(k), len(g))):
            buckets[b].append(n)
    for b in buckets:
        rng.shuffle(b)
    rng.shuffle(buckets)
    return [b for b in buckets if b]


def split_ok(buckets, prefix=""):
    """True when no bucket holds two parts of the same fused weight."""
    where = {}
    for i, b in enumerate(buckets):
        for n in b:
            where[n] = i
    for g in split_groups(list(where), prefix):
        if len(set(where[n] for n in g)) != len(g):
            return False
    return True


def post_bucket(srv, body, headers=None, **kw):
    h = dict(OCT)
    if headers:
        h.update(headers)
    return H.post(srv, "/v1/weights/bucket", body, headers=h, **kw)


def push(C, srv, what, tensors, buckets, begin, finish=None, f32=(), headers=None):
    """One session: begin -> buckets -> finish, every call checked. Returns the finish body or None."""
    hdr = headers or {}
    r = H.post(srv, "/v1/weights/begin", begin, headers=hdr)
    if not C.check(r.status == 200 and r.json.get("state") == "updating", "%s: begin: %r" % (what, r)):
        return None
    for i, b in enumerate(buckets):
        ts = [as_f32(tensors[n]) if n in f32 else tensors[n] for n in b]
        r = post_bucket(srv, st_encode(ts), headers=hdr)
        if not C.check(r.status == 200 and r.json.get("tensors") == len(b),
                       "%s: bucket %d of %d (%d tensors): %r" % (what, i + 1, len(buckets), len(b), r)):
            H.post(srv, "/v1/weights/abort", {}, headers=hdr)
            return None
    r = H.post(srv, "/v1/weights/finish", finish or {}, headers=hdr)
    if not C.check(r.status == 200 and r.json.get("state") == "ready", "%s: finish: %r" % (what, r)):
        return None
    return r.json


def checksums(srv, model, headers=None):
    r = H.get(srv, "/v1/weights/checksums?model=%s" % model, headers=headers)
    if r.status != 200 or not isinstance((r.json or {}).get("tensors"), dict):
        return {"_error": repr(r)}
    return r.json["tensors"]


def greedy(srv, ids, max_tokens=GEN_TOKENS):
    """(token ids, spec counters or None, weight_version) of a greedy completion; or the error."""
    r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                                        "ignore_eos": True, "return_token_ids": True})
    if r.status != 200:
        return ("error", r.status, r.raw[:300])
    sp = r.json["usage"].get("spec")
    spec = None if sp is None else (sp["drafts"], sp["draft_tokens"], sp["accepted_tokens"])
    return (r.json["choices"][0]["token_ids"], spec, r.json.get("weight_version"))


def snap(srv, draft=True):
    """Everything a hot update must reproduce: checksums of both models and greedy outputs."""
    out = {"target": checksums(srv, "target"), "gen": [greedy(srv, p) for p in PROMPTS]}
    if draft:
        out["draft"] = checksums(srv, "draft")
    return out


def cold_snap(C, binary, target, draft=None, args=SPEC_ARGS):
    """A fresh server cold-started on the checkpoint(s): its snapshot, then it is stopped."""
    a = list(args) + (["--draft", draft] if draft else [])
    srv = H.Server(C, binary, target, args=a)
    try:
        return snap(srv, draft is not None)
    finally:
        srv.stop()
        srv.kill()


def diff_sums(got, want):
    """Names whose checksum differs (or exists on one side only)."""
    return sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))


def same(C, what, got, want, version=None):
    """Checks a hot snapshot against a cold one (and the responses' version)."""
    for m in ("target", "draft"):
        if m not in want:
            continue
        d = diff_sums(got.get(m, {}), want[m])
        C.check(not d, "%s: %s checksums differ from the cold start in %s" % (what, m, d[:6]))
    for i, (g, w) in enumerate(zip(got["gen"], want["gen"])):
        C.check(g[:2] == w[:2], "%s: prompt %d: greedy output / spec differs from the cold start:\n  hot  %r\n  cold %r"
                % (what, i, g[:2], w[:2]))
        if version is not None:
            C.check(g[2] == version, "%s: prompt %d: weight_version %r, expected %r" % (what, i, g[2], version))


def hooks(srv):
    m = H.metrics(srv)
    return int(m.get(HOOK_T, -1)), int(m.get(HOOK_D, -1))


def check_hooks(C, what, before, after, dt, dd):
    C.check(after[0] - before[0] == dt and after[1] - before[1] == dd,
            "%s: hook runs target %d -> %d, draft %d -> %d; expected +%d / +%d"
            % (what, before[0], after[0], before[1], after[1], dt, dd))


def weights_info(srv, headers=None):
    r = H.get(srv, "/v1/weights", headers=headers)
    return r.json if r.status == 200 and isinstance(r.json, dict) else {"_error": repr(r)}


def mk_drafter(C, binary, target, out, seed, arch="dspark", extra=()):
    shutil.rmtree(out, ignore_errors=True)
    p = H.subprocess.run([binary, "mkmodel", "--arch", arch, "--target", target, "--out", out, "--layers", "1",
                          "--block-size", "4", "--seed", str(seed)] + list(extra),
                         stdout=H.subprocess.PIPE, stderr=H.subprocess.PIPE, timeout=120)
    if p.returncode != 0:
        C.fail("mkmodel %s %s exited %d: %s" % (arch, out, p.returncode, p.stderr.decode(errors="replace")))
        sys.exit(C.finish())
    return out


def write_merged(src_dir, out_dir, replace):
    """A copy of the checkpoint folder src_dir where the tensors in `replace` ({name: RawTensor})
    replace the stored ones (numpy round trip in the stored dtype), as one model.safetensors."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    for f in os.listdir(src_dir):
        if f.endswith(".json") and not f.endswith(".index.json"):
            shutil.copy(os.path.join(src_dir, f), out_dir)
    base = R.read_checkpoint_tensors(src_dir)
    tensors = []
    for n in sorted(base):
        t = base[n]
        if n in replace:
            arr = replace[n].to_f64()
            assert arr.shape == t.shape, (n, arr.shape, t.shape)
            t = R.RawTensor(n, t.dtype, t.shape, R.encode_array(t.dtype, np.asarray(arr)))
        tensors.append(t)
    R.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    return out_dir


# ---------------------------------------------------------------------------------------------------
# part 1 tests
# ---------------------------------------------------------------------------------------------------

def http_updates(C, hot, ckpts, refs, rng):
    """Native HTTP sessions for target, draft and all, in several bucket layouts."""
    T = {0: ckpt(ckpts["T0"]), 1: ckpt(ckpts["T1"])}
    D = {0: ckpt(ckpts["D0"]), 1: ckpt(ckpts["D1"])}
    DP = {0: ckpt(ckpts["D0"], "draft."), 1: ckpt(ckpts["D1"], "draft.")}
    steps = [
        # what, model, tensors, bucket kind, pause, version via begin|finish, expected ref, hooks (t, d)
        ("target T0->T1, one tensor per bucket", "target", T[1], "one", "wait", ("begin", "t1-one"), (1, 0), (1, 0)),
        ("target T1->T0, all in one bucket", "target", T[0], "all", "abort", ("finish", "t0-all"), (0, 0), (1, 0)),
        ("target T0->T1, mixed buckets, F32 parts", "target", T[1], "mixed", "keep", ("begin", "t1-mixed"), (1, 0), (1, 0)),
        ("draft D0->D1, mixed buckets", "draft", D[1], "mixed", "recompute", ("finish", "d1-mixed"), (1, 1), (0, 1)),
        ("draft D1->D0, one tensor per bucket", "draft", D[0], "one", "wait", ("begin", 7), (1, 0), (0, 1)),
        ("all -> (T0, D1), mixed buckets", "all", dict(T[0], **DP[1]), "mixed", "wait", ("begin", "all-01"), (0, 1), (1, 1)),
        ("all -> (T1, D1), all in one bucket", "all", dict(T[1], **DP[1]), "all", "abort", ("finish", "all-11"), (1, 1), (1, 1)),
        ("all -> (T0, D0), one tensor per bucket", "all", dict(T[0], **DP[0]), "one", "keep", ("begin", "all-00"), (0, 0), (1, 1)),
    ]
    for what, model, tensors, kind, pause, (vwhere, version), ref, (dt, dd) in steps:
        prefix = "draft." if model == "all" else ""
        buckets = make_buckets(list(tensors), kind, rng, prefix)
        if kind == "mixed":
            C.check(split_ok(buckets, prefix) and len(split_groups(list(tensors), prefix)) >= 2,
                    "%s: layout does not split the fused weights: %r" % (what, buckets))
        f32 = set(n for n in tensors if rng.random() < 0.3) if "F32" in what else ()
        begin = {"mode": "full", "model": model, "pause": pause}
        finish = {}
        (begin if vwhere == "begin" else finish)["version"] = version
        h0 = hooks(hot)
        res = push(C, hot, what, tensors, buckets, begin, finish, f32=f32)
        if res is None:
            continue
        vstr = str(version)
        C.check(res.get("version") == vstr, "%s: finish reports version %r, expected %r" % (what, res.get("version"), vstr))
        lu = res.get("last_update", {})
        C.check(lu.get("tensors") == len(tensors) and lu.get("buckets") == len(buckets),
                "%s: last_update %r, expected %d tensors in %d buckets" % (what, lu, len(tensors), len(buckets)))
        check_hooks(C, what, h0, hooks(hot), dt, dd)
        same(C, what, snap(hot), refs[ref], version=vstr)


def disk_updates(C, hot, ckpts, refs, tmp):
    root = ckpts["root"]
    steps = [
        ("load target T1", "/v1/weights/load", {"path": ckpts["T1"], "model": "target", "version": "disk-1"},
         (1, 0), (1, 0), "disk-1"),
        ("load all (T0, D1)", "/v1/weights/load", {"path": ckpts["T0"], "draft_path": ckpts["D1"], "model": "all",
                                                    "pause": "abort", "version": "disk-2"}, (0, 1), (1, 1), "disk-2"),
        ("load draft D0 (a path with .. inside the root)", "/v1/weights/load",
         {"path": os.path.join(root, "T0", "..", "D0"), "model": "draft", "version": "disk-3"}, (0, 0), (0, 1), "disk-3"),
        ("SGLang update_weights_from_disk T1", "/update_weights_from_disk",
         {"model_path": ckpts["T1"], "abort_all_requests": True, "weight_version": "sg-1"}, (1, 0), (1, 0), "sg-1"),
    ]
    for what, route, body, ref, (dt, dd), version in steps:
        h0 = hooks(hot)
        r = H.post(hot, route, body)
        if route == "/update_weights_from_disk":
            C.check(r.status == 200 and r.json.get("success") is True and isinstance(r.json.get("message"), str),
                    "%s: %r" % (what, r))
        else:
            C.check(r.status == 200 and r.json.get("state") == "ready" and r.json.get("version") == version,
                    "%s: %r" % (what, r))
            C.check(r.json.get("last_update", {}).get("buckets", 0) > 1,
                    "%s: --update-bucket-bytes did not split the load into buckets: %r" % (what, r.json))
        check_hooks(C, what, h0, hooks(hot), dt, dd)
        same(C, what, snap(hot), refs[ref], version=version)
    # paths outside --weights-root: 403 and nothing changes (the server is at (T1, D0))
    outside = os.path.join(tmp, "outside")
    shutil.rmtree(outside, ignore_errors=True)
    shutil.copytree(ckpts["T0"], os.path.join(outside, "T0"))
    link = os.path.join(root, "escape")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join(outside, "T0"), link)
    before = snap(hot)
    h0 = hooks(hot)
    bad = [
        ("outside the root", "/v1/weights/load", {"path": os.path.join(outside, "T0")}, 403, "path"),
        ("a symlink out of the root", "/v1/weights/load", {"path": link}, 403, "path"),
        ("'..' out of the root", "/v1/weights/load", {"path": os.path.join(root, "..", "outside", "T0")}, 403, "path"),
        ("draft_path outside the root", "/v1/weights/load",
         {"path": ckpts["T0"], "draft_path": os.path.join(outside, "T0"), "model": "all"}, 403, "draft_path"),
        ("SGLang outside the root", "/update_weights_from_disk", {"model_path": os.path.join(outside, "T0")}, 403,
         "model_path"),
        ("a missing folder under the root", "/v1/weights/load", {"path": os.path.join(root, "nope")}, 400, "path"),
        ("no path", "/v1/weights/load", {"model": "target"}, 400, "path"),
    ]
    for what, route, body, status, field in bad:
        r = H.post(hot, route, body)
        if route == "/update_weights_from_disk" and r.status == status:
            C.check(r.json is not None and (r.json.get("success") is False or "error" in r.json),
                    "%s: body %r" % (what, r))
        else:
            H.error_ok(C, what, r, status, field)
    C.check(weights_info(hot).get("state") == "ready", "after refused loads: %r" % weights_info(hot))
    check_hooks(C, "refused loads", h0, hooks(hot), 0, 0)
    same(C, "after refused loads", snap(hot), before)


def partial_updates(C, binary, hot, ckpts, tmp):
    """Partial sessions equal a cold start on the merged checkpoint (the server is at (T1, D0))."""
    T0, T1, D0, D1 = ckpts["T0"], ckpts["T1"], ckpts["D0"], ckpts["D1"]
    t0 = ckpt(T0)
    layer = {n: t for n, t in t0.items() if n.startswith("model.layers.1.")}
    M = write_merged(T1, os.path.join(tmp, "M_T1_layer1_from_T0"), layer)
    want = cold_snap(C, binary, M, D0)
    C.check(want["target"] != checksums(hot, "target"), "partial: the merged checkpoint equals the current one")
    h0 = hooks(hot)
    res = push(C, hot, "partial target layer 1", layer, make_buckets(list(layer), "mixed", random.Random(5)),
               {"mode": "partial", "model": "target", "version": "partial-1"})
    if res:
        C.check(res["last_update"]["tensors"] == len(layer), "partial: last_update %r" % res["last_update"])
    check_hooks(C, "partial target", h0, hooks(hot), 1, 0)
    same(C, "partial target layer 1", snap(hot), want, version="partial-1")
    # the drafter: k_proj feeds the derived stacked context K/V weight, fc is plain
    d1 = ckpt(D1)
    part = {n: d1[n] for n in ("layers.0.self_attn.k_proj.weight", "fc.weight")}
    MD = write_merged(D0, os.path.join(tmp, "MD_D0_kproj_fc_from_D1"), part)
    want = cold_snap(C, binary, M, MD)
    cur = checksums(hot, "draft")
    C.check(want["draft"].get("derived.ctx_kv_weight") != cur.get("derived.ctx_kv_weight"),
            "partial draft: derived.ctx_kv_weight would not change")
    h0 = hooks(hot)
    push(C, hot, "partial draft", part, [[n] for n in sorted(part)],
         {"mode": "partial", "model": "draft", "pause": "keep", "version": "partial-2"})
    check_hooks(C, "partial draft", h0, hooks(hot), 0, 1)
    same(C, "partial draft k_proj + fc", snap(hot), want, version="partial-2")
    # a partial update of nothing but a finish: no hook, no new version
    h0 = hooks(hot)
    v0 = weights_info(hot).get("version_number")
    r = H.post(hot, "/v1/weights/begin", {"mode": "partial", "model": "all"})
    C.check(r.status == 200, "empty partial begin: %r" % r)
    r = H.post(hot, "/v1/weights/finish", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "empty partial finish: %r" % r)
    check_hooks(C, "empty partial session", h0, hooks(hot), 0, 0)
    C.check(weights_info(hot).get("version_number") == v0, "an empty session bumped the version number")


def main():
    C = H.Checker("weights_update")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_update")
    root = os.path.join(tmp, "root")
    os.makedirs(root, exist_ok=True)
    ck = {"root": os.path.realpath(root)}
    ck["T0"] = H.mkmodel(C, binary, os.path.join(ck["root"], "T0"), extra=["--layers", "3", "--seed", "1"])
    ck["T1"] = H.mkmodel(C, binary, os.path.join(ck["root"], "T1"), extra=["--layers", "3", "--seed", "2"])
    ck["D0"] = mk_drafter(C, binary, ck["T0"], os.path.join(ck["root"], "D0"), 3)
    ck["D1"] = mk_drafter(C, binary, ck["T0"], os.path.join(ck["root"], "D1"), 4)
    try:
        # references: cold starts on every (target, drafter) pair the updates reach
        refs = {(1, 0): cold_snap(C, binary, ck["T1"], ck["D0"]), (0, 1): cold_snap(C, binary, ck["T0"], ck["D1"]),
                (1, 1): cold_snap(C, binary, ck["T1"], ck["D1"])}
        hot = H.Server(C, binary, ck["T0"], args=["--draft", ck["D0"], "--weights-root", root,
                                                   "--update-bucket-bytes", "65536"] + SPEC_ARGS)
        refs[(0, 0)] = snap(hot)
        # the references must tell the checkpoints apart, else equality proves nothing
        C.check(refs[(0, 0)]["gen"][0][0] != refs[(1, 0)]["gen"][0][0], "T0 and T1 give the same greedy output")
        C.check([g[1] for g in refs[(1, 0)]["gen"]] != [g[1] for g in refs[(1, 1)]["gen"]],
                "D0 and D1 give the same spec counters")
        C.check([g[0] for g in refs[(1, 0)]["gen"]] == [g[0] for g in refs[(1, 1)]["gen"]],
                "greedy output depends on the drafter (I9)")
        C.check(any(n.startswith("derived.") for n in refs[(0, 0)]["draft"]), "no derived.* checksums for the drafter")
        C.check(refs[(0, 0)]["draft"].get("derived.ctx_kv_weight") != refs[(1, 1)]["draft"].get("derived.ctx_kv_weight"),
                "derived.ctx_kv_weight does not depend on the drafter weights")
        try:
            http_updates(C, hot, ck, refs, random.Random(1234))
            disk_updates(C, hot, ck, refs, tmp)
            partial_updates(C, binary, hot, ck, tmp)
            H.healthy(C, hot, "weights_update")
        finally:
            H.stop_clean(C, hot)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
