#!/usr/bin/env python3
"""SGLang's /weights_checker actions as slime and miles drive them (--check-weight-update-equal):
snapshot -> reset_tensors -> the trainer's first sync -> compare.

The flow is slime's train.py (THUDM/slime, check_weights(action="snapshot"), then "reset_tensors",
then update_weights, then "compare"); the bodies and answers are SGLang's
(python/sglang/srt/entrypoints/http_server.py check_weights: {"success", "message"}, 400 when not
successful; python/sglang/srt/utils/weight_checker.py at sgl-project/sglang 05bed317: reset with
uniform random values, skip_tensor_list substrings neither reset nor compared).

- snapshot (model all) -> 200 success; reset_tensors -> every checkpoint tensor and derived buffer of
  both models differs from the cold start, the version string is unchanged, each model's post-load
  hook ran once, generation still answers; compare -> 400 success false naming the tensors.
- The sync in several partial sessions missing one tensor: compare (target) -> 400 naming exactly that
  checkpoint tensor; after it arrives: 200; after the drafter's sync: compare "all" 200, and checksums
  plus greedy tokens equal a cold start of the same checkpoints (hot == cold).
- skip_tensor_list ["lm_head"]: lm_head.weight is not reset and not compared.
- checksum: SGLang's ranks[0] {checksums, per_gpu_checksum (sha256 over sorted name + hash),
  parallelism_info} beside the top-level checksums.
- Errors: compare before any snapshot -> 400 naming snapshot; a bad action / skip_tensor_list /
  allow_quant_error -> 400; reset while a session is open -> 409; all leave the weights unchanged.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import hashlib
import os
import random
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

CK = "/weights_checker"


def ckpt_sums(srv, model):
    r = H.get(srv, "/v1/weights/checksums?model=%s&names=checkpoint" % model)
    return r.json["tensors"] if r.status == 200 else {"_error": repr(r)}


def push_partial(C, srv, what, tensors, names, rng, model="target"):
    """The trainer's sync as a series of partial sessions (one per bucket), like SGLang's per-call
    updates; names in shuffled order."""
    names = list(names)
    rng.shuffle(names)
    for i in range(0, len(names), 4):
        b = names[i:i + 4]
        W.push(C, srv, "%s: bucket %d" % (what, i // 4), tensors, [b],
               {"mode": "partial", "model": model, "pause": "wait"})


def test_flow(C, srv, ck, cold, rng):
    before = {"target": ckpt_sums(srv, "target"), "draft": ckpt_sums(srv, "draft")}
    version = H.get(srv, "/get_weight_version").json["weight_version"]
    r = H.post(srv, CK, {"action": "compare"})
    H.error_ok(C, "compare before any snapshot", r, 400, "snapshot")
    r = H.post(srv, CK, {"action": "snapshot", "model": "all"})
    C.check(r.status == 200 and r.json.get("success") is True and "tensors" in r.json.get("message", ""),
            "snapshot: %r" % r)
    h0 = W.hooks(srv)
    r = H.post(srv, CK, {"action": "reset_tensors", "model": "all", "allow_quant_error": False})
    C.check(r.status == 200 and r.json.get("success") is True, "reset_tensors: %r" % r)
    W.check_hooks(C, "reset_tensors", h0, W.hooks(srv), 1, 1)
    C.check(H.get(srv, "/get_weight_version").json["weight_version"] == version,
            "reset_tensors changed the version string")
    after = {"target": ckpt_sums(srv, "target"), "draft": ckpt_sums(srv, "draft")}
    for m in ("target", "draft"):
        same = sorted(n for n in before[m] if after[m].get(n) == before[m][n])
        C.check(set(after[m]) == set(before[m]) and not same,
                "reset_tensors left %s tensors unchanged: %s" % (m, same[:6]))
    r = H.post(srv, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})
    C.check(r.status == 200, "generation after reset_tensors: %r" % r)
    r = H.post(srv, CK, {"action": "compare", "model": "all"})
    C.check(r.status == 400 and r.json.get("success") is False and "differ" in r.json.get("message", "")
            and len(r.json.get("mismatches", [])) == len(before["target"]) + len(before["draft"]),
            "compare after the reset: %r" % (r,))
    # the sync, missing one tensor
    T0 = W.ckpt(ck["T0"])
    missing = "model.layers.1.mlp.up_proj.weight"
    push_partial(C, srv, "target sync without %s" % missing, T0, [n for n in T0 if n != missing], rng)
    r = H.post(srv, CK, {"action": "compare"})
    mism = r.json.get("mismatches", []) if r.json else []
    C.check(r.status == 400 and r.json.get("success") is False and missing in mism
            and missing in r.json.get("message", ""), "compare with %s not synced: %r" % (missing, r))
    C.check(not [n for n in mism if n in T0 and n != missing],
            "compare names checkpoint tensors that were synced: %s" % mism[:6])
    push_partial(C, srv, "the missing tensor", T0, [missing], rng)
    r = H.post(srv, CK, {"action": "compare"})
    C.check(r.status == 200 and r.json.get("success") is True and r.json.get("mismatches") == [],
            "compare after the whole target sync: %r" % r)
    r = H.post(srv, CK, {"action": "compare", "model": "all"})
    C.check(r.status == 400 and r.json.get("mismatches") and
            all(n.startswith("draft.") for n in r.json["mismatches"]),
            "compare all before the drafter's sync names the drafter only: %r" % r)
    D0 = W.ckpt(ck["D0"])
    push_partial(C, srv, "drafter sync", D0, list(D0), rng, model="draft")
    r = H.post(srv, CK, {"action": "compare", "model": "all"})
    C.check(r.status == 200 and r.json.get("success") is True, "compare all after both syncs: %r" % r)
    W.same(C, "after snapshot / reset / sync", W.snap(srv), cold)


def test_skip(C, srv, ck, rng):
    T0 = W.ckpt(ck["T0"])
    before = ckpt_sums(srv, "target")
    r = H.post(srv, CK, {"action": "snapshot"})
    C.check(r.status == 200, "snapshot: %r" % r)
    r = H.post(srv, CK, {"action": "reset_tensors", "skip_tensor_list": ["lm_head"]})
    C.check(r.status == 200 and r.json.get("success") is True, "reset with a skip list: %r" % r)
    after = ckpt_sums(srv, "target")
    C.check(after.get("lm_head.weight") == before.get("lm_head.weight"), "lm_head.weight was reset")
    C.check(after.get("model.norm.weight") != before.get("model.norm.weight"), "model.norm.weight not reset")
    push_partial(C, srv, "sync without lm_head", T0, [n for n in T0 if "lm_head" not in n], rng)
    r = H.post(srv, CK, {"action": "compare", "skip_tensor_list": ["lm_head"]})
    C.check(r.status == 200 and r.json.get("success") is True, "compare with the skip list: %r" % r)
    C.check(ckpt_sums(srv, "target") == before, "checksums after the sync differ from before the reset")


def test_checksum_shape(C, srv):
    r = H.post(srv, CK, {"action": "checksum"})
    ok = r.status == 200 and r.json.get("success") is True and isinstance(r.json.get("ranks"), list)
    if not C.check(ok, "checksum: %r" % r):
        return
    sums = r.json["checksums"]
    rk = r.json["ranks"][0]
    C.check(rk.get("checksums") == sums, "ranks[0].checksums differ from checksums")
    h = hashlib.sha256()
    for n in sorted(sums):
        h.update(n.encode())
        h.update(sums[n].encode())
    C.check(rk.get("per_gpu_checksum") == h.hexdigest(), "per_gpu_checksum: %r" % rk.get("per_gpu_checksum"))
    C.check(rk.get("parallelism_info") == {"tp_rank": 0, "tp_size": 1, "dp_rank": 0, "dp_size": 1, "pp_rank": 0,
                                           "pp_size": 1, "rank": 0, "size": 1},
            "parallelism_info: %r" % rk.get("parallelism_info"))


def test_errors(C, srv):
    before = ckpt_sums(srv, "target")
    for body, param in (({"action": "reset"}, "action"), ({"action": "reset_tensors", "skip_tensor_list": "lm"},
                                                          "skip_tensor_list"),
                        ({"action": "reset_tensors", "skip_tensor_list": [1]}, "skip_tensor_list"),
                        ({"action": "compare", "allow_quant_error": "yes"}, "allow_quant_error"),
                        ({"action": "snapshot", "model": "both"}, "model"),
                        ({"action": "checksum", "model": "all"}, "model")):
        r = H.post(srv, CK, body)
        H.error_ok(C, "weights_checker %r" % body, r, 400, param)
    r = H.post(srv, "/v1/weights/begin", {"mode": "partial"})
    C.check(r.status == 200, "begin: %r" % r)
    r = H.post(srv, CK, {"action": "reset_tensors"})
    H.error_ok(C, "reset_tensors while a session is open", r, 409)
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "abort: %r" % r)
    C.check(ckpt_sums(srv, "target") == before, "a refused weights_checker call changed the weights")
    H.healthy(C, srv, "after the refused calls")


def main():
    C = H.Checker("weights_checker")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_checker")
    rng = random.Random(7)
    ck = {"T0": H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--layers", "2", "--seed", "21", "--no-tie"])}
    ck["D0"] = W.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "D0"), 22)
    try:
        cold = W.cold_snap(C, binary, ck["T0"], ck["D0"])
        srv = H.Server(C, binary, ck["T0"], args=W.SPEC_ARGS + ["--draft", ck["D0"]])
        try:
            test_flow(C, srv, ck, cold, rng)
            test_skip(C, srv, ck, rng)
            test_checksum_shape(C, srv)
            test_errors(C, srv)
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
