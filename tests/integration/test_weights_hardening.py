#!/usr/bin/env python3
"""Weight updates over HTTP, part 3: hardening (issue 14). Each check is a regression test of a
defect of the old server:

- Disk loads stay under --weights-root file by file: a folder inside the root whose
  model.safetensors (or an index shard) is a symlink to a checkpoint outside -> 403 naming the
  resolved path, nothing loaded; a file that is not a checkpoint -> 400 "is not a safetensors
  file" without echoing its bytes (the old message showed "header length N" from the first 8
  bytes); a relative path is resolved against the root (the old server used its working
  directory) and errors name the resolved path.
- Version names ("version", "weight_version", "new_version") must be valid UTF-8 without control
  characters, at most 127 bytes: else 400 and nothing changes.
- Weight-route bodies with data after the JSON object -> 400 (no session opened).
- Bucket numbers in errors count per session from 1.
- --weight-session-timeout: an abandoned session (begin, then nothing) is aborted by the server
  like an explicit abort; queued generation then runs; one stderr line; counted in /metrics
  (graphswap:weight_sessions_timed_out_total). A session with buckets arriving is not aborted.
- /health: 200 with "status":"updating" during a session (liveness), 503 for ?ready=1 (readiness);
  "paused" likewise after /pause.
- GET /v1/weights/checksums?names=checkpoint: one entry per checkpoint tensor name (plus derived
  buffers), each SHA-256 of the tensor in the checkpoint dtype; the default answer is unchanged.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import hashlib
import json
import os
import shutil
import struct
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

TIMEOUT_S = 2


def err_msg(r):
    return ((r.json or {}).get("error") or {}).get("message") or ""


def test_disk_confinement(C, srv, root, outside, ck):
    base = W.checksums(srv, "target")
    # compared with later reads: a failed read ({"_error": ...}) would equal a later failed one
    C.check(bool(base) and "_error" not in base, "checksums before: %r" % (base,))
    h0 = W.hooks(srv)
    # a folder inside the root whose model.safetensors is a symlink to a checkpoint outside it
    evil = os.path.join(root, "evil")
    shutil.rmtree(evil, ignore_errors=True)
    os.makedirs(evil)
    for f in os.listdir(ck["T1"]):
        if f != "model.safetensors":
            shutil.copy(os.path.join(ck["T1"], f), evil)
    out_ck = os.path.join(outside, "T1")
    os.symlink(os.path.join(out_ck, "model.safetensors"), os.path.join(evil, "model.safetensors"))
    r = H.post(srv, "/v1/weights/load", {"path": evil})
    H.error_ok(C, "a symlinked file out of the root", r, 403, "path")
    C.check(os.path.realpath(out_ck) in err_msg(r), "403 does not name the resolved file: %r" % r)
    # the same through a sharded index whose shard is a symlink out of the root
    sh = os.path.join(root, "evil_sharded")
    shutil.rmtree(sh, ignore_errors=True)
    os.makedirs(sh)
    for f in os.listdir(ck["T1"]):
        if f != "model.safetensors":
            shutil.copy(os.path.join(ck["T1"], f), sh)
    names = list(W.ckpt(ck["T1"]))
    with open(os.path.join(sh, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: "shard-1.safetensors" for n in names}}, f)
    os.symlink(os.path.join(out_ck, "model.safetensors"), os.path.join(sh, "shard-1.safetensors"))
    r = H.post(srv, "/v1/weights/load", {"path": sh})
    H.error_ok(C, "a symlinked shard out of the root", r, 403, "path")
    # SGLang's route and draft_path alike
    r = H.post(srv, "/update_weights_from_disk", {"model_path": evil})
    C.check(r.status == 403, "SGLang: a symlinked file out of the root: %r" % r)
    # not a checkpoint: its bytes are not echoed
    junk = os.path.join(root, "junk")
    shutil.rmtree(junk, ignore_errors=True)
    os.makedirs(junk)
    secret = b"TOPSECRET-0123456789-not-a-checkpoint\n"
    with open(os.path.join(junk, "model.safetensors"), "wb") as f:
        f.write(secret)
    r = H.post(srv, "/v1/weights/load", {"path": junk})
    H.error_ok(C, "not a safetensors file", r, 400, "path")
    hl = str(struct.unpack("<Q", secret[:8])[0])
    C.check("not a safetensors file" in err_msg(r) and hl not in err_msg(r) and "TOPSECRET" not in err_msg(r),
            "the error echoes the file or does not say what it is: %r" % r)
    # relative paths resolve against the root; errors name the resolved path
    r = H.post(srv, "/v1/weights/load", {"path": "nope/x"})
    H.error_ok(C, "a missing relative folder", r, 400, "path")
    C.check(os.path.join(os.path.realpath(root), "nope/x") in err_msg(r), "error hides the resolved path: %r" % r)
    r = H.post(srv, "/v1/weights/load", {"path": "../outside/T1"})
    H.error_ok(C, "a relative path out of the root", r, 403, "path")
    C.check(W.weights_info(srv).get("state") == "ready" and W.checksums(srv, "target") == base,
            "refused loads changed the weights")
    W.check_hooks(C, "refused loads", h0, W.hooks(srv), 0, 0)
    r = H.post(srv, "/v1/weights/load", {"path": "T1", "version": "rel-1"})
    C.check(r.status == 200 and r.json.get("version") == "rel-1", "a relative path under the root: %r" % r)
    C.check(W.checksums(srv, "target") != base, "the relative load changed nothing")
    r = H.post(srv, "/v1/weights/load", {"path": "T0"})
    C.check(r.status == 200 and W.checksums(srv, "target") == base, "back to T0: %r" % r)


def test_versions_and_bodies(C, srv, ck):
    v0 = W.weights_info(srv).get("version")
    bad = [("a\x01b", "control"), ("tab\there", "control"), ("del\x7f", "control"), ("c1\u0085x", "control"),
           ("x" * 128, "127")]
    for v, needle in bad:
        for path, key in (("/v1/weights/begin", "version"), ("/v1/weights/begin", "weight_version"),
                          ("/update_weight_version", "new_version")):
            r = H.post(srv, path, {key: v, "model": "target"} if "begin" in path else {key: v})
            H.error_ok(C, "%s %s=%r" % (path, key, v[:10]), r, 400, key)
    # invalid UTF-8 inside the JSON string (raw bytes)
    r = H.post(srv, "/v1/weights/begin", b'{"version": "\xff\xfe"}')
    H.error_ok(C, "begin with a version that is not UTF-8", r, 400, "version")
    r = H.post(srv, "/update_weight_version", b'{"new_version": "ok\xc3("}')
    H.error_ok(C, "update_weight_version not UTF-8", r, 400, "new_version")
    C.check(not W.weights_info(srv).get("session_open") and W.weights_info(srv).get("version") == v0,
            "a refused version changed the state: %r" % W.weights_info(srv))
    # a finish with a bad version is refused and the session stays open (a good finish works)
    r = H.post(srv, "/v1/weights/begin", {"model": "target", "mode": "partial", "version": "ünïcode-ok ✓"})
    C.check(r.status == 200, "begin with a UTF-8 version: %r" % r)
    r = H.post(srv, "/v1/weights/finish", {"version": "bad\nname"})
    H.error_ok(C, "finish with a newline in the version", r, 400, "version")
    C.check(W.weights_info(srv).get("session_open") is True, "a refused finish closed the session")
    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200, "abort: %r" % r)
    # data after the JSON object
    for path, body in (("/v1/weights/begin", b'{"model": "target"} {"model": "draft"}'),
                       ("/v1/weights/begin", b'{"model": "target"}x'),
                       ("/v1/weights/begin", b'{"model": "target"} \x00'),
                       ("/pause", b'{"mode": "keep"}]'), ("/weight_checker", b'{"action": "checksum"} 1')):
        r = H.post(srv, path, body)
        H.error_ok(C, "%s with trailing data" % path, r, 400)
        # (a trailing NUL is refused by the NUL rule of every JSON body, before the trailing-data one)
        C.check("after the JSON object" in err_msg(r) or "NUL" in err_msg(r), "%s: %r" % (path, r))
    info = W.weights_info(srv)
    C.check(not info.get("session_open") and not info.get("paused"), "a refused body took effect: %r" % info)
    # empty and whitespace-only bodies still mean {}
    for body in (b"", b"  \r\n"):
        r = H.post(srv, "/resume", body)
        C.check(r.status == 200, "/resume with body %r: %r" % (body, r))


def test_bucket_numbers(C, srv, ck):
    T1 = W.ckpt(ck["T1"])
    names = sorted(T1)
    # some sessions with several buckets first, so a process-wide count would be far from 1
    W.push(C, srv, "warm-up", T1, [names[i:i + 3] for i in range(0, len(names), 3)], {"model": "target"})
    r = H.post(srv, "/v1/weights/begin", {"model": "target", "mode": "partial"})
    C.check(r.status == 200, "begin: %r" % r)
    r = W.post_bucket(srv, b"\x01" * 4)
    H.error_ok(C, "a first bad bucket", r, 400)
    C.check(err_msg(r).startswith("bucket 1:"), "the session's first bucket is not bucket 1: %r" % err_msg(r))
    r = W.post_bucket(srv, W.st_encode([T1[names[0]]]))
    C.check(r.status == 200, "good bucket: %r" % r)
    r = W.post_bucket(srv, W.st_raw({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4))
    H.error_ok(C, "a third bucket, unknown name", r, 400)
    C.check("bucket 3" in err_msg(r), "the third bucket is not bucket 3: %r" % err_msg(r))
    r = H.post(srv, "/v1/weights/finish", {})
    C.check(r.status == 200, "finish: %r" % r)
    W.push(C, srv, "back to T0", W.ckpt(ck["T0"]), [sorted(W.ckpt(ck["T0"]))], {"model": "target"})


def test_health_and_timeout(C, srv, ck):
    H.healthy(C, srv, "before")
    m0 = H.metrics(srv).get("graphswap:weight_sessions_timed_out_total")
    C.check(m0 == 0, "graphswap:weight_sessions_timed_out_total at start: %r" % m0)
    # a session kept alive by buckets every second (longer than the timeout in all) is not aborted
    T0 = W.ckpt(ck["T0"])
    names = sorted(T0)
    r = H.post(srv, "/v1/weights/begin", {"model": "target", "mode": "partial"})
    C.check(r.status == 200, "begin: %r" % r)
    for n in names[:4]:
        time.sleep(TIMEOUT_S * 0.5)
        r = W.post_bucket(srv, W.st_encode([T0[n]]))
        C.check(r.status == 200, "a bucket of a live session: %r" % r)
    r = H.post(srv, "/v1/weights/finish", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "finish of a live session: %r" % r)
    # /health during a session: liveness 200 "updating", readiness 503
    v0 = W.weights_info(srv).get("version")
    r = H.post(srv, "/v1/weights/begin", {"model": "target", "version": "abandoned"})
    C.check(r.status == 200, "begin: %r" % r)
    r = H.get(srv, "/health")
    C.check(r.status == 200 and r.json.get("status") == "updating" and r.json.get("session_open") is True and
            r.json.get("ready") is False, "/health during a session: %r" % r)
    r = H.get(srv, "/health?ready=1")
    C.check(r.status == 503 and r.json.get("status") == "updating", "/health?ready=1 during a session: %r" % r)
    # then the trainer dies: a queued request waits, the session times out, the request runs
    out = {}

    def bg():
        out["r"] = H.post(srv, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})

    t0 = time.time()
    t = threading.Thread(target=bg, daemon=True)
    t.start()
    t.join(60)
    took = time.time() - t0
    C.check(not t.is_alive() and out.get("r") is not None and out["r"].status == 200,
            "a request queued behind an abandoned session: %r" % out)
    C.check(took >= TIMEOUT_S * 0.5, "the request did not wait for the session (%.1fs)" % took)
    info = W.weights_info(srv)
    C.check(info.get("state") == "ready" and not info.get("session_open") and info.get("version") == v0,
            "after the timeout: %r" % info)
    C.check(H.metrics(srv).get("graphswap:weight_sessions_timed_out_total") == 1, "the timeout is not counted")
    lines = [ln for ln in srv.stderr_text().splitlines() if "weight-session-timeout" in ln]
    C.check(len(lines) == 1 and "aborted" in lines[0], "stderr: %r" % lines)
    H.healthy(C, srv, "after the timeout")
    r = H.post(srv, "/v1/weights/abort", {})
    H.error_ok(C, "abort after the timeout", r, 409, "ready")
    # a timed-out session that had written -> inconsistent, as an explicit abort leaves it
    r = H.post(srv, "/v1/weights/begin", {"model": "target"})
    r = W.post_bucket(srv, W.st_encode([T0[names[0]]]))
    C.check(r.status == 200, "bucket: %r" % r)
    deadline = time.time() + 30
    while time.time() < deadline and W.weights_info(srv).get("session_open"):
        time.sleep(0.2)
    info = W.weights_info(srv)
    C.check(info.get("state") == "inconsistent" and "abort" in (info.get("reason") or ""),
            "a timed-out session with writes: %r" % info)
    W.push(C, srv, "repair", T0, [names], {"model": "target"})
    # /pause: liveness 200 "paused", readiness 503
    r = H.post(srv, "/pause?mode=keep", {})
    r = H.get(srv, "/health")
    C.check(r.status == 200 and r.json.get("status") == "paused" and r.json.get("paused") is True,
            "/health while paused: %r" % r)
    C.check(H.get(srv, "/health?ready=1").status == 503, "/health?ready=1 while paused")
    H.post(srv, "/resume", {})
    C.check(H.get(srv, "/health?ready=1").status == 200, "/health?ready=1 after resume")
    H.healthy(C, srv, "after resume")


def st_values_sha(t, dtype):
    """SHA-256 of a checkpoint tensor's bytes when its dtype is the hash dtype."""
    assert t.dtype == dtype, (t.name, t.dtype, dtype)
    return hashlib.sha256(t.data).hexdigest()


def test_checksum_names(C, srv, ck):
    T0 = W.ckpt(ck["T0"])
    r = H.get(srv, "/v1/weights/checksums?names=checkpoint")
    C.check(r.status == 200 and r.json.get("names") == "checkpoint", "checksums?names=checkpoint: %r" % r)
    sums = (r.json or {}).get("tensors") or {}
    dt = (r.json or {}).get("dtype")
    C.check(set(sums) == set(T0), "checkpoint-name keys differ from the checkpoint: extra %s, missing %s" %
            (sorted(set(sums) - set(T0))[:4], sorted(set(T0) - set(sums))[:4]))
    same_dt = [n for n in T0 if T0[n].dtype == dt]
    C.check(len(same_dt) > 0, "no checkpoint tensor in the hash dtype %r" % dt)
    for n in same_dt:
        C.check(sums.get(n) == st_values_sha(T0[n], dt), "checksum of %s is not sha256 of its bytes" % n)
    internal = W.checksums(srv, "target")
    C.check("model.layers.0.self_attn.q_proj.weight" not in internal and len(internal) < len(sums),
            "the default answer changed: %d keys" % len(internal))
    for path in ("/weight_checker", "/weights_checker"):
        r = H.post(srv, path, {"action": "compare", "names": "checkpoint", "checksums": sums})
        C.check(r.status == 200 and r.json.get("match") is True, "%s compare by checkpoint names: %r" % (path, r))
    r = H.get(srv, "/v1/weights/checksums?names=bogus")
    H.error_ok(C, "names=bogus", r, 400, "names")
    r = H.get(srv, "/v1/weights/checksums?names=checkpoint&model=draft")
    H.error_ok(C, "draft checksums without a drafter", r, 400)


def main():
    C = H.Checker("weights_hardening")
    binary = H.gs_bin(C)
    tmp = os.path.abspath(H.scratch("weights_hardening"))
    root = os.path.join(tmp, "root")
    outside = os.path.join(tmp, "outside")
    os.makedirs(root, exist_ok=True)
    os.makedirs(outside, exist_ok=True)
    ck = {}
    for name, seed in (("T0", 11), ("T1", 12)):
        ck[name] = H.mkmodel(C, binary, os.path.join(root, name), extra=["--layers", "2", "--seed", str(seed)])
    H.mkmodel(C, binary, os.path.join(outside, "T1"), extra=["--layers", "2", "--seed", "13"])
    try:
        srv = H.Server(C, binary, ck["T0"], args=["--weights-root", root, "--update-bucket-bytes", "65536",
                                                  "--weight-session-timeout", str(TIMEOUT_S)])
        try:
            test_disk_confinement(C, srv, root, outside, ck)
            test_versions_and_bodies(C, srv, ck)
            test_bucket_numbers(C, srv, ck)
            test_checksum_names(C, srv, ck)
            test_health_and_timeout(C, srv, ck)
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
