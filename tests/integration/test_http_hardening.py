"""HTTP hardening of `graphswap serve`: hostile bodies, slow clients, the auth rule, API shapes.

Each case is a regression test of a defect found by probing the server as an attacker or as an
OpenAI-client user would (each failed on the code before its fix):
  - deeply nested JSON (900 levels, 1.8 KB) to /v1/completions, chat, /tokenize, /v1/weights/begin
    and inside a bucket's safetensors header: 400 naming the depth, server alive (it was a SIGSEGV:
    cJSON recursion on a civetweb worker's small stack); 100 levels in an ignored field still parse
  - a NUL in a JSON string (prompt, stop, chat content, /tokenize) is a 400, not a silently cut string
  - slowloris: 200 connections that send a partial header do not block /health (the worker pool was
    128 and a partial header held a worker for --request-timeout, 600 s); with a small pool the
    header read times out after --io-timeout and the server answers again
  - --api-key without --admin-key protects the admin routes (weights, /pause) too; /health and
    /metrics stay public
  - `model` other than the served name: 404 NotFoundError (vLLM); GET /v1/models/{id};
    response_format / guided_* / chat echo / chat_template refused with 400 instead of ignored;
    a 503 for unusable weights is not "overloaded" and has no Retry-After; context-length errors
    name the field that is too long
"""

import json
import os
import socket
import struct
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
U = [{"role": "user", "content": "hi"}]
DEEP = b"[" * 900 + b"]" * 900


def test_nesting(C, srv):
    for path in (CMPL, CHAT, "/tokenize", "/detokenize", "/v1/weights/begin"):
        r = T.post(srv, path, DEEP)
        T.error_ok(C, "900-deep array to %s" % path, r, 400)
        C.check("deeper than" in ((r.json or {}).get("error") or {}).get("message", ""),
                "%s: the error does not say the body is too deep: %r" % (path, r))
        nested_obj = b'{"prompt": [1], "x": ' + b'{"a":' * 900 + b"1" + b"}" * 900 + b"}"
        T.error_ok(C, "900-deep object inside a field of %s" % path, T.post(srv, path, nested_obj), 400)
    # a moderately nested ignored field is fine (JSON schemas nest a few dozen levels)
    body = b'{"prompt": [1, 2], "max_tokens": 1, "x": ' + b"[" * 100 + b"]" * 100 + b"}"
    r = T.post(srv, CMPL, body)
    C.check(r.status == 200, "100-deep ignored field: %r" % r)
    # brackets inside strings do not count
    r = T.post(srv, CMPL, {"prompt": "[" * 2000 + "{" * 2000, "max_tokens": 1})
    C.check(r.status == 200, "brackets inside a string counted as nesting: %r" % r)
    # inside a bucket's safetensors header (an open session: the bucket is refused, nothing changes)
    r = T.post(srv, "/v1/weights/begin", {"mode": "partial", "model": "target"})
    C.check(r.status == 200, "begin: %r" % r)
    hdr = b'{"__metadata__": ' + b"[" * 900 + b"]" * 900 + b"}"
    bucket = struct.pack("<Q", len(hdr)) + hdr
    r = T.request(srv, "POST", "/v1/weights/bucket", bucket, headers={"Content-Type": "application/octet-stream"})
    T.error_ok(C, "bucket with a 900-deep header", r, 400)
    r = T.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200, "abort: %r" % r)
    T.healthy(C, srv, "after deep JSON")


def test_nul(C, srv):
    cases = [
        ("prompt", CMPL, b'{"prompt": "ab\\u0000cd", "max_tokens": 1}'),
        ("stop", CMPL, b'{"prompt": "ab", "max_tokens": 1, "stop": ["x\\u0000"]}'),
        ("chat content", CHAT, b'{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 1}'),
        ("tokenize", "/tokenize", b'{"prompt": "a\\u0000b"}'),
        ("raw NUL byte", CMPL, b'{"prompt": "ab\x00cd", "max_tokens": 1}'),
    ]
    for what, path, body in cases:
        r = T.post(srv, path, body)
        T.error_ok(C, "NUL in %s" % what, r, 400)
        C.check("NUL" in ((r.json or {}).get("error") or {}).get("message", ""),
                "NUL in %s: the error does not say NUL: %r" % (what, r))
    # an escaped backslash before u0000 is not a NUL
    r = T.post(srv, "/tokenize", b'{"prompt": "a\\\\u0000b"}')
    C.check(r.status == 200, "escaped backslash + u0000 is text, not NUL: %r" % r)
    T.healthy(C, srv, "after NUL bodies")


def partial_header_conns(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
        socks.append(s)
    return socks


def health_within(srv, secs):
    t0 = time.time()
    try:
        r = T.get(srv, "/health", timeout=secs)
        return r.status == 200, time.time() - t0
    except OSError:
        return False, time.time() - t0


def test_slowloris(C, binary, model):
    # the default pool: 200 stalled connections do not starve /health
    srv = T.Server(C, binary, model)
    socks = []
    try:
        socks = partial_header_conns(srv.port, 200)
        time.sleep(0.5)
        ok, secs = health_within(srv, 5)
        C.check(ok, "/health did not answer within 5 s with 200 partial-header connections open (%.1f s)" % secs)
        r = T.post(srv, CMPL, {"prompt": [1, 2], "max_tokens": 2}, timeout=10)
        C.check(r.status == 200, "generation with 200 partial-header connections open: %r" % r)
    finally:
        for s in socks:
            s.close()
        T.stop_clean(C, srv)
    # a pool smaller than the attack: the partial headers time out after --io-timeout
    srv = T.Server(C, binary, model, ["--http-threads", "4", "--io-timeout", "2"])
    socks = []
    try:
        socks = partial_header_conns(srv.port, 12)
        time.sleep(0.3)
        ok, secs = health_within(srv, 30)
        C.check(ok and secs < 15, "/health with a full pool: answered %r after %.1f s (io-timeout 2 s)" % (ok, secs))
        closed = 0
        for s in socks:
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
                closed += 1
            except OSError:
                pass
        C.check(closed == len(socks), "only %d of %d partial-header connections were dropped" % (closed, len(socks)))
    finally:
        for s in socks:
            s.close()
        T.stop_clean(C, srv)


def test_auth_rule(C, binary, model):
    key = {"Authorization": "Bearer k-123"}
    srv = T.Server(C, binary, model, ["--api-key", "k-123"])
    try:
        for method, path, body in (("GET", "/v1/weights", None), ("POST", "/pause", {}),
                                   ("POST", "/v1/weights/begin", {"mode": "partial"}),
                                   ("GET", "/v1/weights/checksums", None), ("POST", "/flush_cache", {})):
            r = T.request(srv, method, path, body)
            T.error_ok(C, "--api-key, no key: %s %s" % (method, path), r, 401)
            r = T.request(srv, method, path, body, headers={"Authorization": "Bearer wrong"})
            T.error_ok(C, "--api-key, wrong key: %s %s" % (method, path), r, 401)
        r = T.request(srv, "GET", "/v1/weights", None, headers=key)
        C.check(r.status == 200, "--api-key: /v1/weights with the key: %r" % r)
        r = T.request(srv, "POST", "/pause", {}, headers=key)
        C.check(r.status == 200, "--api-key: /pause with the key: %r" % r)
        r = T.request(srv, "POST", "/resume", {}, headers=key)
        C.check(r.status == 200, "--api-key: /resume with the key: %r" % r)
        C.check(T.get(srv, "/health").status == 200, "/health must stay public")
        C.check(T.get(srv, "/metrics").status == 200, "/metrics must stay public")
    finally:
        T.stop_clean(C, srv)
    # with an admin key as well, the admin routes take the admin key only
    srv = T.Server(C, binary, model, ["--api-key", "k-123", "--admin-key", "adm-9"])
    try:
        T.error_ok(C, "admin key set: the API key does not open /v1/weights",
                   T.request(srv, "GET", "/v1/weights", None, headers=key), 401)
        r = T.request(srv, "GET", "/v1/weights", None, headers={"Authorization": "Bearer adm-9"})
        C.check(r.status == 200, "admin key set: /v1/weights with it: %r" % r)
    finally:
        T.stop_clean(C, srv)


def test_api_shape(C, srv, name):
    model = name
    r = T.post(srv, CMPL, {"model": "gpt-4", "prompt": [1], "max_tokens": 1})
    T.error_ok(C, "unknown model", r, 404, "model")
    C.check(((r.json or {}).get("error") or {}).get("type") == "NotFoundError", "unknown model type: %r" % r)
    r = T.post(srv, CHAT, {"model": "gpt-4", "messages": U, "max_tokens": 1})
    T.error_ok(C, "unknown model (chat)", r, 404, "model")
    r = T.post(srv, CMPL, {"model": model, "prompt": [1], "max_tokens": 1})
    C.check(r.status == 200, "the served model name: %r" % r)
    r = T.get(srv, "/v1/models/" + model)  # a name with a slash, as Hugging Face ids have
    C.check(r.status == 200 and (r.json or {}).get("id") == model and r.json.get("object") == "model",
            "GET /v1/models/{id}: %r" % r)
    r = T.get(srv, "/v1/models/gpt-4")
    T.error_ok(C, "GET /v1/models/gpt-4", r, 404)
    for what, path, body, field in (
            ("response_format json_object", CMPL, {"prompt": [1], "response_format": {"type": "json_object"}},
             "response_format"),
            ("response_format json_schema", CHAT, {"messages": U, "response_format": {"type": "json_schema",
                                                                                     "json_schema": {}}},
             "response_format"),
            ("response_format not an object", CMPL, {"prompt": [1], "response_format": "json"}, "response_format"),
            ("guided_json", CMPL, {"prompt": [1], "guided_json": {}}, "guided_json"),
            ("chat echo", CHAT, {"messages": U, "echo": True}, "echo"),
            ("chat_template", CHAT, {"messages": U, "chat_template": "{{ messages }}"}, "chat_template")):
        T.error_ok(C, what, T.post(srv, path, body), 400, field)
    r = T.post(srv, CHAT, {"messages": U, "max_tokens": 1, "response_format": {"type": "text"}, "echo": False})
    C.check(r.status == 200, "response_format text / echo false are fine: %r" % r)
    # context length: the field that is too long
    long_msg = [{"role": "user", "content": " hi" * 5000}]
    T.error_ok(C, "chat messages over the context with max_tokens", T.post(srv, CHAT, {"messages": long_msg,
                                                                                      "max_tokens": 5}),
               400, "messages")
    r = T.post(srv, CHAT, {"messages": U, "max_tokens": 5000})
    T.error_ok(C, "chat max_tokens over the context", r, 400)
    C.check(((r.json or {}).get("error") or {}).get("param") == "max_tokens", "max_tokens not blamed: %r" % r)


def one_tensor_bucket(model):
    """A safetensors bucket holding the checkpoint's first tensor, as it is on disk."""
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        hl = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(hl))
        name = sorted(k for k in hdr if k != "__metadata__")[0]
        t = hdr[name]
        f.seek(8 + hl + t["data_offsets"][0])
        data = f.read(t["data_offsets"][1] - t["data_offsets"][0])
    h = json.dumps({name: {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [0, len(data)]}}).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def test_unusable_weights_503(C, srv, model):
    r = T.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target", "version": "broken"})
    C.check(r.status == 200, "begin full: %r" % r)
    r = T.request(srv, "POST", "/v1/weights/bucket", one_tensor_bucket(model),
                  headers={"Content-Type": "application/octet-stream"})
    C.check(r.status == 200, "one-tensor bucket: %r" % r)
    r = T.post(srv, "/v1/weights/finish", {})
    C.check(r.status == 422, "finish of a full update with no buckets: %r" % r)
    r = T.post(srv, CMPL, {"prompt": [1], "max_tokens": 1})
    T.error_ok(C, "generation on inconsistent weights", r, 503)
    t = ((r.json or {}).get("error") or {}).get("type")
    C.check(t not in ("overloaded", None), "inconsistent weights reported as %r" % t)
    C.check("retry-after" not in r.headers, "inconsistent weights: Retry-After invites a retry: %r" % r.headers)


def main():
    C = T.Checker("http_hardening")
    binary = T.gs_bin(C)
    tmp = T.scratch("http_hardening")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model, ["--served-model-name", "acme/tiny-qwen3"])
    try:
        test_nesting(C, srv)
        test_nul(C, srv)
        test_api_shape(C, srv, "acme/tiny-qwen3")
        test_unusable_weights_503(C, srv, model)  # last: it leaves the weights inconsistent
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    try:
        test_auth_rule(C, binary, model)
        test_slowloris(C, binary, model)
    finally:
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
