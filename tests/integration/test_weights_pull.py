#!/usr/bin/env python3
"""Replicas that join with the live weights (issue 24): GET /v1/weights/export, POST /v1/weights/pull,
`serve --weights-from URL`.

  - The export of replica A (qwen3 target + DSpark drafter, updated over HTTP to (T1, D1) so that
    its weights differ from its --model checkpoint): a valid safetensors file, every checkpoint
    tensor by its checkpoint name (no tied lm_head.weight, no derived.*), the sha256 of each tensor's
    bytes equal to A's checkpoint-name checksum, __metadata__ {format: pt, weight_version} and
    X-Weight-Version equal to A's version; model=draft likewise; a bad model 400, model=draft of a
    server without a drafter 400; 409 while a session is open.
  - Replica B started on T0 with --weights-from A while A holds a session open (a bucket written):
    B's /health?ready=1 is 503 naming the pull (its reason shows A's 409 retried), plain /health 200
    ("pulling"), B's generation 503 ("not ready"), B's export 503, a second pull 409; after A's
    finish B becomes ready by itself: its checkpoint-name checksums AND internal checksums (derived
    buffers included) of both models equal A's, its version is A's, its greedy tokens and spec
    counters equal A's.
  - POST /v1/weights/pull on a running replica: after A takes another update (and then another of
    its target only, pulled with model "target"), B's checksums and version follow A's.
  - Refused pulls, each with a clear error, B's weights, checksums and version unchanged after all
    of them: a bad url / model / api_key / timeout_s (400), an unreachable url (502 "cannot
    reach"), a source that is not graphswap (a Python http.server: garbage, HTTP 404, a truncated
    export, a header length that lies, offsets past the end, a header that is not JSON, an export
    with one tensor missing, an export whose bytes never match the checksums: 502 naming the
    export or "changed its weights"), a graphswap source of another shape behind an admin key (401
    without the key, 422 naming the tensor and both shapes with it).
  - serve --weights-from a dead address with --weights-from-timeout 3 exits 1 with a message naming
    --weights-from; a source of another shape exits 1 at once (no retry).
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import hashlib
import http.server
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import test_http_basic as H  # noqa: E402
import test_weights_update as U  # noqa: E402

SPEC = U.SPEC_ARGS


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def url_of(srv):
    return "http://127.0.0.1:%d" % srv.port


def parse_st(raw):
    """(header dict, data bytes) of a safetensors file, or None when it is not one."""
    if len(raw) < 8:
        return None
    n = struct.unpack("<Q", raw[:8])[0]
    if 8 + n > len(raw):
        return None
    try:
        return json.loads(raw[8:8 + n].decode()), raw[8 + n:]
    except ValueError:
        return None


def ck_sums(srv, model, headers=None):
    r = H.get(srv, "/v1/weights/checksums?names=checkpoint&model=%s" % model, headers=headers)
    return r.json if r.status == 200 else {"_error": repr(r)}


def state(srv):
    """Everything a pull must carry over: both kinds of checksums of both models, and the version."""
    return {"target": U.checksums(srv, "target"), "draft": U.checksums(srv, "draft"),
            "target_ck": ck_sums(srv, "target").get("tensors"), "draft_ck": ck_sums(srv, "draft").get("tensors"),
            "version": U.weights_info(srv).get("version")}


def same_state(C, what, got, want):
    for k in ("target", "draft", "target_ck", "draft_ck"):
        g, w = got.get(k) or {}, want.get(k) or {}
        d = U.diff_sums(g, w)
        C.check(w and not d, "%s: %s checksums differ in %s" % (what, k, d[:5]))
    C.check(got["version"] == want["version"], "%s: version %r, expected %r" % (what, got["version"], want["version"]))


def test_export(C, a, plain):
    """The export's format and its agreement with the checksums (A holds (T1, D1), version step-7)."""
    ver = U.weights_info(a).get("version")
    for model in ("target", "draft"):
        r = H.get(a, "/v1/weights/export?model=%s" % model)
        C.check(r.status == 200 and r.headers.get("content-type") == "application/octet-stream",
                "export %s: %r" % (model, r))
        C.check(r.headers.get("x-weight-version") == ver, "export %s: X-Weight-Version %r, expected %r"
                % (model, r.headers.get("x-weight-version"), ver))
        p = parse_st(r.raw)
        if not C.check(p is not None, "export %s: not a safetensors file" % model):
            continue
        hdr, data = p
        meta = hdr.pop("__metadata__", None)
        C.check(meta == {"format": "pt", "weight_version": ver}, "export %s: __metadata__ %r" % (model, meta))
        sums = ck_sums(a, model)
        want = {n: h for n, h in sums["tensors"].items() if not n.startswith("derived.")}
        C.check(set(hdr) == set(want), "export %s: names differ from the checkpoint checksums: %s" % (
            model, sorted(set(hdr) ^ set(want))[:6]))
        if model == "target":  # (mkmodel ties the target's embeddings; the drafter has its own lm_head)
            C.check("lm_head.weight" not in hdr and "model.embed_tokens.weight" in hdr,
                    "export target: the tied lm_head.weight is exported")
        end = 0
        for n, t in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            b, e = t["data_offsets"]
            C.check(b == end and t["dtype"] == sums["dtype"], "export %s: %s at %r dtype %s" % (model, n, (b, e), t["dtype"]))
            end = e
            C.check(hashlib.sha256(data[b:e]).hexdigest() == want.get(n), "export %s: %s bytes differ from the checksum"
                    % (model, n))
        C.check(end == len(data), "export %s: data section %d bytes, tensors end at %d" % (model, len(data), end))
    r = H.get(a, "/v1/weights/export?model=both")
    H.error_ok(C, "export model=both", r, 400, "model")
    r = H.get(plain, "/v1/weights/export?model=draft")
    H.error_ok(C, "export model=draft without a drafter", r, 400)
    # nothing consistent to export: asleep, then inconsistent (a full session aborted after a write)
    r = H.post(plain, "/sleep?level=1", {})
    C.check(r.status == 200, "sleep: %r" % r)
    H.error_ok(C, "export while asleep", H.get(plain, "/v1/weights/export"), 503, "asleep")
    r = H.post(plain, "/wake_up", {})
    C.check(r.status == 200, "wake_up: %r" % r)
    t0 = U.ckpt(plain.model_dir)
    r = H.post(plain, "/v1/weights/begin", {"mode": "full"})
    C.check(r.status == 200, "plain begin: %r" % r)
    name = sorted(t0)[0]
    C.check(U.post_bucket(plain, U.st_encode([t0[name]])).status == 200, "plain bucket")
    C.check(H.post(plain, "/v1/weights/abort", {}).status == 200, "plain abort")
    H.error_ok(C, "export while inconsistent", H.get(plain, "/v1/weights/export"), 503, "inconsistent")
    U.push(C, plain, "plain repaired", t0, [sorted(t0)], {"mode": "full"})
    C.check(H.get(plain, "/v1/weights/export").status == 200, "export after the repair")


def test_join(C, binary, ck, a):
    """B joins while A holds a session open; it retries, becomes ready after A's finish, equals A."""
    r = H.post(a, "/v1/weights/begin", {"mode": "partial", "model": "target", "pause": "keep", "version": "step-8"})
    C.check(r.status == 200, "A begin: %r" % r)
    t0 = U.ckpt(ck["T0"])
    name = "model.layers.0.mlp.down_proj.weight"
    r = U.post_bucket(a, U.st_encode([t0[name]]))
    C.check(r.status == 200, "A bucket: %r" % r)
    r = H.get(a, "/v1/weights/export")
    H.error_ok(C, "export while a session is open", r, 409)
    b = H.Server(C, binary, ck["T0"], args=["--draft", ck["D0"], "--weights-from", url_of(a),
                                           "--weights-from-timeout", "120"] + SPEC)
    # pending: the pull retries A's 409; B is alive but not ready and serves nothing
    reason, t = "", time.time()
    while time.time() - t < 30:
        r = H.get(b, "/health?ready=1")
        reason = (r.json or {}).get("reason") or ""
        if "409" in reason:
            break
        time.sleep(0.05)
    C.check(r.status == 503 and (r.json or {}).get("status") == "pulling" and (r.json or {}).get("ready") is False,
            "B ready=1 while pulling: %r" % r)
    C.check("--weights-from" in reason and url_of(a) in reason and "409" in reason,
            "B's reason names the pull, the source and its 409: %r" % reason)
    r = H.get(b, "/health")
    C.check(r.status == 200 and r.json.get("status") == "pulling", "B plain /health while pulling: %r" % r)
    r = H.post(b, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
    H.error_ok(C, "B generation while pulling", r, 503)
    C.check("not ready" in ((r.json or {}).get("error") or {}).get("message", ""), "B's 503 says not ready: %r" % r)
    r = H.get(b, "/v1/weights/export")
    H.error_ok(C, "B's export while it pulls", r, 503, "--weights-from")
    r = H.post(b, "/v1/weights/pull", {"url": url_of(a)})
    H.error_ok(C, "a second pull while the start-up pull runs", r, 409)
    r = H.post(a, "/v1/weights/finish", {})
    C.check(r.status == 200 and r.json.get("version") == "step-8", "A finish: %r" % r)
    ok, t = False, time.time()
    while time.time() - t < 60:
        r = H.get(b, "/health?ready=1")
        if r.status == 200:
            ok = True
            break
        time.sleep(0.05)
    C.check(ok and r.json.get("weight_version") == "step-8", "B ready after A's finish: %r" % r)
    same_state(C, "B after --weights-from", state(b), state(a))
    for i, p in enumerate(U.PROMPTS):
        ga, gb = U.greedy(a, p), U.greedy(b, p)
        C.check(ga[:2] == gb[:2] and gb[2] == "step-8", "prompt %d: B %r, A %r" % (i, gb, ga))
    C.check("pulled the weights of %s (--weights-from)" % url_of(a) in b.stderr_text(), "B logs the pull")
    return b


def test_pull_route(C, ck, a, b):
    """POST /v1/weights/pull on a running replica follows A's updates."""
    T0, D0 = U.ckpt(ck["T0"]), U.ckpt(ck["D0"], "draft.")
    U.push(C, a, "A -> (T0, D0)", dict(T0, **D0), [sorted(dict(T0, **D0))],
           {"mode": "full", "model": "all", "version": "step-9"})
    before = state(b)
    C.check(before["target"] != state(a)["target"], "A's update changes nothing B could miss")
    r = H.post(b, "/v1/weights/pull", {"url": url_of(a) + "/", "timeout_s": 60})
    n = len(ck_sums(a, "target")["tensors"]) + len(ck_sums(a, "draft")["tensors"])
    n -= sum(1 for m in ("target", "draft") for k in ck_sums(a, m)["tensors"] if k.startswith("derived."))
    C.check(r.status == 200 and r.json.get("success") is True and r.json.get("version") == "step-9" and
            r.json.get("tensors") == n and r.json.get("bytes", 0) > 0 and r.json.get("source") == url_of(a),
            "pull: %r (expected %d tensors)" % (r, n))
    same_state(C, "B after the pull", state(b), state(a))
    # the target only
    T1 = U.ckpt(ck["T1"])
    U.push(C, a, "A target -> T1", T1, [sorted(T1)], {"mode": "full", "model": "target", "version": "step-10"})
    r = H.post(b, "/v1/weights/pull", {"url": url_of(a), "model": "target"})
    C.check(r.status == 200 and r.json.get("model") == "target" and r.json.get("version") == "step-10",
            "pull model target: %r" % r)
    same_state(C, "B after the target pull", state(b), state(a))
    for i, p in enumerate(U.PROMPTS):
        ga, gb = U.greedy(a, p), U.greedy(b, p)
        C.check(ga == gb, "prompt %d after the pulls: B %r, A %r" % (i, gb, ga))


class Fake(http.server.BaseHTTPRequestHandler):
    """A source that is not graphswap; what it answers is Fake.mode (set by the test)."""
    mode = "garbage"
    good = {}  # path -> bytes of a real graphswap answer (A's), which some modes distort

    def log_message(self, *a):
        pass

    def send(self, status, body, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        m = Fake.mode
        path = self.path
        if m == "garbage":
            return self.send(200, b"hello, I am not a weight server\n", "text/plain")
        if m == "404":
            return self.send(404, b"<html>Not Found</html>", "text/html")
        good = Fake.good.get(path)
        if good is None:
            return self.send(404, b"{}")
        if "/checksums" in path or m == "ok":
            return self.send(200, good)
        hn = struct.unpack("<Q", good[:8])[0]
        hdr = json.loads(good[8:8 + hn])
        if m == "truncated":
            return self.send(200, good[:len(good) // 2], "application/octet-stream")
        if m == "huge_header":
            return self.send(200, struct.pack("<Q", 10 ** 12) + good[8:], "application/octet-stream")
        if m == "not_json":
            return self.send(200, struct.pack("<Q", 16) + b"{not json here!}" + b"\0" * 64, "application/octet-stream")
        if m == "offsets":
            k = sorted(n for n in hdr if n != "__metadata__")[0]
            hdr[k]["data_offsets"][1] += 1 << 20
            return self.send(200, U.st_raw(hdr, good[8 + hn:]), "application/octet-stream")
        if m == "missing":
            k = max((n for n in hdr if n != "__metadata__"), key=lambda n: hdr[n]["data_offsets"][0])
            b, _ = hdr.pop(k)["data_offsets"]
            return self.send(200, U.st_raw(hdr, good[8 + hn:8 + hn + b]), "application/octet-stream")
        if m == "lying":  # a valid file whose bytes never match the checksums
            data = bytearray(good[8 + hn:])
            data[0] ^= 1
            return self.send(200, good[:8 + hn] + bytes(data), "application/octet-stream")
        return self.send(500, b"{}")


def test_refused(C, binary, ck, a, b, plain, tmp):
    """Refused pulls leave B as it was; each error is clear."""
    before = state(b)
    dead = "http://127.0.0.1:%d" % free_port()
    bad = [
        ("no url", {}, 400, "url"),
        ("url not http", {"url": "ftp://127.0.0.1:1"}, 400, "url"),
        ("https", {"url": "https://127.0.0.1:1"}, 400, "https"),
        ("url with a path", {"url": url_of(a) + "/v1"}, 400, "url"),
        ("bad port", {"url": "http://127.0.0.1:99999"}, 400, "url"),
        ("bad model", {"url": url_of(a), "model": "both"}, 400, "model"),
        ("api_key with a newline", {"url": url_of(a), "api_key": "k\r\nX-Evil: 1"}, 400, "api_key"),
        ("bad timeout", {"url": url_of(a), "timeout_s": -1}, 400, "timeout_s"),
        ("unreachable", {"url": dead, "timeout_s": 10}, 502, "cannot reach"),
    ]
    for what, body, status, field in bad:
        r = H.post(b, "/v1/weights/pull", body)
        H.error_ok(C, "pull: %s" % what, r, status, field)
    # a source that is not graphswap, distorting A's real answers
    for m in ("target", "draft"):
        Fake.good["/v1/weights/checksums?names=checkpoint&model=%s" % m] = H.get(
            a, "/v1/weights/checksums?names=checkpoint&model=%s" % m).raw
        Fake.good["/v1/weights/export?model=%s" % m] = H.get(a, "/v1/weights/export?model=%s" % m).raw
    fs = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    th = threading.Thread(target=fs.serve_forever, daemon=True)
    th.start()
    furl = "http://127.0.0.1:%d" % fs.server_address[1]
    try:
        fake = [
            ("garbage", 502, "graphswap"),
            ("404", 502, "HTTP 404"),
            ("truncated", 502, "export"),
            ("huge_header", 502, "export"),
            ("not_json", 502, "export"),
            ("offsets", 502, "export"),
            ("missing", 422, "lacks"),
            ("lying", 502, "changed its weights"),
        ]
        for mode, status, field in fake:
            Fake.mode = mode
            r = H.post(b, "/v1/weights/pull", {"url": furl, "timeout_s": 30})
            H.error_ok(C, "pull from a fake source (%s)" % mode, r, status, field)
        # the fake answering A's real bytes is a working source: the harness itself is sound
        Fake.mode = "ok"
        r = H.post(b, "/v1/weights/pull", {"url": furl})
        C.check(r.status == 200 and r.json.get("version") == before["version"], "pull from the fake in ok mode: %r" % r)
    finally:
        fs.shutdown()
        fs.server_close()
    # a graphswap source of another shape, behind an admin key
    other = H.mkmodel(C, binary, os.path.join(tmp, "other"), extra=["--intermediate", "96", "--seed", "9"])
    e = H.Server(C, binary, other, args=["--admin-key", "sekrit"])
    try:
        r = H.post(b, "/v1/weights/pull", {"url": url_of(e), "model": "target"})
        H.error_ok(C, "pull without the source's admin key", r, 502, "HTTP 401")
        r = H.post(b, "/v1/weights/pull", {"url": url_of(e), "model": "target", "api_key": "sekrit"})
        H.error_ok(C, "pull from another shape", r, 422, "shape")
        msg = ((r.json or {}).get("error") or {}).get("message", "")
        C.check("[64, 96]" in msg and "[64, 128]" in msg, "the 422 names both shapes: %r" % msg)
        r = H.post(b, "/v1/weights/pull", {"url": url_of(plain)})
        H.error_ok(C, "pull model all from a source without a drafter", r, 502, "drafter")
        same_state(C, "B after the refused pulls", state(b), before)
        H.healthy(C, b, "B after the refused pulls")
        test_boot_fails(C, binary, ck, e)
    finally:
        H.stop_clean(C, e)


def test_boot_fails(C, binary, ck, other):
    """--weights-from that cannot succeed: exit 1 after the timeout (unreachable) or at once (shape)."""
    cases = [
        ("unreachable", ["--weights-from", "http://127.0.0.1:%d" % free_port(), "--weights-from-timeout", "3"], 60),
        ("another shape", ["--weights-from", url_of(other), "--weights-from-key", "sekrit"], 60),
        ("a bad url", ["--weights-from", "localhost:8080"], 60),
    ]
    for what, args, limit in cases:
        t0 = time.time()
        p = subprocess.run([binary, "serve", "--model", ck["T0"], "--port", "0"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=limit)
        err = p.stderr.decode(errors="replace")
        C.check(p.returncode == 1 and "--weights-from" in err, "--weights-from %s: exit %r: %s"
                % (what, p.returncode, err[-1500:]))
        C.check("runtime error:" not in err and "AddressSanitizer" not in err, "%s: sanitizer report: %s" % (what, err[-3000:]))
        if what == "unreachable":
            C.check(time.time() - t0 >= 2.5 and "cannot reach" in err, "unreachable: retried for the timeout: %s" % err[-800:])


def main():
    C = H.Checker("weights_pull")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_pull")
    ck = {}
    ck["T0"] = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--seed", "1"])
    ck["T1"] = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=["--seed", "2"])
    ck["D0"] = U.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "D0"), 3)
    ck["D1"] = U.mk_drafter(C, binary, ck["T0"], os.path.join(tmp, "D1"), 4)
    a = H.Server(C, binary, ck["T0"], args=["--draft", ck["D0"]] + SPEC)
    plain = b = None
    try:
        cold = state(a)
        T1, D1 = U.ckpt(ck["T1"]), U.ckpt(ck["D1"], "draft.")
        both = dict(T1, **D1)
        U.push(C, a, "A -> (T1, D1)", both, U.make_buckets(list(both), "mixed", random.Random(7), "draft."),
               {"mode": "full", "model": "all", "version": "step-7"})
        C.check(state(a)["target"] != cold["target"] and state(a)["draft"] != cold["draft"],
                "A's weights differ from its --model checkpoint")
        plain = H.Server(C, binary, ck["T0"])
        plain.model_dir = ck["T0"]
        test_export(C, a, plain)
        b = test_join(C, binary, ck, a)
        test_pull_route(C, ck, a, b)
        test_refused(C, binary, ck, a, b, plain, tmp)
        H.healthy(C, a, "A at the end")
    finally:
        for s in (b, plain, a):
            if s is not None:
                H.stop_clean(C, s)
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
