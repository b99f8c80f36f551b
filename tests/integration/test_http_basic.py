"""HTTP API, part 1: routes and non-streaming shapes of `graphswap serve` (OpenAI / vLLM compatible).

This file also holds the helpers the other test_http_*.py scripts import (Checker, Server, request
and SSE helpers); run as a script it tests:
  - GET /health, GET /v1/models, unknown route 404, wrong method 405 (with Allow)
  - POST /tokenize (prompt, messages, return_token_strs) and /detokenize (round trip, UTF-8)
  - /v1/completions: string, token-id, string[] and int[][] prompts (choices prompt-major, usage),
    n > 1 with seed (seed + i per sample: equals single requests with seed + i), echo, echo with logprobs
    and vLLM's prompt_logprobs (equal to `generate --prompt-logprobs`; streamed, repeated, chat),
    return_token_ids, logprobs legacy shape (tokens, token_logprobs, top_logprobs, text_offset),
    return_tokens_as_token_ids, skip_special_tokens, stop_token_ids (stop_reason = the id),
    ignore_eos / min_tokens, max_tokens default 16, unknown fields ignored
  - greedy output over HTTP == `graphswap generate` token for token (ids and logprobs as printed)
  - /v1/chat/completions: shape, logprobs {content:[{token, logprob, bytes, top_logprobs}]},
    prompt_tokens == /tokenize of the ChatML rendering, list-of-parts content, max_completion_tokens
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gs_harness  # noqa: E402

START_TIMEOUT = 120  # seconds for the server to load (ASan builds are slow)
REQ_TIMEOUT = 120


# ---------------------------------------------------------------------------------------------------
# helpers shared by the test_http_*.py scripts
# ---------------------------------------------------------------------------------------------------

# one Checker for every test script (counts checks, one line per failure, 'N passed, M failed')
Checker = gs_harness.Checker


def gs_bin(C):
    b = os.environ.get("GS_BIN")
    if not b:
        src = os.environ.get("GS_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        b = os.path.join(src, "build", "graphswap")
    if not os.access(b, os.X_OK):
        C.fail("graphswap binary not found (GS_BIN=%r)" % os.environ.get("GS_BIN"))
        sys.exit(C.finish())
    return b


def scratch(name):
    base = os.environ.get("GS_TEST_TMP")
    if base:
        d = os.path.join(base, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        return d
    return tempfile.mkdtemp(prefix="gs_%s_" % name)


def mkmodel(C, binary, out, vocab=1024, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    args = [binary, "mkmodel", "--out", out, "--vocab", str(vocab)] + list(extra)
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if p.returncode != 0:
        C.fail("mkmodel %s exited %d: %s" % (out, p.returncode, p.stderr.decode(errors="replace")))
        sys.exit(C.finish())
    return out


_servers = []


def _kill_all():
    for s in _servers:
        s.kill()


class Server:
    """A `graphswap serve` child with --port 0 (the bound port is read from stderr). It listens on
    127.0.0.1 unless `host` says otherwise; tests always connect through 127.0.0.1."""

    def __init__(self, C, binary, model, args=(), env=None, host="127.0.0.1"):
        self.C = C
        self.log = []
        cmd = [binary, "serve", "--model", model, "--host", host, "--port", "0"] + list(args)
        e = dict(os.environ)
        e.pop("GRAPHSWAP_API_KEY", None)
        e.pop("GRAPHSWAP_ADMIN_KEY", None)
        if env:
            e.update(env)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=e)
        _servers.append(self)
        self.port = None
        got = threading.Event()

        def drain():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.log.append(line)
                m = re.search(r"on http://\S+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        self.drainer = threading.Thread(target=drain, daemon=True)
        self.drainer.start()
        got.wait(START_TIMEOUT)
        if self.port is None:
            self.kill()
            C.fail("server did not start: %s\n%s" % (" ".join(cmd), "".join(self.log)[-3000:]))
            sys.exit(C.finish())

    def conn(self, timeout=REQ_TIMEOUT):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the server and waits; returns (rc, seconds) or ('timeout', seconds)."""
        t0 = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
            self.kill()
        self.drainer.join(5)
        return rc, time.time() - t0

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def stderr_text(self):
        return "".join(self.log)


class Resp:
    def __init__(self, status, headers, raw):
        self.status = status
        self.headers = headers
        self.raw = raw
        try:
            self.json = json.loads(raw.decode("utf-8")) if raw else None
        except ValueError:
            self.json = None

    def __repr__(self):
        return "HTTP %s %s" % (self.status, self.raw[:600])


def request(srv, method, path, body=None, headers=None, timeout=REQ_TIMEOUT):
    """One request on a fresh connection. body: dict (JSON), bytes or str."""
    h = {"Content-Type": "application/json"}
    if headers:
        h.update(headers)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    c = srv.conn(timeout)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        raw = r.read()
        return Resp(r.status, dict((k.lower(), v) for k, v in r.getheaders()), raw)
    finally:
        c.close()


def post(srv, path, body, **kw):
    return request(srv, "POST", path, body, **kw)


def get(srv, path, **kw):
    return request(srv, "GET", path, None, **kw)


class Stream:
    """A streaming request: iterate events() (parsed JSON objects; '[DONE]' as the string)."""

    def __init__(self, srv, path, body, headers=None, timeout=REQ_TIMEOUT):
        h = {"Content-Type": "application/json"}
        if headers:
            h.update(headers)
        self.c = srv.conn(timeout)
        self.c.request("POST", path, body=json.dumps(body).encode(), headers=h)
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.headers = dict((k.lower(), v) for k, v in self.r.getheaders())
        self.bad_lines = []

    def events(self):
        if self.status != 200:
            return
        buf = b""
        while True:
            line = self.r.readline()
            if not line:
                return
            if line in (b"\n", b"\r\n"):
                if buf:
                    yield self._parse(buf)
                    buf = b""
                continue
            if line.startswith(b"data: "):
                buf += line[6:].rstrip(b"\r\n")
            else:
                self.bad_lines.append(line)

    def _parse(self, payload):
        if payload == b"[DONE]":
            return "[DONE]"
        try:
            return json.loads(payload.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            self.bad_lines.append(payload)
            return {"_unparsable": payload}

    def body(self):
        return self.r.read()

    def close(self):
        self.c.close()


def stream_all(srv, path, body, **kw):
    """Runs a stream to its end; returns (status, events list, Stream)."""
    s = Stream(srv, path, body, **kw)
    try:
        if s.status != 200:
            s.err_body = s.body()
            return s.status, [], s
        evs = list(s.events())
        return 200, evs, s
    finally:
        s.close()


def collect_stream(evs, chat=False):
    """Folds completion / chat chunk events into per-choice results:
    {index: {"text", "token_ids", "finish_reason", "stop_reason", "logprobs": [...per chunk], "n_chunks"}}."""
    out = {}
    for e in evs:
        if not isinstance(e, dict) or "choices" not in e:
            continue
        for ch in e["choices"]:
            d = out.setdefault(ch["index"], {"text": "", "token_ids": [], "finish_reason": None, "stop_reason": None,
                                             "logprobs": [], "n_chunks": 0, "role": None, "after_final": 0})
            if d["finish_reason"] is not None:
                d["after_final"] += 1
            d["n_chunks"] += 1
            if chat:
                delta = ch.get("delta", {})
                if "role" in delta:
                    d["role"] = delta["role"]
                d["text"] += delta.get("content") or ""
            else:
                d["text"] += ch.get("text", "")
            d["token_ids"] += ch.get("token_ids") or []
            if ch.get("logprobs") is not None:
                d["logprobs"].append(ch["logprobs"])
            if ch.get("finish_reason") is not None:
                d["finish_reason"] = ch["finish_reason"]
                d["stop_reason"] = ch.get("stop_reason")
    return out


def error_message(r):
    """The message of an {"error": {"message": ...}} body, or ""."""
    e = r.json.get("error") if isinstance(r.json, dict) else None
    return (e.get("message") or "") if isinstance(e, dict) else ""


def error_ok(C, what, r, status, field=None):
    """Checks an error response: the status and {"error":{message,type,param,code}} naming the field."""
    ok = C.check(r.status == status, "%s: expected HTTP %d, got %r" % (what, status, r))
    e = (r.json or {}).get("error") if isinstance(r.json, dict) else None
    if not C.check(isinstance(e, dict), "%s: body is not {\"error\":{...}}: %r" % (what, r.raw[:300])):
        return False
    ok &= C.check(all(k in e for k in ("message", "type", "param", "code")),
                  "%s: error lacks message/type/param/code: %r" % (what, e))
    ok &= C.check(isinstance(e.get("message"), str) and e["message"], "%s: empty message" % what)
    ok &= C.check(e.get("code") == status, "%s: error.code %r != %d" % (what, e.get("code"), status))
    if field:
        named = e.get("param") == field or field in (e.get("message") or "")
        ok &= C.check(named, "%s: error does not name %r: %r" % (what, field, e))
    return ok


def healthy(C, srv, what):
    r = get(srv, "/health")
    C.check(r.status == 200 and (r.json or {}).get("status") == "ok" and r.json.get("weights") == "ready", "%s: /health after: %r" % (what, r))
    r = post(srv, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})
    C.check(r.status == 200 and r.json and len(r.json["choices"]) == 1,
            "%s: a normal request after: %r" % (what, r))


def sanitizer_clean(C, srv):
    t = srv.stderr_text()
    C.check(not any(k in t for k in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")),
            "sanitizer report in server stderr: %s" % t[-4000:])


def stop_clean(C, srv):
    """SIGTERM: the server must exit 0 and its stderr hold no sanitizer report."""
    rc, secs = srv.stop()
    C.check(rc == 0, "server exit status %r after SIGTERM (%.1fs): %s" % (rc, secs, srv.stderr_text()[-3000:]))
    sanitizer_clean(C, srv)


def generate_cli(binary, model, ids, max_tokens, logprobs=None, extra=()):
    """`graphswap generate` -> parsed object with floats as printed text."""
    args = [binary, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
            "--max-tokens", str(max_tokens), "--ignore-eos"] + list(extra)
    if logprobs is not None:
        args += ["--logprobs", str(logprobs)]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        return None
    for line in p.stdout.decode().splitlines():
        if line.startswith("{"):
            return json.loads(line, parse_float=str)
    return None


def chatml(messages, add_generation_prompt=True):
    s = ""
    for m in messages:
        c = m["content"]
        if isinstance(c, list):  # vLLM's "string" content format joins text parts with "\n"
            c = "\n".join(p["text"] for p in c)
        s += "<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], c)
    if add_generation_prompt:
        s += "<|im_start|>assistant\n"
    return s


def metrics(srv):
    """GET /metrics -> {sample name with labels: float}."""
    r = get(srv, "/metrics")
    out = {}
    for line in r.raw.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, val = line.rpartition(" ")
        name = re.sub(r'model_name="[^"]*",?', "", name).replace("{}", "")
        out[name] = float(val)
    return out


# ---------------------------------------------------------------------------------------------------
# part 1 tests
# ---------------------------------------------------------------------------------------------------

def test_routes(C, srv, model):
    r = get(srv, "/health")
    C.check(r.status == 200 and (r.json or {}).get("status") == "ok" and r.json.get("weights") == "ready", "/health: %r" % r)
    r = get(srv, "/v1/models")
    d = (r.json or {}).get("data") or [{}]
    C.check(r.status == 200 and r.json.get("object") == "list" and d[0].get("id") == model and
            d[0].get("object") == "model" and d[0].get("max_model_len") == 4096, "/v1/models: %r" % r)
    r = get(srv, "/v1/nope")
    error_ok(C, "unknown route", r, 404)
    r = get(srv, "/v1/completions")
    error_ok(C, "GET /v1/completions", r, 405)
    C.check("POST" in r.headers.get("allow", ""), "405 lacks Allow: POST: %r" % r.headers)
    r = post(srv, "/health", {})
    error_ok(C, "POST /health", r, 405)
    r = get(srv, "/metrics")
    C.check(r.status == 200 and r.headers.get("content-type", "").startswith("text/plain") and
            b"graphswap:num_requests_running" in r.raw, "/metrics: %r" % r)


def test_expect_continue(C, srv):
    """curl sends "Expect: 100-continue" for bodies over 1 KiB and waits for the interim response."""
    body = json.dumps({"prompt": [7] * 600, "max_tokens": 2, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body))
        s.settimeout(5)
        first = b""
        try:
            while b"\r\n\r\n" not in first:
                chunk = s.recv(4096)
                if not chunk:
                    break
                first += chunk
        except socket.timeout:
            pass
        C.check(first.startswith(b"HTTP/1.1 100"), "no 100 Continue before the body: %r" % first[:80])
        s.sendall(body)
        s.settimeout(30)
        rest = first.partition(b"\r\n\r\n")[2]
        while b"\r\n\r\n" not in rest or not rest.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        C.check(rest.startswith(b"HTTP/1.1 200") and b'"choices"' in rest, "after 100 Continue: %r" % rest[:200])
    finally:
        s.close()


def test_tokenize(C, srv, model):
    text = "Hello world, h\u00e9llo \u65e5\u672c \U0001F600!"
    r = post(srv, "/tokenize", {"prompt": text})
    ok = C.check(r.status == 200 and isinstance(r.json.get("tokens"), list) and r.json["count"] == len(r.json["tokens"])
                 and r.json["count"] > 0 and r.json.get("max_model_len") == 4096, "/tokenize: %r" % r)
    if ok:
        ids = r.json["tokens"]
        d = post(srv, "/detokenize", {"tokens": ids})
        C.check(d.status == 200 and d.json.get("prompt") == text, "/detokenize round trip: %r" % d)
        s = post(srv, "/tokenize", {"prompt": text, "return_token_strs": True})
        C.check(s.status == 200 and isinstance(s.json.get("token_strs"), list) and
                len(s.json["token_strs"]) == len(ids), "/tokenize return_token_strs: %r" % s)
    # special tokens are parsed in prompts
    r = post(srv, "/tokenize", {"prompt": "<|im_start|>user"})
    if C.check(r.status == 200 and r.json["count"] >= 2, "/tokenize special: %r" % r):
        d = post(srv, "/detokenize", {"tokens": r.json["tokens"][:1]})
        C.check(d.status == 200 and d.json.get("prompt") == "<|im_start|>",
                "/tokenize does not parse <|im_start|> as one special token: %r" % d)
    r = post(srv, "/detokenize", {"tokens": []})
    C.check(r.status == 200 and r.json.get("prompt") == "", "/detokenize []: %r" % r)
    # an empty prompt is [] (Qwen-style ByteLevel post-processor, add_bos_token false: nothing added),
    # as HF's tokenizer("") is; completions still refuse it (test_http_errors)
    for body in ({"prompt": ""}, {"prompt": "", "add_special_tokens": False}):
        r = post(srv, "/tokenize", body)
        C.check(r.status == 200 and r.json["tokens"] == [] and r.json["count"] == 0, "/tokenize %r: %r" % (body, r))
    # the byte-level token of byte 0 (U+0100) detokenizes to a JSON "\u0000", not U+FFFD or a cut string
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
        nul = json.load(f)["model"]["vocab"]["\u0100"]
    r = post(srv, "/detokenize", {"tokens": [nul]})
    C.check(r.status == 200 and b'"\\u0000"' in r.raw and r.json.get("prompt") == "\0", "/detokenize NUL: %r" % r)
    r = post(srv, "/tokenize", {"prompt": "a\u0000b"})  # NUL in an HTTP prompt: refused before parsing
    C.check(r.status == 400, "/tokenize with NUL: %r" % r)
    hi = post(srv, "/tokenize", {"prompt": "hi"}).json["tokens"]
    r = post(srv, "/detokenize", {"tokens": hi + [nul] + hi})
    C.check(r.status == 200 and r.json.get("prompt") == "hi\0hi", "/detokenize hi NUL hi: %r" % r)


def check_legacy_logprobs(C, what, lp, n, k, text, as_ids=False, ids=None):
    if not C.check(isinstance(lp, dict), "%s: logprobs missing: %r" % (what, lp)):
        return
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        if not C.check(isinstance(lp.get(key), list) and len(lp[key]) == n,
                       "%s: logprobs.%s missing or not %d long: %r" % (what, key, n, lp.get(key))):
            return
    for i in range(n):
        top = lp["top_logprobs"][i]
        C.check(isinstance(top, dict) and k <= len(top) <= k + 1,
                "%s: top_logprobs[%d] has %d entries, expected %d(+1)" % (what, i, len(top), k))
        C.check(lp["tokens"][i] in top and abs(top[lp["tokens"][i]] - lp["token_logprobs"][i]) < 1e-6,
                "%s: sampled token %r missing from top_logprobs[%d]" % (what, lp["tokens"][i], i))
        C.check(all(v <= 0 for v in top.values()), "%s: positive logprob at %d" % (what, i))
        if as_ids:
            C.check(lp["tokens"][i] == "token_id:%d" % ids[i], "%s: tokens[%d] = %r, expected token_id:%d"
                    % (what, i, lp["tokens"][i], ids[i]))
    offs = lp["text_offset"]
    C.check(offs == sorted(offs) and (not offs or offs[0] == 0), "%s: text_offset not ascending from 0: %r" % (what, offs))
    if not as_ids and text is not None and not any(t.startswith("bytes:") for t in lp["tokens"]):
        # the token strings concatenate to the text (when nothing was cut)
        C.check("".join(lp["tokens"]) == text, "%s: tokens do not concatenate to text: %r vs %r"
                % (what, "".join(lp["tokens"]), text))


def test_completions(C, srv, binary, model):
    # string prompt, defaults (max_tokens 16, ignore_eos so the length is known)
    r = post(srv, "/v1/completions", {"model": model, "prompt": "Hello world", "temperature": 0, "ignore_eos": True,
                                      "some_unknown_field": {"x": 1}})
    ok = C.check(r.status == 200, "completions string prompt: %r" % r)
    if ok:
        o = r.json
        C.check(o.get("object") == "text_completion" and o.get("id", "").startswith("cmpl-") and
                isinstance(o.get("created"), int) and o.get("model") == model and o.get("weight_version") == "0",
                "completions header fields: %r" % o)
        ch = o["choices"][0]
        C.check(ch["index"] == 0 and isinstance(ch["text"], str) and ch["finish_reason"] == "length" and
                ch["stop_reason"] is None and ch["logprobs"] is None, "completions choice: %r" % ch)
        u = o["usage"]
        C.check(u["completion_tokens"] == 16 and u["total_tokens"] == u["prompt_tokens"] + 16,
                "completions default max_tokens 16 / usage: %r" % u)
        t = post(srv, "/tokenize", {"prompt": "Hello world"})
        C.check(t.json and u["prompt_tokens"] == t.json["count"], "usage.prompt_tokens != /tokenize count")

    # token-id prompt + return_token_ids + logprobs; greedy parity with `graphswap generate`
    prompts = [[5, 17, 300, 42], [900, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [77]]
    for i, ids in enumerate(prompts):
        n_tok = [12, 20, 7][i]
        r = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": n_tok, "temperature": 0, "ignore_eos": True,
                                          "logprobs": 3, "return_token_ids": True})
        if not C.check(r.status == 200, "completions ids %d: %r" % (i, r)):
            continue
        ch = r.json["choices"][0]
        C.check(ch.get("prompt_token_ids") == ids, "prompt_token_ids %r != %r" % (ch.get("prompt_token_ids"), ids))
        C.check(len(ch.get("token_ids") or []) == n_tok, "token_ids length: %r" % ch.get("token_ids"))
        check_legacy_logprobs(C, "completions ids %d" % i, ch["logprobs"], n_tok, 3, ch["text"])
        # the same over raw JSON floats, against the CLI (floats compared as printed)
        raw = json.loads(r.raw.decode(), parse_float=str)
        ref = generate_cli(binary, model, ids, n_tok, logprobs=3)
        if C.check(ref is not None, "generate CLI failed for %r" % ids):
            C.check(ch["token_ids"] == ref["token_ids"], "HTTP greedy != generate: %r vs %r"
                    % (ch["token_ids"], ref["token_ids"]))
            C.check(raw["choices"][0]["logprobs"]["token_logprobs"] == ref["logprobs"],
                    "HTTP logprobs != generate logprobs for %r" % ids)

    # return_tokens_as_token_ids
    r = post(srv, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                      "logprobs": 2, "return_tokens_as_token_ids": True, "return_token_ids": True})
    if C.check(r.status == 200, "return_tokens_as_token_ids: %r" % r):
        ch = r.json["choices"][0]
        check_legacy_logprobs(C, "return_tokens_as_token_ids", ch["logprobs"], 5, 2, None, as_ids=True,
                              ids=ch["token_ids"])
        C.check(all(k.startswith("token_id:") for t in ch["logprobs"]["top_logprobs"] for k in t),
                "top_logprobs keys not token_id:N")

    # logprobs 0: only the sampled token's logprob
    r = post(srv, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "logprobs": 0,
                                      "ignore_eos": True})
    if C.check(r.status == 200, "logprobs 0: %r" % r):
        check_legacy_logprobs(C, "logprobs 0", r.json["choices"][0]["logprobs"], 4, 0, r.json["choices"][0]["text"])

    # echo: text starts with the prompt text
    r = post(srv, "/v1/completions", {"prompt": "The cat", "max_tokens": 4, "temperature": 0, "echo": True})
    C.check(r.status == 200 and r.json["choices"][0]["text"].startswith("The cat"), "echo: %r" % r)

    # string[] batch with n = 2 and a seed: choices prompt-major, sample i uses seed + i
    batch = ["Once upon", "a time there", "was"]
    r = post(srv, "/v1/completions", {"prompt": batch, "n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 1234,
                                      "ignore_eos": True, "return_token_ids": True})
    if C.check(r.status == 200, "string[] batch n=2: %r" % r):
        chs = r.json["choices"]
        C.check([c["index"] for c in chs] == list(range(6)), "batch indices: %r" % [c["index"] for c in chs])
        toks = [post(srv, "/tokenize", {"prompt": p}).json["tokens"] for p in batch]
        for ci, c in enumerate(chs):
            C.check(c.get("prompt_token_ids") == toks[ci // 2], "batch choice %d prompt_token_ids (prompt-major)" % ci)
        u = r.json["usage"]
        C.check(u["prompt_tokens"] == sum(len(t) for t in toks) and u["completion_tokens"] == 36,
                "batch usage: %r" % u)
        for ci in (0, 1, 4, 5):
            p, i = ci // 2, ci % 2
            one = post(srv, "/v1/completions", {"prompt": batch[p], "max_tokens": 6, "temperature": 1.0,
                                                "seed": 1234 + i, "ignore_eos": True, "return_token_ids": True})
            C.check(one.status == 200 and one.json["choices"][0]["token_ids"] == chs[ci]["token_ids"],
                    "n=2 sample %d of prompt %d != single request with seed %d" % (i, p, 1234 + i))
        C.check(chs[0]["token_ids"] != chs[1]["token_ids"] or chs[2]["token_ids"] != chs[3]["token_ids"],
                "n=2 samples identical for every prompt (seed + i not applied?)")

    # int[][] batch, greedy: each equals its single run
    idsb = [[10, 20, 30], [40, 50], [60, 70, 80, 90]]
    r = post(srv, "/v1/completions", {"prompt": idsb, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                      "return_token_ids": True})
    if C.check(r.status == 200 and len(r.json["choices"]) == 3, "int[][] batch: %r" % r):
        for p, ids in enumerate(idsb):
            one = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                                                "return_token_ids": True})
            C.check(one.json["choices"][0]["token_ids"] == r.json["choices"][p]["token_ids"],
                    "int[][] batch prompt %d != single run" % p)

    # seeded sampling is reproducible; unseeded sampling varies
    body = {"prompt": [1, 2, 3], "max_tokens": 12, "temperature": 1.0, "seed": 7, "ignore_eos": True,
            "return_token_ids": True}
    a = post(srv, "/v1/completions", body).json["choices"][0]["token_ids"]
    b = post(srv, "/v1/completions", body).json["choices"][0]["token_ids"]
    C.check(a == b, "same seed gave different samples")
    body.pop("seed")
    outs = set(tuple(post(srv, "/v1/completions", body).json["choices"][0]["token_ids"]) for _ in range(4))
    C.check(len(outs) > 1, "unseeded sampling gave identical outputs 4 times")

    # stop_token_ids: generate greedily, then stop at the 4th token's id
    base = post(srv, "/v1/completions", {"prompt": [3, 1, 4, 1, 5], "max_tokens": 10, "temperature": 0,
                                         "ignore_eos": True, "return_token_ids": True}).json["choices"][0]
    tid = base["token_ids"][3]
    first = base["token_ids"].index(tid)
    r = post(srv, "/v1/completions", {"prompt": [3, 1, 4, 1, 5], "max_tokens": 10, "temperature": 0,
                                      "ignore_eos": True, "return_token_ids": True, "stop_token_ids": [tid]})
    if C.check(r.status == 200, "stop_token_ids: %r" % r):
        ch = r.json["choices"][0]
        C.check(ch["finish_reason"] == "stop" and ch["stop_reason"] == tid and
                ch["token_ids"] == base["token_ids"][:first + 1],
                "stop_token_ids: finish %r stop_reason %r ids %r (base %r)" % (
                    ch["finish_reason"], ch["stop_reason"], ch["token_ids"], base["token_ids"]))
    # min_tokens keeps the stop id out until then
    r = post(srv, "/v1/completions", {"prompt": [3, 1, 4, 1, 5], "max_tokens": 10, "temperature": 0,
                                      "ignore_eos": True, "return_token_ids": True, "stop_token_ids": [tid],
                                      "min_tokens": first + 2})
    if C.check(r.status == 200, "min_tokens: %r" % r):
        C.check(len(r.json["choices"][0]["token_ids"]) >= first + 2, "min_tokens not honoured: %r"
                % r.json["choices"][0]["token_ids"])

    # an empty stop_token_ids list is fine; skip_special_tokens true / false
    r = post(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                      "stop_token_ids": [], "return_token_ids": True})
    C.check(r.status == 200, "empty stop_token_ids: %r" % r)
    sp = post(srv, "/v1/completions", {"prompt": "<|im_start|>", "max_tokens": 2, "temperature": 0, "echo": True,
                                       "skip_special_tokens": False})
    ss = post(srv, "/v1/completions", {"prompt": "<|im_start|>", "max_tokens": 2, "temperature": 0, "echo": True})
    if C.check(sp.status == 200 and ss.status == 200, "skip_special_tokens: %r %r" % (sp, ss)):
        C.check(sp.json["choices"][0]["text"].startswith("<|im_start|>"), "skip_special_tokens false keeps specials")
        C.check(not ss.json["choices"][0]["text"].startswith("<|im_start|>"), "skip_special_tokens true drops specials")


def test_prompt_logprobs(C, srv, binary, model):
    """echo + logprobs (legacy shape: the prompt's tokens first, the first with null) and vLLM's
    prompt_logprobs ({id: {logprob, rank, decoded_token}}), equal to `generate --prompt-logprobs` (whose
    values tests/reference checks against numpy), streamed and not, repeated (the prefix cache must not
    skip the scoring), with n = 2, and for chat."""
    ids, n_tok, K = [5, 17, 300, 42, 900, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], 5, 3
    np_ = len(ids)
    body = {"prompt": ids, "max_tokens": n_tok, "temperature": 0, "ignore_eos": True, "echo": True, "logprobs": K,
            "prompt_logprobs": 2, "return_token_ids": True}
    ref = generate_cli(binary, model, ids, n_tok, logprobs=K, extra=["--prompt-logprobs", str(K)])
    r = post(srv, "/v1/completions", body)
    if not C.check(r.status == 200 and ref is not None, "echo + logprobs: %r (CLI %r)" % (r, ref is not None)):
        return
    raw = json.loads(r.raw.decode(), parse_float=str)["choices"][0]
    lp, plp = raw["logprobs"], raw.get("prompt_logprobs")
    if not C.check(all(len(lp.get(f) or []) == np_ + n_tok for f in ("tokens", "token_logprobs", "top_logprobs",
                                                                      "text_offset")),
                   "echo + logprobs: not %d + %d entries: %r" % (np_, n_tok, {f: len(v) for f, v in lp.items()})):
        return
    C.check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
            "echo + logprobs: the first prompt token has a logprob: %r" % lp["token_logprobs"][:2])
    C.check(lp["token_logprobs"][1:np_] == ref["prompt_logprobs"][1:],
            "echo + logprobs: prompt logprobs != generate --prompt-logprobs")
    C.check(lp["token_logprobs"][np_:] == ref["logprobs"], "echo + logprobs: completion logprobs != generate")
    for i in range(1, np_ + n_tok):
        top = lp["top_logprobs"][i]
        best = ref["prompt_top_logprobs"][i][0][1] if i < np_ else ref["top_logprobs"][i - np_][0][1]
        C.check(isinstance(top, dict) and K <= len(top) <= K + 1 and top.get(lp["tokens"][i]) == lp["token_logprobs"][i]
                and max(top.values(), key=float) == best,
                "echo + logprobs: top_logprobs[%d] %r (token %r, best %s)" % (i, top, lp["tokens"][i], best))
    offs = lp["text_offset"]
    ptext = post(srv, "/detokenize", {"tokens": ids}).json["prompt"]
    C.check(offs == sorted(offs) and offs[0] == 0 and offs[np_] == len(ptext.encode()) and
            raw["text"].startswith(ptext), "echo + logprobs: text_offset %r (prompt text %r)" % (offs, ptext))
    if not any(t.startswith("bytes:") for t in lp["tokens"]):
        C.check("".join(lp["tokens"]) == raw["text"], "echo + logprobs: tokens do not concatenate to the text")
    # vLLM's prompt_logprobs
    ok = C.check(isinstance(plp, list) and len(plp) == np_ and plp[0] is None,
                 "prompt_logprobs: %r" % (plp if not isinstance(plp, list) else plp[:2]))
    for i in range(1, np_ if ok else 0):
        e, want = plp[i], [str(t) for t, _ in ref["prompt_top_logprobs"][i][:2]]
        mine = e.get(str(ids[i])) if isinstance(e, dict) else None
        C.check(mine is not None and mine["logprob"] == lp["token_logprobs"][i] and
                int(mine["rank"]) == int(ref["prompt_ranks"][i]) and isinstance(mine["decoded_token"], str),
                "prompt_logprobs[%d]: the prompt token's entry %r (rank %s)" % (i, mine, ref["prompt_ranks"][i]))
        C.check(all(t in e and int(e[t]["rank"]) == k + 1 for k, t in enumerate(want)) and
                set(e) == set(want) | {str(ids[i])},
                "prompt_logprobs[%d]: %r, the 2 best are %r" % (i, e, want))
    # again (the prompt's blocks are cached now: scoring must compute them anyway), and with n = 2
    r2 = post(srv, "/v1/completions", dict(body, n=2))
    if C.check(r2.status == 200, "echo + logprobs, n = 2: %r" % r2):
        for c in json.loads(r2.raw.decode(), parse_float=str)["choices"]:
            C.check(c["logprobs"] == lp and c["prompt_logprobs"] == plp, "echo + logprobs repeated (choice %d) differ"
                    % c["index"])
    # streamed: the first event carries the echo and the prompt's logprobs, then the tokens follow
    st, evs, _ = stream_all(srv, "/v1/completions", dict(body, stream=True))
    if C.check(st == 200 and evs and evs[-1] == "[DONE]", "echo + logprobs stream: %r" % st):
        first = json.loads(json.dumps(evs[0]), parse_float=str)["choices"][0]
        C.check(first["text"] == ptext and first["logprobs"]["tokens"] == lp["tokens"][:np_] and
                first["logprobs"]["text_offset"] == offs[:np_] and first.get("prompt_logprobs") is not None and
                len(first["prompt_logprobs"]) == np_,
                "echo + logprobs stream: first event %r" % {k: first.get(k) for k in ("text", "prompt_logprobs")})
        got = collect_stream(evs)[0]
        toks = [t for part in got["logprobs"] for t in part["tokens"]]
        C.check(toks == lp["tokens"] and got["text"] == raw["text"] and got["token_ids"] == raw["token_ids"],
                "echo + logprobs stream != non-streamed: %r vs %r" % (toks, lp["tokens"]))
    # chat: the rendered prompt's logprobs at the top level
    r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2,
                                           "temperature": 0, "prompt_logprobs": 0})
    if C.check(r.status == 200, "chat prompt_logprobs: %r" % r):
        pl = r.json.get("prompt_logprobs")
        C.check(isinstance(pl, list) and len(pl) == r.json["usage"]["prompt_tokens"] and pl[0] is None and
                all(isinstance(e, dict) and len(e) == 1 and list(e.values())[0]["logprob"] <= 0 for e in pl[1:]),
                "chat prompt_logprobs: %r" % pl)
    # without them: no prompt scores in the answer
    r = post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 2, "echo": True})
    C.check(r.status == 200 and "prompt_logprobs" not in r.json["choices"][0] and
            r.json["choices"][0]["logprobs"] is None, "plain echo reports logprobs: %r" % r)


def test_chat(C, srv, model):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]
    r = post(srv, "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 8, "temperature": 0,
                                           "logprobs": True, "top_logprobs": 3, "return_token_ids": True})
    if C.check(r.status == 200, "chat: %r" % r):
        o = r.json
        C.check(o.get("object") == "chat.completion" and o.get("id", "").startswith("chatcmpl-") and
                o.get("weight_version") == "0", "chat header: %r" % o)
        ch = o["choices"][0]
        C.check(ch["message"]["role"] == "assistant" and isinstance(ch["message"]["content"], str),
                "chat message: %r" % ch)
        C.check(ch["finish_reason"] in ("stop", "length"), "chat finish_reason: %r" % ch["finish_reason"])
        lp = ch["logprobs"]
        n = o["usage"]["completion_tokens"]
        ok = C.check(isinstance(lp, dict) and isinstance(lp.get("content"), list) and len(lp["content"]) == n,
                     "chat logprobs.content: %r" % lp)
        if ok:
            for e in lp["content"]:
                C.check(set(("token", "logprob", "bytes", "top_logprobs")) <= set(e) and len(e["top_logprobs"]) == 3,
                        "chat logprob entry: %r" % e)
                C.check(all(set(("token", "logprob", "bytes")) <= set(t) for t in e["top_logprobs"]),
                        "chat top_logprobs entry: %r" % e)
                C.check(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] or
                        (e["token"].startswith("bytes:") and
                         e["token"] == "bytes:" + "".join("\\x%02x" % b for b in e["bytes"])),
                        "chat bytes do not spell the token: %r" % e)
            if ch["finish_reason"] == "length" and not any(e["token"].startswith("bytes:") for e in lp["content"]):
                C.check("".join(e["token"] for e in lp["content"]) == ch["message"]["content"],
                        "chat tokens do not concatenate to content")
        # prompt_tokens == tokenization of the rendered ChatML template
        t = post(srv, "/tokenize", {"prompt": chatml(msgs)})
        C.check(t.status == 200 and o["usage"]["prompt_tokens"] == t.json["count"],
                "chat prompt_tokens %r != /tokenize(rendered ChatML) %r" % (o["usage"]["prompt_tokens"], t.json))
        C.check(o.get("prompt_token_ids") == t.json["tokens"], "chat prompt_token_ids != /tokenize tokens")
        tm = post(srv, "/tokenize", {"messages": msgs})
        C.check(tm.status == 200 and tm.json["tokens"] == t.json["tokens"], "/tokenize messages != rendered prompt")
        tm = post(srv, "/tokenize", {"messages": msgs, "add_generation_prompt": False})
        t2 = post(srv, "/tokenize", {"prompt": chatml(msgs, False)})
        C.check(tm.json["tokens"] == t2.json["tokens"], "/tokenize messages add_generation_prompt false")
    # list-of-parts content, max_completion_tokens, assistant turn in history
    msgs2 = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]},
             {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    r = post(srv, "/v1/chat/completions", {"messages": msgs2, "max_completion_tokens": 5, "temperature": 0,
                                           "ignore_eos": True})
    if C.check(r.status == 200, "chat parts: %r" % r):
        C.check(r.json["usage"]["completion_tokens"] == 5 and r.json["choices"][0]["logprobs"] is None,
                "chat max_completion_tokens / logprobs null: %r" % r.json)
        t = post(srv, "/tokenize", {"prompt": chatml(msgs2)})
        C.check(r.json["usage"]["prompt_tokens"] == t.json["count"], "chat (parts) prompt_tokens != /tokenize")
    # chat n=3 seeded
    r = post(srv, "/v1/chat/completions", {"messages": msgs, "n": 3, "max_tokens": 6, "temperature": 1, "seed": 3,
                                           "ignore_eos": True})
    C.check(r.status == 200 and [c["index"] for c in r.json["choices"]] == [0, 1, 2], "chat n=3: %r" % r)
    # default max_tokens: the rest of the context (finish at eos or length; usage consistent)
    r = post(srv, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "seed": 1})
    C.check(r.status == 200 and r.json["usage"]["completion_tokens"] >= 1, "chat default max_tokens: %r" % r)


def llama3(messages, add_generation_prompt=True):
    s = "<|begin_of_text|>"
    for m in messages:
        s += "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (m["role"], m["content"].strip())
    if add_generation_prompt:
        s += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    return s


def test_llama3_chat(C, binary, tmp):
    """The Llama-3 template: the mkmodel tokenizer with its three special tokens renamed."""
    d = mkmodel(C, binary, os.path.join(tmp, "llama3"))
    tj = os.path.join(d, "tokenizer.json")
    with open(tj) as f:
        tok = json.load(f)
    ren = {"<|endoftext|>": "<|begin_of_text|>", "<|im_start|>": "<|start_header_id|>", "<|im_end|>": "<|eot_id|>"}
    for a in tok["added_tokens"]:
        if a["content"] in ren:
            old = a["content"]
            a["content"] = ren[old]
            v = tok["model"]["vocab"]
            if old in v:
                v[ren[old]] = v.pop(old)
    # bos comes from the post-processor, as in Meta's tokenizer.json (Sequence[ByteLevel, TemplateProcessing]),
    # not from tokenizer_config.json's bos_token
    tok["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [1021],
                                                 "tokens": ["<|begin_of_text|>"]}}}]}
    with open(tj, "w") as f:
        json.dump(tok, f)
    tc = os.path.join(d, "tokenizer_config.json")
    with open(tc) as f:
        cfg = json.load(f)
    cfg.pop("add_bos_token", None)  # Meta's tokenizer_config.json has none (it would override the template)
    cfg.update({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None,
                "chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                                 "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"})
    with open(tc, "w") as f:
        json.dump(cfg, f)
    srv = Server(C, binary, d)
    try:
        msgs = [{"role": "system", "content": "  Be brief. "}, {"role": "user", "content": "Hello\n"}]
        r = post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                               "return_token_ids": True})
        if C.check(r.status == 200, "llama3 chat: %r" % r):
            # the rendering carries its bos: tokenized without the post-processor's (as vLLM does for chat)
            t = post(srv, "/tokenize", {"prompt": llama3(msgs), "add_special_tokens": False})
            C.check(t.status == 200 and r.json.get("prompt_token_ids") == t.json["tokens"],
                    "llama3 chat prompt != /tokenize(rendered Llama-3 template): %r vs %r"
                    % (r.json.get("prompt_token_ids"), t.json))
            C.check(r.json["prompt_token_ids"][0] == 1021 and r.json["prompt_token_ids"].count(1021) == 1,
                    "llama3 prompt must start with one <|begin_of_text|>: %r" % r.json["prompt_token_ids"][:4])
        # completions with a string prompt get bos (add_special_tokens), once
        r = post(srv, "/tokenize", {"prompt": "Hi"})
        C.check(r.status == 200 and r.json["tokens"][0] == 1021, "llama3: bos not prepended: %r" % r)
        r = post(srv, "/tokenize", {"prompt": "Hi", "add_special_tokens": False})
        C.check(r.status == 200 and 1021 not in r.json["tokens"], "add_special_tokens false still adds bos: %r" % r)
        # HF adds the template's bos even to an empty text, and a bos in the text is not merged with it
        r = post(srv, "/tokenize", {"prompt": ""})
        C.check(r.status == 200 and r.json["tokens"] == [1021], "llama3: empty prompt != [bos]: %r" % r)
        r = post(srv, "/tokenize", {"prompt": "<|begin_of_text|>Hi"})
        C.check(r.status == 200 and r.json["tokens"][:2] == [1021, 1021], "llama3: bos in text + template: %r" % r)
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "llama3 server exit %r: %s" % (rc, srv.stderr_text()[-2000:]))


def test_no_chat_template(C, binary, tmp):
    d = mkmodel(C, binary, os.path.join(tmp, "notok"), vocab=300, extra=["--no-tokenizer"])
    srv = Server(C, binary, d)
    try:
        r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        error_ok(C, "chat without a tokenizer/template", r, 400, "messages")
        r = post(srv, "/v1/completions", {"prompt": "text", "max_tokens": 2})
        error_ok(C, "string prompt without a tokenizer", r, 400, "prompt")
        r = post(srv, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0, "logprobs": 1})
        C.check(r.status == 200 and r.json["choices"][0]["text"] == "" and
                r.json["choices"][0]["logprobs"]["tokens"][0].startswith("token_id:"),
                "token ids work without a tokenizer: %r" % r)
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "no-tokenizer server exit %r: %s" % (rc, srv.stderr_text()[-2000:]))


def test_cached_tokens(C, binary, model, srv):
    # vLLM: usage.prompt_tokens_details {cached_tokens} only with --enable-prompt-tokens-details and a
    # prefix-cache hit (full 16-token blocks shared at admission); cache_salt salts the prefix cache.
    P = [(i * 53 + 7) % 1000 for i in range(50)]  # 3 full blocks + 2
    body = {"prompt": P, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    r = [post(srv, "/v1/completions", body) for _ in range(2)]
    C.check(all(x.status == 200 and "prompt_tokens_details" not in x.json["usage"] for x in r),
            "prompt_tokens_details without the flag: %r" % r)
    d = Server(C, binary, model, args=["--enable-prompt-tokens-details"])

    def cached(path, b):
        x = post(d, path, b)
        if x.status != 200:
            return x
        return ((x.json["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0), x.json["usage"])

    try:
        got = [cached("/v1/completions", body)[0] for _ in range(2)]
        C.check(got == [0, 48], "completions cached_tokens of two identical prompts %r" % got)
        C.check(cached("/v1/completions", dict(body, prompt_logprobs=0))[0] == 0, "prompt_logprobs reuses the cache")
        _, evs, _ = stream_all(d, "/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
        u = [e["usage"] for e in evs if isinstance(e, dict) and e.get("usage")]
        C.check(u and u[-1].get("prompt_tokens_details") == {"cached_tokens": 48}, "stream usage %r" % u)
        # two prompts, n = 2: per prompt once (as prompt_tokens counts them)
        two = cached("/v1/completions", dict(body, prompt=[P, P[:40]], n=2))
        C.check(two[0] == 48 + 32, "two prompts, n=2: %r" % (two,))
        msgs = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 6}]
        chat = {"messages": msgs, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        c1, c2 = cached("/v1/chat/completions", chat), cached("/v1/chat/completions", chat)
        n = c1[1]["prompt_tokens"] if isinstance(c1, tuple) else 0
        C.check(n > 17 and c1[0] == 0 and c2[0] == (n - 1) // 16 * 16, "chat cached_tokens %r %r" % (c1, c2))
        # cache_salt: equal salts share blocks, different salts and no salt do not
        Q = [(i * 29 + 3) % 1000 for i in range(40)]  # 2 full blocks + 8
        got = [cached("/v1/completions", dict(body, prompt=Q, **({"cache_salt": s} if s else {})))[0]
               for s in ("A", "A", "B", None, "B")]
        C.check(got == [0, 32, 0, 0, 32], "cache_salt A A B - B: %r" % got)
        salted = dict(chat, cache_salt="chat-salt")
        c1, c2 = cached("/v1/chat/completions", salted), cached("/v1/chat/completions", salted)
        C.check(c1[0] == 0 and c2[0] > 0, "chat cache_salt %r %r" % (c1, c2))
        for bad in ("", 5, {"a": 1}, "x" * 1025):
            error_ok(C, "cache_salt %r" % (bad if not isinstance(bad, str) else bad[:8]),
                     post(d, "/v1/completions", dict(body, cache_salt=bad)), 400, "cache_salt")
        C.check(cached("/v1/completions", dict(body, cache_salt=None))[0] == 48, "cache_salt null is no salt")
    finally:
        stop_clean(C, d)


def main():
    C = Checker("http_basic")
    binary = gs_bin(C)
    tmp = scratch("http_basic")
    model = mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = Server(C, binary, model)
    try:
        test_routes(C, srv, model)
        test_expect_continue(C, srv)
        test_tokenize(C, srv, model)
        test_completions(C, srv, binary, model)
        test_prompt_logprobs(C, srv, binary, model)
        test_chat(C, srv, model)
        test_cached_tokens(C, binary, model, srv)
    finally:
        stop_clean(C, srv)
        _kill_all()
    try:
        test_llama3_chat(C, binary, tmp)
        test_no_chat_template(C, binary, tmp)
    finally:
        _kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
