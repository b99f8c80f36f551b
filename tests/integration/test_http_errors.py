"""HTTP API, part 3: bad requests, limits and auth of `graphswap serve`.

  - a table of bad requests (invalid JSON, wrong types and out-of-range values for each main field of
    both APIs, empty prompts, token ids out of range, invalid UTF-8, context too long, unsupported
    fields, bad tokenize / detokenize bodies, unknown route, wrong method): each gets the right status
    and {"error":{message,type,param,code}} naming the field; afterwards the server still answers
    /health and a normal request
  - body limits: a body over --max-body-bytes -> 413 (sent, and only announced by Content-Length);
    a truncated body (Content-Length larger than what is sent, then the write side closes) -> 400;
    a client that stalls mid-body past --request-timeout -> 408; one that just closes -> nothing breaks
  - queue limit: with --max-seqs 1 --queue-cap 1 a request that finds the queue full gets 503 with
    Retry-After (also n > queue room, which cancels the choices already queued)
  - --request-timeout: a request running past it gets 504 (non-streaming) or an error event then
    [DONE] (streaming); the server stays healthy
  - --api-key (and GRAPHSWAP_API_KEY): missing / wrong / non-Bearer -> 401 authentication_error on
    /v1/*, /tokenize, /detokenize; the right key works; /health and /metrics stay public
"""

import os
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
U = [{"role": "user", "content": "hi"}]


def table():
    """(name, path, body, status, field named in the error or None)"""
    P = [1, 2, 3]
    return [
        ("invalid JSON", CMPL, b'{"prompt": [1, 2', 400, None),
        ("body not an object", CMPL, b"[1, 2, 3]", 400, None),
        ("data after the object", CMPL, b'{"prompt": [1]} {"x": 1}', 400, None),
        ("empty body", CMPL, b"", 400, None),
        ("lone surrogate escape", CMPL, b'{"prompt": "\\ud800"}', 400, None),
        ("prompt missing", CMPL, {"max_tokens": 2}, 400, "prompt"),
        ("prompt wrong type", CMPL, {"prompt": 5}, 400, "prompt"),
        ("prompt empty string", CMPL, {"prompt": ""}, 400, "prompt"),
        ("prompt empty list", CMPL, {"prompt": []}, 400, "prompt"),
        ("prompt id out of range", CMPL, {"prompt": [1, 99999]}, 400, "prompt"),
        ("prompt id negative", CMPL, {"prompt": [-1, 2]}, 400, "prompt"),
        ("prompt id fractional", CMPL, {"prompt": [1.5]}, 400, "prompt"),
        ("prompt mixed list", CMPL, {"prompt": ["a", [1, 2]]}, 400, "prompt"),
        ("prompt list with empty string", CMPL, {"prompt": ["a", ""]}, 400, "prompt"),
        ("prompt list with empty ids", CMPL, {"prompt": [[1], []]}, 400, "prompt"),
        ("prompt invalid UTF-8", CMPL, b'{"prompt": "ab\xff\xfe cd", "max_tokens": 2}', 400, "prompt"),
        ("prompt longer than the context", CMPL, {"prompt": [5] * 5000, "max_tokens": 1}, 400, "prompt"),
        ("too many prompts", CMPL, {"prompt": [[1]] * 300, "max_tokens": 1}, 400, "prompt"),
        ("max_tokens string", CMPL, {"prompt": P, "max_tokens": "10"}, 400, "max_tokens"),
        ("max_tokens zero", CMPL, {"prompt": P, "max_tokens": 0}, 400, "max_tokens"),
        ("max_tokens negative", CMPL, {"prompt": P, "max_tokens": -5}, 400, "max_tokens"),
        ("max_tokens fractional", CMPL, {"prompt": P, "max_tokens": 2.5}, 400, "max_tokens"),
        ("max_tokens beyond the context", CMPL, {"prompt": P, "max_tokens": 5000}, 400, "max_tokens"),
        ("max_tokens huge", CMPL, {"prompt": P, "max_tokens": 10 ** 12}, 400, "max_tokens"),
        ("n zero", CMPL, {"prompt": P, "n": 0}, 400, "n"),
        ("n too large", CMPL, {"prompt": P, "n": 17}, 400, "n"),
        ("n string", CMPL, {"prompt": P, "n": "2"}, 400, "n"),
        ("n x prompts over the batch limit", CMPL, {"prompt": [[1]] * 100, "n": 16}, 400, "n"),
        ("temperature negative", CMPL, {"prompt": P, "temperature": -0.5}, 400, "temperature"),
        ("temperature string", CMPL, {"prompt": P, "temperature": "hot"}, 400, "temperature"),
        ("temperature overflow", CMPL, b'{"prompt": [1], "temperature": 1e400}', 400, "temperature"),
        ("top_p zero", CMPL, {"prompt": P, "top_p": 0}, 400, "top_p"),
        ("top_p above one", CMPL, {"prompt": P, "top_p": 1.5}, 400, "top_p"),
        ("top_k below -1", CMPL, {"prompt": P, "top_k": -2}, 400, "top_k"),
        ("top_k fractional", CMPL, {"prompt": P, "top_k": 2.5}, 400, "top_k"),
        ("min_p above one", CMPL, {"prompt": P, "min_p": 2}, 400, "min_p"),
        ("seed string", CMPL, {"prompt": P, "seed": "x"}, 400, "seed"),
        ("seed huge", CMPL, {"prompt": P, "seed": 1e30}, 400, "seed"),
        ("logprobs too many", CMPL, {"prompt": P, "logprobs": 21}, 400, "logprobs"),
        ("logprobs negative", CMPL, {"prompt": P, "logprobs": -1}, 400, "logprobs"),
        ("logprobs boolean (completions)", CMPL, {"prompt": P, "logprobs": True}, 400, "logprobs"),
        ("prompt_logprobs too many", CMPL, {"prompt": P, "prompt_logprobs": 21}, 400, "prompt_logprobs"),
        ("prompt_logprobs negative", CMPL, {"prompt": P, "prompt_logprobs": -1}, 400, "prompt_logprobs"),
        ("prompt_logprobs not an integer", CMPL, {"prompt": P, "prompt_logprobs": "2"}, 400, "prompt_logprobs"),
        ("stop wrong type", CMPL, {"prompt": P, "stop": 123}, 400, "stop"),
        ("stop too many", CMPL, {"prompt": P, "stop": ["a"] * 9}, 400, "stop"),
        ("stop empty string", CMPL, {"prompt": P, "stop": [""]}, 400, "stop"),
        ("stop non-string entry", CMPL, {"prompt": P, "stop": ["a", 5]}, 400, "stop"),
        ("stop too long", CMPL, {"prompt": P, "stop": "x" * 300}, 400, "stop"),
        ("stop_token_ids wrong type", CMPL, {"prompt": P, "stop_token_ids": ["a"]}, 400, "stop_token_ids"),
        ("stop_token_ids out of range", CMPL, {"prompt": P, "stop_token_ids": [99999]}, 400, "stop_token_ids"),
        ("stop_token_ids not a list", CMPL, {"prompt": P, "stop_token_ids": 5}, 400, "stop_token_ids"),
        ("stream not a boolean", CMPL, {"prompt": P, "stream": "yes"}, 400, "stream"),
        ("echo not a boolean", CMPL, {"prompt": P, "echo": "no"}, 400, "echo"),
        ("ignore_eos not a boolean", CMPL, {"prompt": P, "ignore_eos": 1}, 400, "ignore_eos"),
        ("skip_special_tokens not a boolean", CMPL, {"prompt": P, "skip_special_tokens": 0}, 400,
         "skip_special_tokens"),
        ("min_tokens above max_tokens", CMPL, {"prompt": P, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
        ("min_tokens negative", CMPL, {"prompt": P, "min_tokens": -1}, 400, "min_tokens"),
        ("stream_options not an object", CMPL, {"prompt": P, "stream": True, "stream_options": 5}, 400,
         "stream_options"),
        ("include_usage not a boolean", CMPL, {"prompt": P, "stream": True, "stream_options": {"include_usage": 1}},
         400, "stream_options"),
        # penalties and logit_bias: vLLM's ranges (SamplingParams._verify_args), keys token ids as strings
        ("presence_penalty above 2", CMPL, {"prompt": P, "presence_penalty": 2.5}, 400, "presence_penalty"),
        ("presence_penalty not a number", CMPL, {"prompt": P, "presence_penalty": "x"}, 400, "presence_penalty"),
        ("frequency_penalty below -2", CMPL, {"prompt": P, "frequency_penalty": -2.01}, 400, "frequency_penalty"),
        ("repetition_penalty zero", CMPL, {"prompt": P, "repetition_penalty": 0}, 400, "repetition_penalty"),
        ("repetition_penalty negative", CMPL, {"prompt": P, "repetition_penalty": -1}, 400, "repetition_penalty"),
        ("chat presence_penalty above 2", CHAT, {"messages": [{"role": "user", "content": "hi"}],
                                                 "presence_penalty": 3}, 400, "presence_penalty"),
        ("logit_bias not an object", CMPL, {"prompt": P, "logit_bias": [5, 10]}, 400, "logit_bias"),
        ("logit_bias key not an id", CMPL, {"prompt": P, "logit_bias": {"abc": 10}}, 400, "logit_bias"),
        ("logit_bias negative key", CMPL, {"prompt": P, "logit_bias": {"-1": 10}}, 400, "logit_bias"),
        ("logit_bias key out of vocab", CMPL, {"prompt": P, "logit_bias": {"99999": 10}}, 400, "logit_bias"),
        ("logit_bias value not a number", CMPL, {"prompt": P, "logit_bias": {"5": "x"}}, 400, "logit_bias"),
        ("length_penalty unsupported", CMPL, {"prompt": P, "length_penalty": 0.5}, 400, "length_penalty"),
        ("model not a string", CMPL, {"prompt": P, "model": 5}, 400, "model"),
        ("chat messages missing", CHAT, {"max_tokens": 2}, 400, "messages"),
        ("chat messages not a list", CHAT, {"messages": "hi"}, 400, "messages"),
        ("chat messages empty", CHAT, {"messages": []}, 400, "messages"),
        ("chat message without role", CHAT, {"messages": [{"content": "hi"}]}, 400, "messages"),
        ("chat unknown role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
        ("chat content wrong type", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
        ("chat user content missing", CHAT, {"messages": [{"role": "user"}]}, 400, "messages"),
        ("chat image part", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                               "image_url": {"url": "x"}}]}]},
         400, "messages"),
        ("chat text part without text", CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400,
         "messages"),
        ("chat top_logprobs without logprobs", CHAT, {"messages": U, "top_logprobs": 3}, 400, "top_logprobs"),
        ("chat logprobs not a boolean", CHAT, {"messages": U, "logprobs": 5}, 400, "logprobs"),
        ("chat top_logprobs too many", CHAT, {"messages": U, "logprobs": True, "top_logprobs": 21}, 400,
         "top_logprobs"),
        ("chat max_completion_tokens zero", CHAT, {"messages": U, "max_completion_tokens": 0}, 400,
         "max_completion_tokens"),
        ("chat max_tokens beyond the context", CHAT, {"messages": U, "max_tokens": 4096}, 400, "max_tokens"),
        ("chat tools unsupported", CHAT, {"messages": U, "tools": [{"type": "function"}]}, 400, "tools"),
        ("chat invalid UTF-8 content", CHAT, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400,
         "messages"),
        ("tokenize without prompt", "/tokenize", {"x": 1}, 400, "prompt"),
        ("tokenize prompt wrong type", "/tokenize", {"prompt": 5}, 400, "prompt"),
        ("tokenize invalid JSON", "/tokenize", b"{", 400, None),
        ("detokenize tokens not a list", "/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("detokenize token out of range", "/detokenize", {"tokens": [1, 2, 10 ** 7]}, 400, "tokens"),
        ("detokenize token negative", "/detokenize", {"tokens": [-3]}, 400, "tokens"),
        ("unknown route", "/v1/embeddings", {"input": "x"}, 404, None),
        ("unknown route (root)", "/", {}, 404, None),
    ]


def test_table(C, srv):
    rows = table()
    for name, path, body, status, field in rows:
        r = T.post(srv, path, body)
        T.error_ok(C, name, r, status, field)
    r = T.get(srv, CHAT)
    T.error_ok(C, "GET on a POST route", r, 405)
    r = T.request(srv, "DELETE", "/health")
    T.error_ok(C, "DELETE /health", r, 405)
    print("  %d bad requests in the table (+2 wrong-method)" % len(rows))
    C.check(len(rows) >= 30, "the bad-request table has only %d rows" % len(rows))
    T.healthy(C, srv, "after the bad-request table")


def raw_http(port, data, shut_write=False, wait=30, close_after_send=False):
    """Sends raw bytes; returns (status or None, headers dict, body bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    try:
        s.sendall(data)
        if close_after_send:
            return None, {}, b""
        if shut_write:
            s.shutdown(socket.SHUT_WR)
        buf = b""
        t0 = time.time()
        while time.time() - t0 < wait:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                hdrs = {}
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    hdrs[k.strip().lower().decode()] = v.strip().decode()
                n = int(hdrs.get("content-length", "-1"))
                if n >= 0 and len(rest) >= n:
                    return int(head.split()[1]), hdrs, rest[:n]
        if b"\r\n\r\n" in buf:
            return int(buf.split()[1]), {}, buf.partition(b"\r\n\r\n")[2]
        return None, {}, buf
    finally:
        s.close()


def test_body_limits(C, srv):
    # a body over the limit (8 MiB default): actually sent
    big = {"prompt": "x" * (9 << 20), "max_tokens": 1}
    r = T.post(srv, CMPL, big)
    T.error_ok(C, "9 MiB body", r, 413)
    # only announced: the server answers from Content-Length without reading
    st, h, body = raw_http(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: 999999999\r\n\r\n{", shut_write=True)
    T.error_ok(C, "announced 1 GB body", T.Resp(st, h, body), 413)
    # truncated: Content-Length 100, 10 bytes, then the write side closes
    st, h, body = raw_http(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: 100\r\n\r\n{\"prompt\":", shut_write=True)
    T.error_ok(C, "truncated body", T.Resp(st, h, body), 400)
    # truncated and closed at once (no one reads the answer)
    raw_http(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"pro",
             close_after_send=True)
    # garbage request line
    raw_http(srv.port, b"\x00\x01\x02 garbage\r\n\r\n", wait=5)
    T.healthy(C, srv, "after body-limit tests")


def test_auth(C, binary, model):
    srv = T.Server(C, binary, model, ["--api-key", "s3cr3t-key"])
    try:
        good = {"Authorization": "Bearer s3cr3t-key"}
        body = {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
        for path, method, b in ((CMPL, "POST", body), (CHAT, "POST", {"messages": U, "max_tokens": 2}),
                                ("/v1/models", "GET", None), ("/tokenize", "POST", {"prompt": "hi"}),
                                ("/detokenize", "POST", {"tokens": [1]})):
            r = T.request(srv, method, path, b)
            T.error_ok(C, "%s without a key" % path, r, 401)
            C.check((r.json or {}).get("error", {}).get("type") == "authentication_error",
                    "%s: 401 type is not authentication_error: %r" % (path, r))
            r = T.request(srv, method, path, b, headers={"Authorization": "Bearer wrong-key"})
            T.error_ok(C, "%s with a wrong key" % path, r, 401)
            r = T.request(srv, method, path, b, headers={"Authorization": "Bearer s3cr3t-ke"})
            T.error_ok(C, "%s with a key prefix" % path, r, 401)
            r = T.request(srv, method, path, b, headers={"Authorization": "Basic s3cr3t-key"})
            T.error_ok(C, "%s with Basic auth" % path, r, 401)
            r = T.request(srv, method, path, b, headers=good)
            C.check(r.status == 200, "%s with the right key: %r" % (path, r))
        C.check(T.get(srv, "/health").status == 200, "/health must stay public")
        C.check(T.get(srv, "/metrics").status == 200, "/metrics must stay public")
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "auth server exit %r: %s" % (rc, srv.stderr_text()[-2000:]))
        T.sanitizer_clean(C, srv)
    # the key from the environment
    srv = T.Server(C, binary, model, env={"GRAPHSWAP_API_KEY": "env-key"})
    try:
        r = T.post(srv, CMPL, {"prompt": [1], "max_tokens": 1})
        T.error_ok(C, "GRAPHSWAP_API_KEY: no key", r, 401)
        r = T.post(srv, CMPL, {"prompt": [1], "max_tokens": 1}, headers={"Authorization": "Bearer env-key"})
        C.check(r.status == 200, "GRAPHSWAP_API_KEY: right key: %r" % r)
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "env-key server exit %r" % rc)


def wait_metric(srv, name, pred, secs=60):
    t0 = time.time()
    m = {}
    while time.time() - t0 < secs:
        m = T.metrics(srv)
        if pred(m.get(name)):
            return True, m
        time.sleep(0.05)
    return False, m


def test_queue_and_timeouts(C, binary, tmp):
    """--max-seqs 1 --queue-cap 1 --request-timeout 3 on a slower model."""
    # a long context, so that a request can run past the 3 s timeout on any machine
    model = T.mkmodel(C, binary, os.path.join(tmp, "slow"), extra=["--hidden", "256", "--layers", "4", "--heads", "4",
                                                                    "--kv-heads", "2", "--head-dim", "64",
                                                                    "--intermediate", "768", "--max-pos", "65536"])
    srv = T.Server(C, binary, model, ["--max-seqs", "1", "--queue-cap", "1", "--request-timeout", "3",
                                      "--max-model-len", "65536", "--kv-cache-mb", "1024"])
    LONG = 60000
    try:
        # n larger than the queue room: 503, and the choice already queued is cancelled
        r = T.post(srv, CMPL, {"prompt": [1, 2], "n": 4, "max_tokens": 2})
        T.error_ok(C, "n=4 with --queue-cap 1", r, 503)
        C.check("retry-after" in r.headers, "503 without Retry-After: %r" % r.headers)
        T.healthy(C, srv, "after n > queue room")

        # A runs (the only slot), B waits (the only queue place), C finds the queue full
        a = T.Stream(srv, CMPL, {"prompt": [4, 5, 6], "max_tokens": LONG, "temperature": 0, "ignore_eos": True,
                                 "stream": True}, timeout=120)
        first = next(a.events(), None) if a.status == 200 else None
        C.check(isinstance(first, dict), "long stream A did not start: %r" % first)
        b_res = {}

        def run_b():
            t0 = time.time()
            b_res["r"] = T.post(srv, CMPL, {"prompt": [7, 8], "max_tokens": LONG, "temperature": 0,
                                            "ignore_eos": True})
            b_res["secs"] = time.time() - t0

        tb = threading.Thread(target=run_b)
        tb.start()
        ok, m = wait_metric(srv, "graphswap:num_requests_waiting", lambda v: v == 1, 30)
        C.check(ok, "B never showed up as waiting: %r" % {k: v for k, v in m.items() if "num_requests" in k})
        r = T.post(srv, CMPL, {"prompt": [9], "max_tokens": 2})
        T.error_ok(C, "queue full", r, 503)
        C.check((r.json or {}).get("error", {}).get("type") == "overloaded" and "retry-after" in r.headers,
                "queue full: type / Retry-After: %r %r" % (r.json, r.headers))
        # A reaches its 3 s deadline first: its stream ends with an error event, then [DONE]; then B gets the
        # slot and runs into its own deadline: 504
        rest = list(a.events()) if a.status == 200 else []
        a.close()
        tb.join(60)
        br = b_res.get("r")
        if C.check(br is not None, "B did not return"):
            T.error_ok(C, "B past --request-timeout 3", br, 504)
            C.check(2.5 <= b_res["secs"] <= 30, "B timed out after %.1fs (expected about 3s)" % b_res["secs"])
        errs = [e for e in rest if isinstance(e, dict) and "error" in e]
        C.check(errs and errs[-1]["error"].get("code") == 504 and rest[-1] == "[DONE]",
                "stream past --request-timeout: expected an error event then [DONE], got %r" % rest[-3:])
        ok, m = wait_metric(srv, "graphswap:num_requests_running", lambda v: v == 0, 30)
        C.check(ok, "requests still running after the timeouts")
        T.healthy(C, srv, "after queue and timeout tests")

        # slow client: headers and part of the body, then silence past --request-timeout -> 408
        t0 = time.time()
        st, h, body = raw_http(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: "
                                         b"application/json\r\nContent-Length: 50\r\n\r\n{\"prompt\": [1,",
                               wait=30)
        T.error_ok(C, "slow client (stalled body)", T.Resp(st, h, body), 408)
        C.check(time.time() - t0 < 25, "slow client answered only after %.1fs" % (time.time() - t0))
        # stalled headers: civetweb drops the connection; the server stays fine
        raw_http(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le", wait=8)
        T.healthy(C, srv, "after slow clients")
    finally:
        rc, secs = srv.stop()
        C.check(rc == 0, "limits server exit %r (%.1fs): %s" % (rc, secs, srv.stderr_text()[-2000:]))
        T.sanitizer_clean(C, srv)


def main():
    C = T.Checker("http_errors")
    binary = T.gs_bin(C)
    tmp = T.scratch("http_errors")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model)
    try:
        test_table(C, srv)
        test_body_limits(C, srv)
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    try:
        test_auth(C, binary, model)
        test_queue_and_timeouts(C, binary, tmp)
    finally:
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
