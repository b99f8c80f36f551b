#!/usr/bin/env python3
"""Weight updates over HTTP, part 2: failures, the plan guard, security, compatible routes.

- Incomplete full update: finish 422 naming the missing tensor; GET /v1/weights "inconsistent" with
  the reason; generation (plain, streaming, chat) 503 naming the reason; /health 503; a partial update
  is refused at begin (409 "a full update is needed", not counted ok); a complete full update does (ready, generation works). The same for a drafter
  tensor missing from an "all" session. Abort before any write -> ready; abort after a write ->
  inconsistent. Out-of-order calls (bucket / finish / abort without begin, a second begin, a load
  while a session is open) -> 409 with the state in the message.
- A table of bad buckets (container format, names, dtypes, shapes, the other model's names, sizes,
  HTTP framing): each -> 400 / 411 / 413 with a message naming the problem; nothing is written
  (checksums of both models unchanged after each, an abort afterwards leaves "ready"); the session
  stays usable (a complete update in the same session succeeds).
- The guard: a drafter whose hook reallocates its derived buffer on updates (the TEST-ONLY config
  "graphswap_test_hook_reallocates"): a target-only update still succeeds (the drafter is not
  re-processed); a drafter update -> finish 503, state "undefined" naming derived.ctx_kv_weight,
  /health 503, generation 503, further begin 503.
- Security: --admin-key -> weight routes 401 without / with a wrong Bearer key, generation unaffected;
  --host 0.0.0.0 without an admin key -> weight routes 403 (reached via 127.0.0.1 only).
- vLLM / SGLang routes once each: pause / resume / is_paused (a request waits while paused),
  pause_generation / continue_generation, weight_info / get_weight_version / update_weight_version,
  weight_checker and weights_checker (checksum, compare match and mismatch), reset_prefix_cache,
  flush_cache, start_weight_update + bucket + finish_weight_update, start_draft_weight_update.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import random
import re
import socket
import struct
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

MAX_BUCKET = 1 << 20


def raw_http(port, head, body=b"", shut_wr=False, timeout=30):
    """Sends bytes as they are; returns the first response as H.Resp (None if none came)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = b""
    try:
        try:
            s.sendall(head + body)
            if shut_wr:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        while True:
            r = parse_response(data)
            if r is not None:
                return r
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    return parse_response(data, final=True)


def parse_response(data, final=False):
    if b"\r\n\r\n" not in data:
        return None
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d+)", lines[0])
    if not m:
        return H.Resp(0, {}, data) if final else None
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "-1"))
    if n >= 0 and len(rest) >= n:
        return H.Resp(int(m.group(1)), hdrs, rest[:n])
    return H.Resp(int(m.group(1)), hdrs, rest) if final else None


def bucket_head(n, extra=b""):
    return (b"POST /v1/weights/bucket HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (n, extra))


def both_sums(srv):
    return {"target": W.checksums(srv, "target"), "draft": W.checksums(srv, "draft")}


def gen_status(srv):
    return H.post(srv, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})


def refused(C, what, srv, needle):
    """Generation (plain, streaming, chat) and /health answer 503 naming `needle`."""
    r = gen_status(srv)
    H.error_ok(C, "%s: completion" % what, r, 503)
    C.check(needle in (((r.json or {}).get("error") or {}).get("message") or ""),
            "%s: completion 503 does not name %r: %r" % (what, needle, r))
    st, _, s = H.stream_all(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 3, "stream": True})
    C.check(st == 503 and needle.encode() in getattr(s, "err_body", b""),
            "%s: streaming completion: %r %r" % (what, st, getattr(s, "err_body", b"")[:300]))
    r = H.post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    C.check(r.status == 503, "%s: chat: %r" % (what, r))
    r = H.get(srv, "/health")
    C.check(r.status == 503 and (r.json or {}).get("status") == "unavailable" and needle in (r.json.get("reason") or ""),
            "%s: /health: %r" % (what, r))


def full_push(C, srv, what, tensors, model="target", version=None, rng_seed=0):
    b = {"mode": "full", "model": model}
    if version:
        b["version"] = version
    prefix = "draft." if model == "all" else ""
    return W.push(C, srv, what, tensors, W.make_buckets(list(tensors), "mixed", random.Random(rng_seed), prefix), b)


# ---------------------------------------------------------------------------------------------------

def test_incomplete_abort_order(C, srv, ck):
    T0, T1 = W.ckpt(ck["T0"]), W.ckpt(ck["T1"])
    D0p = W.ckpt(ck["D0"], "draft.")
    base = both_sums(srv)
    m0 = H.metrics(srv)
    # 1. an incomplete full update
    missing = "model.layers.1.mlp.up_proj.weight"
    part = {n: t for n, t in T1.items() if n != missing}
    r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target", "version": "broken"})
    C.check(r.status == 200, "incomplete: begin %r" % r)
    names = sorted(part)
    for b in (names[: len(names) // 2], names[len(names) // 2:]):
        r = W.post_bucket(srv, W.st_encode([part[n] for n in b]))
        C.check(r.status == 200, "incomplete: bucket %r" % r)
    r = H.post(srv, "/v1/weights/finish", {})
    H.error_ok(C, "incomplete full update", r, 422, missing)
    info = W.weights_info(srv)
    C.check(info.get("state") == "inconsistent" and missing in (info.get("reason") or "") and not info.get("session_open"),
            "incomplete: /v1/weights %r" % info)
    C.check(info.get("version") == "0", "a failed update changed the version: %r" % info.get("version"))
    refused(C, "inconsistent", srv, missing)
    m = H.metrics(srv)
    C.check(m.get("graphswap:weights_state") == 2 and
            m.get('graphswap:weight_updates_total{result="failed"}', 0) ==
            m0.get('graphswap:weight_updates_total{result="failed"}', 0) + 1,
            "metrics after a 422: %r" % {k: v for k, v in m.items() if "weight" in k})
    # out of order while inconsistent: the state is in the message
    r = W.post_bucket(srv, W.st_encode([T0[missing]]))
    H.error_ok(C, "bucket without begin (inconsistent)", r, 409, "inconsistent")
    # 2. a partial update cannot repair an inconsistent model: refused at begin (409 saying a full
    #    update is needed), never counted as ok, no session opened, the state unchanged
    ok0 = W.weights_info(srv)["counters"]["updates_ok"]
    for body in ({"mode": "partial"}, {"mode": "partial", "model": "all"}):
        r = H.post(srv, "/v1/weights/begin", body)
        H.error_ok(C, "partial begin while inconsistent %r" % body, r, 409, "full update")
    info = W.weights_info(srv)
    C.check(info.get("state") == "inconsistent" and not info.get("session_open") and
            info["counters"]["updates_ok"] == ok0, "after the refused partial begins: %r" % info)
    C.check(gen_status(srv).status == 503, "generation after a refused partial update of an inconsistent model")
    # 3. a complete full update repairs it
    res = full_push(C, srv, "repair", T0, version="repaired")
    C.check(res is not None and res.get("state") == "ready" and res.get("reason") is None, "repair: %r" % res)
    H.healthy(C, srv, "after the repair")
    C.check(both_sums(srv) == base, "T0 pushed again does not equal the T0 cold start")
    # 4. abort before any write -> ready, nothing changes
    f0 = W.weights_info(srv)["counters"]["updates_failed"]
    r = H.post(srv, "/v1/weights/begin", {"model": "all"})
    C.check(r.status == 200, "abort-before: begin %r" % r)
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "abort before writes: %r" % r)
    C.check(W.weights_info(srv)["counters"]["updates_failed"] == f0, "an empty abort counted as a failed update")
    H.healthy(C, srv, "abort before writes")
    # 5. abort after a write -> inconsistent until a complete update
    r = H.post(srv, "/v1/weights/begin", {"model": "target"})
    r = W.post_bucket(srv, W.st_encode([T1["model.norm.weight"]]))
    C.check(r.status == 200, "abort-after: bucket %r" % r)
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "inconsistent" and "abort" in (r.json.get("reason") or ""),
            "abort after writes: %r" % r)
    refused(C, "aborted after writes", srv, "abort")
    full_push(C, srv, "repair after abort", T0)
    H.healthy(C, srv, "repair after abort")
    # 6. "all" with a drafter tensor missing: 422 names it as the drafter's
    allt = dict(T0, **D0p)
    miss_d = "draft.layers.0.self_attn.v_proj.weight"
    del allt[miss_d]
    r = H.post(srv, "/v1/weights/begin", {"model": "all"})
    r = W.post_bucket(srv, W.st_encode(list(allt.values())))
    C.check(r.status == 200, "all minus one: bucket %r" % r)
    r = H.post(srv, "/v1/weights/finish", {})
    H.error_ok(C, "incomplete all update", r, 422, "layers.0.self_attn.v_proj.weight")
    C.check("drafter" in (((r.json or {}).get("error") or {}).get("message") or ""),
            "422 does not say the drafter misses it: %r" % r)
    C.check(W.weights_info(srv).get("state") == "inconsistent", "incomplete all: not inconsistent")
    full_push(C, srv, "repair with all", dict(T0, **W.ckpt(ck["D0"], "draft.")), model="all")
    H.healthy(C, srv, "repair with all")
    C.check(both_sums(srv) == base, "after the repairs: checksums differ from the cold start")
    # 7. out-of-order calls -> 409 naming the state
    for path, body in (("/v1/weights/finish", {}), ("/v1/weights/abort", {}), ("/finish_weight_update", {})):
        r = H.post(srv, path, body)
        H.error_ok(C, "%s without begin" % path, r, 409, "ready")
        C.check(((r.json or {}).get("error") or {}).get("type") == "conflict", "409 type: %r" % r)
    r = W.post_bucket(srv, W.st_encode([T1["model.norm.weight"]]))
    H.error_ok(C, "bucket without begin", r, 409, "ready")
    r = H.post(srv, "/v1/weights/begin", {"model": "target"})
    C.check(r.status == 200, "begin: %r" % r)
    for path, body in (("/v1/weights/begin", {"model": "target"}), ("/start_weight_update", {}),
                       ("/start_draft_weight_update", {})):
        r = H.post(srv, path, body)
        H.error_ok(C, "a second begin via %s" % path, r, 409, "updating")
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "abort after the 409s: %r" % r)
    C.check(both_sums(srv) == base, "out-of-order calls changed the weights")
    H.healthy(C, srv, "after out-of-order calls")


def bad_bucket_table(T1, D1, D1p):
    """(label, session model, body or ("raw", kind), expected status, words the message must contain)."""
    emb, norm = T1["model.embed_tokens.weight"], T1["model.norm.weight"]
    up = T1["model.layers.1.mlp.up_proj.weight"]
    gate = T1["model.layers.0.mlp.gate_proj.weight"]
    nb = len(norm.data)

    dup = ('{"model.norm.weight":{"dtype":"BF16","shape":[%d],"data_offsets":[0,%d]},'
           '"model.norm.weight":{"dtype":"BF16","shape":[%d],"data_offsets":[%d,%d]}}'
           % (norm.shape[0], nb, norm.shape[0], nb, 2 * nb)).encode()
    good_hdr = {"model.norm.weight": {"dtype": "BF16", "shape": [norm.shape[0]], "data_offsets": [0, nb]}}
    t = [
        ("empty body", "target", b"", 400, ["8-byte"]),
        ("truncated to 4 bytes", "target", W.st_encode([norm])[:4], 400, ["8-byte"]),
        ("header length overflow (2^64-1)", "target", struct.pack("<Q", (1 << 64) - 1) + b"{}", 400, ["header length"]),
        ("header longer than the body", "target", struct.pack("<Q", 1000) + b'{"a":1}', 400, ["header length", "exceeds"]),
        ("truncated data section", "target", W.st_encode([norm, up])[:-10], 400, ["model.layers.1.mlp.up_proj.weight", "out of bounds"]),
        ("invalid JSON header", "target", struct.pack("<Q", 8) + b'{"a":,}x', 400, ["JSON"]),
        ("header is a JSON array", "target", W.st_raw([1, 2]), 400, ["not a JSON object"]),
        ("NUL in the header", "target", struct.pack("<Q", 8) + b'{"\x00":12}', 400, ["NUL"]),
        ("overlapping offsets", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": list(norm.shape), "data_offsets": [0, nb]},
                   "model.layers.0.input_layernorm.weight": {"dtype": "BF16", "shape": list(norm.shape),
                                                             "data_offsets": [nb - 2, 2 * nb - 2]}},
                  norm.data * 2), 400, ["overlap"]),
        ("a hole between tensors", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": list(norm.shape), "data_offsets": [0, nb]},
                   "model.layers.0.input_layernorm.weight": {"dtype": "BF16", "shape": list(norm.shape),
                                                             "data_offsets": [nb + 2, 2 * nb + 2]}},
                  norm.data * 2 + b"\0\0"), 400, ["hole"]),
        ("trailing bytes after the tensors", "target", W.st_raw(good_hdr, norm.data + b"\0" * 8), 400, ["trailing"]),
        ("offsets past the end", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": list(norm.shape), "data_offsets": [8, nb + 8]}},
                  norm.data), 400, ["out of bounds"]),
        ("offsets hold fewer bytes than the shape", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": list(norm.shape), "data_offsets": [0, nb - 2]}},
                  norm.data[:-2]), 400, ["model.norm.weight", "needs"]),
        ("reversed offsets", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": [0], "data_offsets": [4, 0]}}, b"\0" * 4), 400, ["reversed"]),
        ("missing data_offsets", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": list(norm.shape)}}, norm.data), 400, ["data_offsets"]),
        ("missing dtype", "target",
         W.st_raw({"model.norm.weight": {"shape": list(norm.shape), "data_offsets": [0, nb]}}, norm.data), 400, ["dtype"]),
        ("unknown dtype Q4", "target",
         W.st_raw({"model.norm.weight": {"dtype": "Q4", "shape": list(norm.shape), "data_offsets": [0, nb]}}, norm.data),
         400, ["unknown dtype", "Q4"]),
        ("bad dtype I32", "target",
         W.st_encode([W.R.RawTensor("model.norm.weight", "I32", norm.shape, b"\0" * (4 * norm.shape[0]))]), 400,
         ["model.norm.weight", "I32"]),
        ("negative shape", "target",
         W.st_raw({"model.norm.weight": {"dtype": "BF16", "shape": [-64], "data_offsets": [0, nb]}}, norm.data), 400,
         ["shape"]),
        ("wrong shape [3,3]", "target", W.st_encode([W.R.RawTensor(up.name, "BF16", (3, 3), b"\0" * 18)]), 400,
         [up.name, "shape", "[3,3]"]),
        ("1-D shape for a matrix", "target", W.st_encode([W.R.RawTensor(up.name, "BF16", (up.numel(),), up.data)]), 400,
         [up.name, "shape"]),
        ("transposed shape", "target", W.st_encode([W.R.RawTensor(gate.name, "BF16", gate.shape[::-1], gate.data)]), 400,
         [gate.name, "shape"]),
        ("unknown name", "target", W.st_encode([W.R.RawTensor("model.layers.9.mlp.up_proj.weight", "BF16", up.shape, up.data)]),
         400, ["unknown tensor", "model.layers.9.mlp.up_proj.weight"]),
        ("a drafter name in a target session", "target", W.st_encode([D1p["draft.fc.weight"]]), 400,
         ["unknown tensor", "draft.fc.weight"]),
        ("an unprefixed drafter name in a target session", "target", W.st_encode([D1["fc.weight"]]), 400,
         ["unknown tensor", "fc.weight"]),
        ("duplicate tensor name", "target", struct.pack("<Q", len(dup)) + dup + norm.data * 2, 400, ["duplicate"]),
        ("__metadata__ with a number", "target", W.st_raw(dict(good_hdr, __metadata__={"format": 1}), norm.data), 400,
         ["__metadata__"]),
        ("a good tensor then a wrong shape", "target",
         W.st_encode([emb, up, W.R.RawTensor(gate.name, "BF16", (2, 2), b"\0" * 8)]), 400, [gate.name, "shape"]),
        ("a good tensor then an unknown name", "target",
         W.st_encode([emb, W.R.RawTensor("model.bogus.weight", "BF16", (2,), b"\0" * 4)]), 400, ["model.bogus.weight"]),
        ("a good tensor then a bad dtype", "target",
         W.st_encode([up, W.R.RawTensor("model.norm.weight", "I32", norm.shape, b"\0" * (4 * norm.shape[0]))]), 400,
         ["model.norm.weight", "I32"]),
        ("oversize (> --max-bucket-bytes)", "target", ("raw", "oversize"), 413, ["max-bucket-bytes"]),
        ("Content-Length longer than the body", "target", ("raw", "short_body"), 400, ["truncated"]),
        ("Content-Length shorter than the body", "target", ("raw", "long_body"), 400, ["model.layers.1.mlp.up_proj.weight"]),
        ("no Content-Length (chunked)", "target", ("raw", "chunked"), 411, ["Content-Length"]),
        # drafter sessions
        ("a target name in a draft session", "draft", W.st_encode([norm]), 400, ["unknown tensor", "model.norm.weight"]),
        ("a prefixed name in a draft session", "draft", W.st_encode([D1p["draft.fc.weight"]]), 400,
         ["unknown tensor", "draft.fc.weight"]),
        ("wrong shape in a draft session", "draft",
         W.st_encode([D1["fc.weight"], W.R.RawTensor("layers.0.self_attn.k_proj.weight", "BF16", (1, 2), b"\0" * 4)]),
         400, ["layers.0.self_attn.k_proj.weight", "shape"]),
        # "all": both models validated before anything is written
        ("all: a target name behind draft.", "all", W.st_encode([W.R.RawTensor("draft.model.norm.weight", "BF16", norm.shape, norm.data)]),
         400, ["unknown tensor", "model.norm.weight"]),
        ("all: good target + bad drafter tensor", "all",
         W.st_encode([emb, up, D1p["draft.fc.weight"], W.R.RawTensor("draft.layers.0.self_attn.q_proj.weight", "BF16", (5,), b"\0" * 10)]),
         400, ["layers.0.self_attn.q_proj.weight", "shape"]),
        ("all: good drafter + bad target tensor", "all",
         W.st_encode([D1p["draft.fc.weight"], W.R.RawTensor(up.name, "F64", up.shape, b"\0" * (8 * up.numel()))]),
         400, [up.name, "F64"]),
    ]
    return t


def send_raw_bucket(srv, kind, T1):
    norm, up = T1["model.norm.weight"], T1["model.layers.1.mlp.up_proj.weight"]
    good = W.st_encode([norm, up])
    if kind == "oversize":  # headers only: the server must refuse on the declared length
        return raw_http(srv.port, bucket_head(MAX_BUCKET + 1))
    if kind == "short_body":  # declares 100 bytes more than it sends, then closes its side
        return raw_http(srv.port, bucket_head(len(good) + 100), good, shut_wr=True)
    if kind == "long_body":  # declares 10 bytes less than it sends: the bucket is cut short
        return raw_http(srv.port, bucket_head(len(good) - 10, b"Connection: close\r\n"), good, shut_wr=True)
    if kind == "chunked":
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(good), good)
        head = (b"POST /v1/weights/bucket HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        return raw_http(srv.port, head, body, shut_wr=True)
    raise ValueError(kind)


def test_bad_buckets(C, srv, ck):
    T0, T1 = W.ckpt(ck["T0"]), W.ckpt(ck["T1"])
    D1, D1p = W.ckpt(ck["D1"]), W.ckpt(ck["D1"], "draft.")
    base = both_sums(srv)
    table = bad_bucket_table(T1, D1, D1p)
    C.check(len(table) >= 20, "the bad-bucket table has %d rows" % len(table))
    model = None
    for label, sess, body, status, words in table:
        if sess != model:
            if model is not None:  # nothing was written: an abort leaves the weights ready
                r = H.post(srv, "/v1/weights/abort", {})
                C.check(r.status == 200 and r.json.get("state") == "ready",
                        "abort after the bad %s buckets: %r" % (model, r))
            r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": sess})
            C.check(r.status == 200, "begin %s: %r" % (sess, r))
            model = sess
        if isinstance(body, tuple):
            r = send_raw_bucket(srv, body[1], T1)
        else:
            r = W.post_bucket(srv, body)
        what = "bad bucket (%s session): %s" % (sess, label)
        if not C.check(r is not None, "%s: no response" % what):
            continue
        H.error_ok(C, what, r, status)
        msg = (((r.json or {}).get("error") or {}).get("message") or "") if isinstance(r.json, dict) else ""
        for w in words:
            C.check(w in msg, "%s: message does not name %r: %r" % (what, w, msg))
        info = W.weights_info(srv)
        C.check(info.get("session_open") is True and info.get("state") == "updating",
                "%s: the session did not survive: %r" % (what, info))
        now = both_sums(srv)
        for m in ("target", "draft"):
            d = W.diff_sums(now[m], base[m])
            C.check(not d, "%s: %s weights were written: %s" % (what, m, d))
    # the last session ("all") is still usable: a complete update in it succeeds
    tensors = dict(T1, **D1p)
    names = sorted(tensors)
    for b in (names[::2], names[1::2]):
        r = W.post_bucket(srv, W.st_encode([tensors[n] for n in b]))
        C.check(r.status == 200, "good bucket after the bad ones: %r" % r)
    r = H.post(srv, "/v1/weights/finish", {"version": "after-bad"})
    C.check(r.status == 200 and r.json.get("state") == "ready" and r.json.get("version") == "after-bad",
            "finish after the bad buckets: %r" % r)
    now = both_sums(srv)
    C.check(now["target"] != base["target"] and now["draft"] != base["draft"], "the good buckets changed nothing")
    H.healthy(C, srv, "after bad buckets")
    # and back to the cold-start weights
    full_push(C, srv, "back to (T0, D0)", dict(T0, **W.ckpt(ck["D0"], "draft.")), model="all")
    C.check(both_sums(srv) == base, "back to (T0, D0): checksums differ")


def test_guard(C, binary, ck, tmp):
    DH = W.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "DH"), 9, arch="dflash")
    cfgp = os.path.join(DH, "config.json")
    with open(cfgp) as f:
        cfg = json.load(f)
    cfg["graphswap_test_hook_reallocates"] = True
    with open(cfgp, "w") as f:
        json.dump(cfg, f, indent=1)
    srv = H.Server(C, binary, ck["T0"], args=["--draft", DH])
    try:
        H.healthy(C, srv, "guard server at start (the cold load does not reallocate)")
        # a target-only update never re-processes the drafter: its hook does not run, nothing moves
        h0 = W.hooks(srv)
        res = full_push(C, srv, "guard server: target update", W.ckpt(ck["T1"]), version="t-only")
        C.check(res is not None and res.get("state") == "ready", "target update with the test drafter: %r" % res)
        W.check_hooks(C, "guard server: target update", h0, W.hooks(srv), 1, 0)
        H.healthy(C, srv, "after a target-only update")
        # a drafter update: its hook reallocates derived.ctx_kv_weight -> the guard refuses
        D = W.ckpt(DH)
        r = H.post(srv, "/v1/weights/begin", {"model": "draft"})
        C.check(r.status == 200, "guard: begin %r" % r)
        r = W.post_bucket(srv, W.st_encode(list(D.values())))
        C.check(r.status == 200, "guard: bucket %r" % r)
        r = H.post(srv, "/v1/weights/finish", {"version": "never"})
        H.error_ok(C, "guard: finish", r, 503, "derived.ctx_kv_weight")
        info = W.weights_info(srv)
        C.check(info.get("state") == "undefined" and "derived.ctx_kv_weight" in (info.get("reason") or ""),
                "guard: /v1/weights %r" % info)
        C.check(info.get("version") == "t-only", "guard: the refused update changed the version: %r" % info.get("version"))
        refused(C, "undefined", srv, "derived.ctx_kv_weight")
        for path, body in (("/v1/weights/begin", {"model": "target"}), ("/v1/weights/begin", {"model": "draft"}),
                           ("/start_weight_update", {})):
            r = H.post(srv, path, body)
            H.error_ok(C, "guard: %s after undefined" % path, r, 503, "undefined")
        m = H.metrics(srv)
        C.check(m.get("graphswap:weights_state") == 3, "guard: weights_state metric %r" % m.get("graphswap:weights_state"))
        C.check(W.weights_info(srv).get("state") == "undefined", "guard: state left undefined")
    finally:
        rc, secs = srv.stop()
        C.check(rc == 0, "guard server exit %r (%.1fs): %s" % (rc, secs, srv.stderr_text()[-3000:]))
        H.sanitizer_clean(C, srv)
        srv.kill()


WEIGHT_ROUTES = [("GET", "/v1/weights", None), ("GET", "/v1/weights/checksums", None),
                 ("POST", "/v1/weights/begin", {"model": "target"}), ("POST", "/v1/weights/abort", {}),
                 ("POST", "/v1/weights/bucket", b"\0" * 16), ("POST", "/v1/weights/finish", {}),
                 ("POST", "/v1/weights/load", {"path": "/"}), ("POST", "/pause", {}), ("POST", "/resume", {}),
                 ("GET", "/is_paused", None), ("POST", "/start_weight_update", {}), ("GET", "/weight_info", None),
                 ("POST", "/weight_checker", {}), ("POST", "/reset_prefix_cache", {}),
                 ("POST", "/update_weights_from_disk", {"model_path": "/"}), ("GET", "/get_weight_version", None),
                 ("POST", "/update_weight_version", {"new_version": "x"}), ("POST", "/flush_cache", {}),
                 ("POST", "/pause_generation", {}), ("POST", "/continue_generation", {})]


def test_security(C, binary, ck):
    key = "admin-secret-1"
    srv = H.Server(C, binary, ck["T0"], args=["--admin-key", key])
    try:
        for method, path, body in WEIGHT_ROUTES:
            for hdr, label in (({}, "no key"), ({"Authorization": "Bearer wrong"}, "wrong key"),
                               ({"Authorization": "Bearer " + key + "x"}, "longer key")):
                r = H.request(srv, method, path, body, headers=hdr)
                H.error_ok(C, "admin key, %s: %s %s" % (label, method, path), r, 401)
        C.check(W.weights_info(srv, headers={"Authorization": "Bearer " + key}).get("session_open") is False,
                "an unauthorized begin opened a session")
        C.check(H.get(srv, "/is_paused", headers={"Authorization": "Bearer " + key}).json == {"is_paused": False},
                "an unauthorized /pause paused the server")
        H.healthy(C, srv, "admin-key server: generation and /health need no admin key")
        C.check(H.get(srv, "/metrics").status == 200, "admin-key server: /metrics")
        auth = {"Authorization": "Bearer " + key}
        T1 = W.ckpt(ck["T1"])
        res = W.push(C, srv, "update with the admin key", T1, [sorted(T1)], {"model": "target", "version": "k1"},
                     headers=auth)
        C.check(res is not None and res.get("version") == "k1", "update with the admin key: %r" % res)
        r = H.post(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "temperature": 0})
        C.check(r.status == 200 and r.json.get("weight_version") == "k1", "after the keyed update: %r" % r)
    finally:
        srv.stop()
        srv.kill()
    # a non-loopback listener without an admin key: weight routes are off (reached via 127.0.0.1)
    srv = H.Server(C, binary, ck["T0"], host="0.0.0.0")
    try:
        for method, path, body in WEIGHT_ROUTES:
            r = H.request(srv, method, path, body)
            H.error_ok(C, "0.0.0.0 without admin key: %s %s" % (method, path), r, 403)
        H.healthy(C, srv, "0.0.0.0 without admin key: generation works")
    finally:
        srv.stop()
        srv.kill()


def test_compat(C, srv, ck):
    # vLLM pause / resume: a request waits while paused, then completes
    r = H.post(srv, "/pause?mode=keep", {})
    C.check(r.status == 200 and r.json.get("status") == "paused", "/pause: %r" % r)
    C.check(H.get(srv, "/is_paused").json == {"is_paused": True}, "/is_paused after /pause")
    C.check(W.weights_info(srv).get("paused") is True, "/v1/weights paused flag")
    out = {}

    def bg():
        out["r"] = H.post(srv, "/v1/completions", {"prompt": [3, 4], "max_tokens": 4, "temperature": 0})

    t = threading.Thread(target=bg, daemon=True)
    t.start()
    t.join(1.0)
    C.check(t.is_alive(), "a request completed while generation was paused: %r" % out.get("r"))
    r = H.post(srv, "/resume", {})
    C.check(r.status == 200 and r.json.get("status") == "resumed", "/resume: %r" % r)
    t.join(60)
    C.check(not t.is_alive() and out.get("r") is not None and out["r"].status == 200, "request after /resume: %r" % out)
    C.check(H.get(srv, "/is_paused").json == {"is_paused": False}, "/is_paused after /resume")
    r = H.post(srv, "/pause", {"mode": "bogus"})
    H.error_ok(C, "/pause bogus mode", r, 400, "mode")
    # SGLang pause_generation / continue_generation
    r = H.post(srv, "/pause_generation", {"mode": "abort"})
    C.check(r.status == 200 and r.json.get("status") == "paused", "/pause_generation: %r" % r)
    C.check(H.get(srv, "/is_paused").json == {"is_paused": True}, "/is_paused after /pause_generation")
    r = H.post(srv, "/continue_generation", {})
    C.check(r.status == 200, "/continue_generation: %r" % r)
    C.check(H.get(srv, "/is_paused").json == {"is_paused": False}, "/is_paused after /continue_generation")
    # versions
    cur = W.weights_info(srv).get("version")
    for path in ("/weight_info", "/get_weight_version"):
        r = H.get(srv, path)
        C.check(r.status == 200 and r.json.get("weight_version") == cur, "%s: %r (expected %r)" % (path, r, cur))
    r = H.post(srv, "/update_weight_version", {"new_version": "renamed-7"})
    C.check(r.status == 200 and r.json.get("success") is True, "/update_weight_version: %r" % r)
    C.check(H.get(srv, "/get_weight_version").json.get("weight_version") == "renamed-7", "version not renamed")
    r = H.post(srv, "/v1/completions", {"prompt": [1], "max_tokens": 2, "temperature": 0})
    C.check(r.status == 200 and r.json.get("weight_version") == "renamed-7", "response version after rename: %r" % r)
    r = H.post(srv, "/update_weight_version", {})
    H.error_ok(C, "/update_weight_version without new_version", r, 400, "new_version")
    # checkers
    sums = W.checksums(srv, "target")
    dsums = W.checksums(srv, "draft")
    for path in ("/weight_checker", "/weights_checker"):
        r = H.post(srv, path, {"action": "checksum"})
        C.check(r.status == 200 and r.json.get("checksums") == sums, "%s checksum: %r" % (path, r))
        r = H.post(srv, path, {"action": "checksum", "model": "draft"})
        C.check(r.status == 200 and r.json.get("checksums") == dsums, "%s checksum draft: %r" % (path, r))
        r = H.post(srv, path, {"action": "compare", "checksums": sums})
        C.check(r.status == 200 and r.json.get("match") is True and r.json.get("mismatches") == [],
                "%s compare (equal): %r" % (path, r))
        bad = dict(sums)
        victim = sorted(bad)[1]
        bad[victim] = "0" * 64
        r = H.post(srv, path, {"action": "compare", "checksums": bad})
        C.check(r.status == 200 and r.json.get("match") is False and r.json.get("mismatches") == [victim],
                "%s compare (one differs): %r" % (path, r))
        r = H.post(srv, path, {"action": "bogus"})
        H.error_ok(C, "%s bogus action" % path, r, 400, "action")
    # caches
    for path in ("/reset_prefix_cache", "/flush_cache"):
        r = H.post(srv, path, {})
        C.check(r.status == 200, "%s: %r" % (path, r))
    # vLLM start_weight_update + native buckets + finish_weight_update, then the drafter's route
    T1 = W.ckpt(ck["T1"])
    h0 = W.hooks(srv)
    r = H.post(srv, "/start_weight_update", {})
    C.check(r.status == 200, "/start_weight_update: %r" % r)
    names = sorted(T1)
    for b in (names[:5], names[5:]):
        r = W.post_bucket(srv, W.st_encode([T1[n] for n in b]))
        C.check(r.status == 200, "bucket after /start_weight_update: %r" % r)
    r = H.post(srv, "/finish_weight_update", {"weight_version": "vllm-1"})
    C.check(r.status == 200 and r.json.get("version") == "vllm-1" and r.json.get("state") == "ready",
            "/finish_weight_update: %r" % r)
    C.check(H.get(srv, "/weight_info").json.get("weight_version") == "vllm-1", "/weight_info after the update")
    W.check_hooks(C, "vLLM target update", h0, W.hooks(srv), 1, 0)
    r = H.post(srv, "/weight_checker", {"action": "compare", "checksums": sums})
    C.check(r.status == 200 and r.json.get("match") is False and len(r.json.get("mismatches", [])) > 0,
            "weight_checker after an update still matches the old checksums: %r" % r)
    D0 = W.ckpt(ck["D1"])
    h0 = W.hooks(srv)
    r = H.post(srv, "/start_draft_weight_update", {})
    C.check(r.status == 200, "/start_draft_weight_update: %r" % r)
    r = W.post_bucket(srv, W.st_encode(list(D0.values())))
    C.check(r.status == 200, "drafter bucket after /start_draft_weight_update: %r" % r)
    r = H.post(srv, "/finish_weight_update", {"weight_version": "vllm-2"})
    C.check(r.status == 200 and r.json.get("version") == "vllm-2", "/finish_weight_update (draft): %r" % r)
    W.check_hooks(C, "vLLM draft update", h0, W.hooks(srv), 0, 1)
    C.check(W.checksums(srv, "draft") != dsums, "the drafter update changed nothing")
    H.healthy(C, srv, "after the compatible routes")


def main():
    C = H.Checker("weights_errors")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_errors")
    ck = {}
    ck["T0"] = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--layers", "2", "--seed", "11", "--no-tie"])
    ck["T1"] = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=["--layers", "2", "--seed", "12", "--no-tie"])
    ck["D0"] = W.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "D0"), 13)
    ck["D1"] = W.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "D1"), 14)
    try:
        srv = H.Server(C, binary, ck["T0"], args=["--draft", ck["D0"], "--max-bucket-bytes", str(MAX_BUCKET)])
        try:
            test_incomplete_abort_order(C, srv, ck)
            test_bad_buckets(C, srv, ck)
            test_compat(C, srv, ck)
        finally:
            H.stop_clean(C, srv)
        test_guard(C, binary, ck, tmp)
        test_security(C, binary, ck)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
