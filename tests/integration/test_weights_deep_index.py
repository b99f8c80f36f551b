#!/usr/bin/env python3
"""Weight updates from disk: a deeply nested model.safetensors.index.json (issue 23, regression).

The old server parsed a disk load's index with a raw cJSON_Parse on the civetweb worker that took
the request (server/weights/weights_api.c, confine_ckpt): cJSON recurses once per nesting level,
and an index of ~900 nested arrays overflowed the worker's ~100 KiB stack: SIGSEGV, the whole
server gone. Every parse now goes through mdl_json_parse (models/format/json_guard.h), which
refuses more than MDL_JSON_MAX_DEPTH (128) levels before cJSON sees the text; the engine thread's
reader (models/model.c, mdl_ckpt_foreach_bucket) does the same.

Checks, on a tiny 2-layer model served with --weights-root:
  - POST /v1/weights/load of a folder whose index is {"weight_map": [[[...900...]]]}: 400 naming
    the index file and "nests deeper than 128 levels", param "path"; likewise the nesting deeper
    inside an object value ({"metadata": {}, "weight_map": {"t": {"x": [[[...]]]}}}), the
    nesting made of objects, and SGLang's POST /update_weights_from_disk (model_path);
  - an index exactly 128 deep (passes the guard, not an index: 400 "weight_map"), and one that is
    not JSON at all: 400 too;
  - after each refusal: GET /health 200 "ok", the weights "ready", version unchanged, checksums
    unchanged, and greedy output of /v1/completions and SGLang's /generate at temperature 0
    identical to the output before;
  - a well-formed sharded index over the same folder still loads (200) and changes nothing.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import shutil
import struct
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402

DEEP = 900
PROMPTS = [[5, 6, 7, 8], list(range(40, 60))]
GEN = 12
INDEX = "model.safetensors.index.json"


def tensor_names(model_dir):
    """The tensor names of model_dir/model.safetensors, from its header (stdlib only, no numpy)."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return sorted(k for k in json.loads(f.read(n)) if k != "__metadata__")


def checksums(srv):
    r = H.get(srv, "/v1/weights/checksums?model=target")
    if r.status != 200 or not isinstance((r.json or {}).get("tensors"), dict):
        return {"_error": repr(r)}
    return r.json["tensors"]


def weights_info(srv):
    r = H.get(srv, "/v1/weights")
    return r.json if r.status == 200 and isinstance(r.json, dict) else {"_error": repr(r)}


def err_msg(r):
    return ((r.json or {}).get("error") or {}).get("message") or ""


def outputs(srv):
    """Greedy outputs: /v1/completions token ids and SGLang /generate output_ids, per prompt."""
    out = []
    for ids in PROMPTS:
        r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": GEN, "temperature": 0, "ignore_eos": True,
                                            "return_token_ids": True})
        out.append(r.json["choices"][0]["token_ids"] if r.status == 200 else ("error", r.status, r.raw[:200]))
        r = H.post(srv, "/generate", {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": GEN,
                                                                             "ignore_eos": True}})
        out.append(r.json.get("output_ids") if r.status == 200 and r.json else ("error", r.status, r.raw[:200]))
    return out


def ckpt_folder(root, name, src, index_text):
    """A folder under the root: src's files plus an index holding index_text."""
    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, d)
    with open(os.path.join(d, INDEX), "w") as f:
        f.write(index_text)
    return d


def main():
    C = H.Checker("weights_deep_index")
    binary = H.gs_bin(C)
    tmp = os.path.abspath(H.scratch("weights_deep_index"))
    root = os.path.join(tmp, "root")
    os.makedirs(root, exist_ok=True)
    t0 = H.mkmodel(C, binary, os.path.join(root, "T0"), extra=["--layers", "2", "--seed", "11"])
    names = sorted(tensor_names(t0))
    arr = "[" * DEEP + "]" * DEEP
    deep_cases = [
        ("weight_map: %d nested arrays" % DEEP, '{"weight_map": ' + arr + '}', "/v1/weights/load", "path"),
        ("%d nested arrays inside an object value" % DEEP,
         '{"metadata": {"total_size": 1}, "weight_map": {"%s": {"x": %s}}}' % (names[0], arr),
         "/v1/weights/load", "path"),
        ("%d nested objects" % DEEP, '{"weight_map": ' + '{"a":' * DEEP + '1' + '}' * DEEP + '}',
         "/v1/weights/load", "path"),
        ("SGLang /update_weights_from_disk, %d nested arrays" % DEEP, '{"weight_map": ' + arr + '}',
         "/update_weights_from_disk", "model_path"),
    ]
    edge = 127  # with the outer object: exactly 128 levels, which the guard lets through
    other_cases = [
        ("an index exactly 128 deep (not an index)", '{"weight_map": ' + "[" * edge + "]" * edge + '}', "weight_map"),
        ("an index that is not JSON", '{"weight_map": {"a": "model.safetensors",', "weight_map"),
    ]
    try:
        srv = H.Server(C, binary, t0, args=["--weights-root", root])
        try:
            base_out = outputs(srv)
            base_sums = checksums(srv)
            base_ver = weights_info(srv).get("version")
            C.check(all(not (isinstance(o, tuple) and o[0] == "error") for o in base_out) and
                    all(len(o) == GEN for o in base_out), "greedy outputs before: %r" % (base_out,))
            C.check(bool(base_sums) and "_error" not in base_sums, "checksums before: %r" % (base_sums,))

            def unchanged(what):
                r = H.get(srv, "/health")
                C.check(r.status == 200 and (r.json or {}).get("status") == "ok",
                        "%s: /health after: %r (server stderr: %s)" % (what, r, srv.stderr_text()[-2000:]))
                info = weights_info(srv)
                C.check(info.get("state") == "ready" and info.get("version") == base_ver,
                        "%s: weights after: %r" % (what, info))
                C.check(checksums(srv) == base_sums, "%s: the checksums changed" % what)
                got = outputs(srv)
                C.check(got == base_out, "%s: greedy outputs changed: %r != %r" % (what, got, base_out))

            for i, (what, text, route, key) in enumerate(deep_cases):
                d = ckpt_folder(root, "deep%d" % i, t0, text)
                r = H.post(srv, route, {key: d})
                C.check(srv.proc.poll() is None, "%s: the server died (exit %r): %s" %
                        (what, srv.proc.poll(), srv.stderr_text()[-2000:]))
                if srv.proc.poll() is not None:
                    break
                msg = err_msg(r) if route == "/v1/weights/load" else str((r.json or {}).get("message") or err_msg(r))
                C.check(r.status == 400, "%s: expected HTTP 400, got %r" % (what, r))
                if route == "/v1/weights/load":
                    H.error_ok(C, what, r, 400, key)
                C.check(os.path.join(os.path.realpath(d), INDEX) in msg and "nests deeper than 128 levels" in msg,
                        "%s: the message does not name the index and the depth: %r" % (what, r))
                unchanged(what)
            if srv.proc.poll() is None:
                for i, (what, text, needle) in enumerate(other_cases):
                    d = ckpt_folder(root, "other%d" % i, t0, text)
                    r = H.post(srv, "/v1/weights/load", {"path": d})
                    H.error_ok(C, what, r, 400, "path")
                    C.check(INDEX in err_msg(r) and needle in err_msg(r) and "deeper" not in err_msg(r),
                            "%s: message %r" % (what, err_msg(r)))
                    unchanged(what)
                # the same folder layout with a well-formed index still loads
                good = {"metadata": {}, "weight_map": {n: "model.safetensors" for n in names}}
                d = ckpt_folder(root, "sharded", t0, json.dumps(good))
                r = H.post(srv, "/v1/weights/load", {"path": d, "version": "sharded-1"})
                C.check(r.status == 200, "a well-formed sharded index: %r" % r)
                C.check(checksums(srv) == base_sums and outputs(srv) == base_out,
                        "reloading the same weights through an index changed them")
                H.healthy(C, srv, "after the loads")
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
