#!/usr/bin/env python3
"""The operator log of `graphswap serve` (server/http/log.c) and cold-load progress.

  - --log-format json --access-log --log-interval 1: every stderr line is one JSON object with ts,
    level, event; the start-up summary (events model, engine, routes, serve) names the model,
    parameter count, dtype, backend, threads, KV blocks / bytes, plan-capture time and how the
    routes are protected; one "access" line per request (method, path, status, ms, and bytes equal
    to what the client received, headers included; a path that is not UTF-8 has its bytes escaped,
    so every line stays valid UTF-8 JSON); a "stats" line (prompt / generation tok/s,
    running, waiting, KV usage) after requests ran, and none while idle; one "weights" line per
    HTTP weight update (version, bytes, buckets, GB/s, hook runs, ms) and one "weights_failed"
    line for a failed finish;
  - --log-format text (with a drafter, --api-key, --log-interval 1): the summary as text lines
    (model: ... drafter, engine: ..., routes: ... API key required), no access lines without
    --access-log, a stats line with the spec acceptance; --log-interval 0: no stats line;
  - cold-load progress: `graphswap generate` with stderr on a terminal (a pty) prints a "loaded"
    line with bytes / total; with stderr on a pipe a quick load prints none.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import pty
import re
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402


def raw_get(srv, path):
    """GET on a raw socket with Connection: close: every byte the server wrote."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=H.REQ_TIMEOUT)
    try:
        s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b
    finally:
        s.close()


def wait_for(pred, timeout=10.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def json_lines(C, srv):
    out = []
    for line in srv.stderr_text().splitlines():
        if not line.strip():
            continue
        try:
            o = json.loads(line)
        except ValueError:
            C.fail("json log: a stderr line is not JSON: %r" % line[:300])
            continue
        if C.check(isinstance(o, dict) and all(k in o for k in ("ts", "level", "event")),
                   "json log: line without ts / level / event: %r" % line[:300]):
            C.check(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", o["ts"]) is not None, "bad ts %r" % o["ts"])
            out.append(o)
    return out


def events(lines, ev):
    return [o for o in lines if o.get("event") == ev]


def test_json(C, binary, model):
    srv = H.Server(C, binary, model, args=["--access-log", "--log-interval", "1", "--log-format", "json"])
    try:
        raw = raw_get(srv, "/health")
        C.check(raw.startswith(b"HTTP/1.1 200"), "raw /health: %r" % raw[:100])
        rc = H.post(srv, "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 8, "ignore_eos": True})
        C.check(rc.status == 200, "completions: %r" % rc)
        r404 = H.get(srv, "/nope")
        C.check(r404.status == 404, "/nope: %r" % r404)
        # a path that is not UTF-8 once decoded: the line must still be valid UTF-8 JSON
        C.check(raw_get(srv, "/bad%ff%fe").startswith(b"HTTP/1.1 404"), "raw /bad%ff%fe: not 404")
        # the stats line for the window with the request
        C.check(wait_for(lambda: '"event": "stats"' in srv.stderr_text(), 5), "no stats line within 5 s")
        # idle: no further stats lines
        n_stats = srv.stderr_text().count('"event": "stats"')
        time.sleep(2.5)
        C.check(srv.stderr_text().count('"event": "stats"') == n_stats, "stats lines while idle")

        # one successful HTTP weight update (the model's own tensors, two buckets), one failed finish
        tensors = W.ckpt(model)
        names = sorted(tensors)
        buckets = [names[: len(names) // 2], names[len(names) // 2:]]
        fin = W.push(C, srv, "logging update", tensors, buckets, {"mode": "full", "version": "step-7"})
        C.check(fin is not None, "weight update failed")
        r = H.post(srv, "/v1/weights/begin", {"mode": "full", "version": "step-8"})
        C.check(r.status == 200, "begin 2: %r" % r)
        r = H.post(srv, "/v1/weights/finish", {})
        C.check(r.status == 422, "finish without buckets: %r" % r)
        C.check(wait_for(lambda: '"weights_failed"' in srv.stderr_text(), 5), "no weights_failed line")
    finally:
        H.stop_clean(C, srv)
    L = json_lines(C, srv)

    m = events(L, "model")
    if C.check(len(m) == 1, "model lines: %d" % len(m)):
        m = m[0]
        C.check(m.get("model") == model and m.get("arch") == "Qwen3ForCausalLM", "model line: %r" % m)
        C.check(isinstance(m.get("params"), int) and m["params"] > 1000, "params: %r" % m.get("params"))
        C.check(m.get("dtype") in ("bf16", "f32") and m.get("draft") is None, "dtype / draft: %r" % m)
        C.check(isinstance(m.get("load_ms"), (int, float)), "load_ms: %r" % m)
    e = events(L, "engine")
    if C.check(len(e) == 1, "engine lines: %d" % len(e)):
        e = e[0]
        C.check(e.get("backend") == "cpu" and isinstance(e.get("threads"), int) and e["threads"] >= 1, "engine: %r" % e)
        C.check(isinstance(e.get("kv_blocks"), int) and e["kv_blocks"] > 0 and
                e.get("kv_bytes", 0) >= e["kv_blocks"] * e.get("block_size", 1), "kv: %r" % e)
        C.check(isinstance(e.get("plan_capture_ms"), (int, float)) and e.get("plans") is True, "plans: %r" % e)
    rt = events(L, "routes")
    if C.check(len(rt) == 1, "routes lines: %d" % len(rt)):
        C.check(rt[0].get("api") == "open" and rt[0].get("admin") == "loopback-only" and rt[0].get("loopback") is True,
                "routes: %r" % rt[0])
    sv = [o for o in events(L, "serve") if "url" in o]
    C.check(len(sv) == 1 and sv[0].get("port") == srv.port and sv[0].get("access_log") is True, "serve: %r" % sv)

    acc = events(L, "access")
    for o in acc:
        C.check(all(k in o for k in ("method", "path", "status", "bytes", "ms")), "access fields: %r" % o)
    health = [o for o in acc if o.get("path") == "/health"]
    C.check(len(health) == 1 and health[0].get("status") == 200 and health[0].get("bytes") == len(raw),
            "access /health (client got %d bytes): %r" % (len(raw), health))
    comp = [o for o in acc if o.get("path") == "/v1/completions"]
    C.check(len(comp) == 1 and comp[0].get("method") == "POST" and comp[0].get("status") == 200 and
            comp[0].get("bytes", 0) > len(rc.raw) and comp[0].get("ms", -1) >= 0, "access completions: %r" % comp)
    C.check(any(o.get("path") == "/nope" and o.get("status") == 404 for o in acc), "access /nope 404 missing")
    C.check("\ufffd" not in srv.stderr_text(), "stderr holds bytes that are not UTF-8")
    C.check(any(o.get("path") == "/bad\u00ff\u00fe" and o.get("status") == 404 for o in acc),
            "access line of /bad%%ff%%fe (bytes escaped as \\u00ff\\u00fe): %r" % [o.get("path") for o in acc])
    wroutes = [o["path"] for o in acc if o.get("path", "").startswith("/v1/weights/")]
    C.check(wroutes.count("/v1/weights/bucket") == 2 and wroutes.count("/v1/weights/finish") == 2,
            "access weight routes: %r" % wroutes)

    st = events(L, "stats")
    if C.check(len(st) >= 1, "no stats line"):
        s0 = st[0]
        C.check(all(k in s0 for k in ("prompt_tok_s", "gen_tok_s", "running", "waiting", "kv_usage_pct")), "stats: %r" % s0)
        C.check(s0.get("gen_tok_s", 0) > 0 and s0.get("prompt_tok_s", 0) > 0, "stats rates: %r" % s0)
        C.check("spec_acceptance_pct" not in s0, "spec fields without a drafter: %r" % s0)

    w = events(L, "weights")
    if C.check(len(w) == 1, "weights lines: %r" % w):
        w = w[0]
        total = sum(len(t.data) for t in tensors.values())
        C.check(w.get("version") == "step-7" and w.get("buckets") == 2 and w.get("bytes") == total and
                w.get("tensors") == len(names), "weights line (bytes %d, tensors %d): %r" % (total, len(names), w))
        C.check(w.get("hook_runs_target", 0) >= 1 and isinstance(w.get("gb_s"), (int, float)) and w.get("ms", -1) >= 0,
                "weights line: %r" % w)
    f = events(L, "weights_failed")
    if C.check(len(f) == 1, "weights_failed lines: %r" % f):
        C.check("incomplete" in f[0].get("reason", "") and f[0].get("status") == 422 and f[0].get("level") == "error",
                "weights_failed: %r" % f[0])


def text_fields(line):
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))


def test_text(C, binary, model, draft):
    srv = H.Server(C, binary, model, args=["--draft", draft, "--api-key", "k3y", "--log-interval", "1"])
    try:
        r = H.post(srv, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 12, "ignore_eos": True},
                   headers={"Authorization": "Bearer k3y"})
        C.check(r.status == 200, "text: completions: %r" % r)
        C.check(wait_for(lambda: " stats: " in srv.stderr_text(), 5), "text: no stats line")
    finally:
        H.stop_clean(C, srv)
    t = srv.stderr_text()
    lines = t.splitlines()
    C.check(not any(l.lstrip().startswith("{") for l in lines), "text format printed JSON")
    ts = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (INFO |WARN |ERROR) \w+: ")
    C.check(all(ts.match(l) for l in lines if l.strip()), "text lines without timestamp / level: %r" % lines[:8])
    ml = [l for l in lines if " model: " in l]
    if C.check(len(ml) == 1, "text: model lines %r" % ml):
        f = text_fields(ml[0])
        C.check("parameters" in ml[0] and "drafter" in ml[0] and f.get("draft") == draft and
                int(f.get("params", 0)) > 0 and int(f.get("draft_params", 0)) > 0, "text model line: %r" % ml[0])
    el = [l for l in lines if " engine: " in l]
    C.check(len(el) == 1 and "KV blocks" in el[0] and "plans captured" in el[0] and "threads=" in el[0],
            "text engine line: %r" % el)
    rl = [l for l in lines if " routes: " in l]
    C.check(len(rl) == 1 and "API key required" in rl[0] and "api=api-key" in rl[0], "text routes line: %r" % rl)
    C.check(" access: " not in t, "access lines without --access-log")
    sl = [l for l in lines if " stats: " in l]
    C.check(len(sl) >= 1 and "spec acceptance" in sl[0] and "spec_acceptance_pct=" in sl[0], "text stats: %r" % sl)

    quiet = H.Server(C, binary, model, args=["--log-interval", "0"])
    try:
        H.post(quiet, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 4})
        time.sleep(1.5)
    finally:
        H.stop_clean(C, quiet)
    C.check(" stats: " not in quiet.stderr_text(), "--log-interval 0 printed a stats line")


def run_pty(args):
    """Runs args with stderr (and stdout) on a pseudo-terminal; returns (rc, output)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            b = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not b:
            break
        out += b
    os.close(master)
    return p.wait(120), out.decode("utf-8", "replace")


def test_load_progress(C, binary, model):
    args = [binary, "generate", "--model", model, "--prompt-ids", "1,2", "--max-tokens", "1"]
    rc, out = run_pty(args)
    m = re.search(r"load: loaded (\S+): ([\d.]+) / ([\d.]+) [MG]B \(100%\), [\d.]+ GB/s.* bytes=(\d+) total=(\d+)", out)
    C.check(rc == 0 and m is not None and m.group(4) == m.group(5) and int(m.group(5)) > 0,
            "pty: no 'loaded' progress line (rc %r): %r" % (rc, out[-1500:]))
    C.check(out.count("load: ") == 1, "pty: a quick load printed more than the final line: %r" % out[-1500:])
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    C.check(p.returncode == 0 and b"load:" not in p.stderr, "pipe: a quick load printed progress: %r" % p.stderr[-500:])


def main():
    C = H.Checker("http_logging")
    binary = H.gs_bin(C)
    tmp = H.scratch("http_logging")
    model = H.mkmodel(C, binary, os.path.join(tmp, "m"), extra=["--layers", "2", "--seed", "1"])
    draft = W.mk_drafter(C, binary, model, os.path.join(tmp, "d"), 3)
    try:
        test_json(C, binary, model)
        test_text(C, binary, model, draft)
        test_load_progress(C, binary, model)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
