#!/usr/bin/env python3
"""Weight-side routes of RL frameworks, replayed as their sources build the requests, and --admin-allow.

- prime-rl (PrimeIntellect-ai/prime-rl@559b447): src/prime_rl/utils/client.py update_weights() sends
  POST /pause params={"mode": "keep", "clear_cache": "false"}, then POST /update_weights
  json={"weight_dir": weight_dir.as_posix()}, then POST /resume; src/prime_rl/inference/vllm/server.py
  answers {"status": "ok"} (filesystem worker: a disk load of that folder). Here: the load happens
  (checksums equal a native /v1/weights/load of the same folder), is confined to --weights-root (403
  naming weight_dir), a non-string weight_dir is 400, both weight_dir and update_info is 400, and the
  vLLM NCCL form of the same route still answers as before (no update_info -> 400 naming it).
- TRL `trl vllm-serve` (huggingface/trl@f2cd577): trl/generation/vllm_client.py posts
  /init_communicator/ {"host": "0.0.0.0", "port": group_port, "world_size": n + 1,
  "client_device_uuid": str(uuid)}, /update_named_param/ {"name", "dtype": str(tensor.dtype),
  "shape": tuple}, /reset_prefix_cache/ and /close_communicator/ without a body;
  trl/scripts/vllm_serve.py answers {"message": ...}. Here: /reset_prefix_cache/ 200 with TRL's
  message; the NCCL ones validate their bodies (400 naming the field) and answer 501 on the CPU
  backend ("need the CUDA backend"), as the vLLM / SGLang NCCL routes do; trailing-slash paths only
  take POST (405).
- SGLang /pause_generation -> /update_weights_from_disk -> /continue_generation: the pause lasts
  until continue (and prime-rl's /pause until /resume), not until the update.
- SGLang GET and POST /flush_cache (sgl-project/sglang@9c0549b python/sglang/srt/entrypoints/
  http_server.py): 200 with the text body starting "Cache flushed."; ?timeout= validated.
- --admin-allow: 127.0.0.0/8 with --api-key admits a keyless loopback client to the weight routes
  (not to the API routes); 10.0.0.0/8 with --api-key refuses it (401) and takes the key; 10.0.0.0/8
  alone refuses it (403 naming --admin-allow); on --host 0.0.0.0 without --admin-key, 127.0.0.0/8
  opens the weight routes to loopback (403 today without the list) and 10.0.0.0/8 keeps them closed;
  --admin-key still works for a client outside the list; malformed CIDRs refuse start-up.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402

NEEDS = "need the CUDA backend"
FLUSHED = "Cache flushed."


def sums(srv):
    r = H.get(srv, "/v1/weights/checksums")
    return r.json.get("tensors") if r.status == 200 and isinstance(r.json, dict) else {"_error": repr(r)}


def baseline(C, srv, what):
    """The checksums later ones must equal: a failed read ({"_error": ...}) would equal a later failed one."""
    s = sums(srv)
    C.check(bool(s) and "_error" not in s, "%s: checksums before: %r" % (what, s))
    return s


def test_prime_rl(C, srv, root, t0, t1):
    before = baseline(C, srv, "prime-rl")
    v0 = H.get(srv, "/v1/weights").json["version_number"]
    # the orchestrator's sequence (client.py _pause_engines / update_weights / _resume_engines)
    r = H.post(srv, "/pause?mode=keep&clear_cache=false", None)
    C.check(r.status == 200 and r.json.get("status") == "paused", "prime-rl /pause: %r" % r)
    r = H.post(srv, "/update_weights", {"weight_dir": t1})
    C.check(r.status == 200 and r.json == {"status": "ok"}, "prime-rl /update_weights weight_dir: %r" % r)
    C.check(H.get(srv, "/is_paused").json.get("is_paused") is True, "the update ended prime-rl's pause")
    r = H.post(srv, "/resume", None)
    C.check(r.status == 200 and r.json.get("status") == "resumed", "prime-rl /resume: %r" % r)
    w = H.get(srv, "/v1/weights").json
    C.check(w["state"] == "ready" and w["version_number"] == v0 + 1 and not w["paused"],
            "after the prime-rl update: %r" % w)
    got = sums(srv)
    C.check(got != before, "the prime-rl update changed no weight")
    # the same folder through the native route gives the same weights
    r = H.post(srv, "/v1/weights/load", {"path": t0})
    C.check(r.status == 200 and sums(srv) == before, "native load of T0 restores the start: %r" % r)
    r = H.post(srv, "/v1/weights/load", {"path": os.path.relpath(t1, root)})
    C.check(r.status == 200 and sums(srv) == got, "native load of T1 == the prime-rl load: %r" % r)
    # a relative weight_dir is taken under --weights-root, as every disk load
    r = H.post(srv, "/update_weights", {"weight_dir": os.path.basename(t0)})
    C.check(r.status == 200 and r.json == {"status": "ok"} and sums(srv) == before, "relative weight_dir: %r" % r)
    # errors
    H.error_ok(C, "weight_dir outside --weights-root", H.post(srv, "/update_weights", {"weight_dir": "/"}), 403,
               "weight_dir")
    H.error_ok(C, "weight_dir null", H.post(srv, "/update_weights", {"weight_dir": None}), 400, "weight_dir")
    H.error_ok(C, "weight_dir 5", H.post(srv, "/update_weights", {"weight_dir": 5}), 400, "weight_dir")
    H.error_ok(C, "weight_dir missing folder", H.post(srv, "/update_weights", {"weight_dir": "nope"}), 400,
               "weight_dir")
    H.error_ok(C, "weight_dir and update_info",
               H.post(srv, "/update_weights", {"weight_dir": t1, "update_info": {}}), 400, "weight_dir")
    # the vLLM NCCL form of the route is unchanged
    H.error_ok(C, "update_weights {}", H.post(srv, "/update_weights", {}), 400, "update_info")
    C.check(sums(srv) == before and H.get(srv, "/v1/weights").json["state"] == "ready",
            "refused updates changed nothing")


def test_sglang_pause(C, srv, t0, t1):
    """slime (THUDM/slime@02a644a79e3f06a317f1ea3b441d61f18a65b411 slime/backends/megatron_utils/
    update_weight/update_weight_from_distributed.py update_weights(): pause_generation, flush_cache,
    the buckets, continue_generation) pauses around many updates (disk here; NCCL buckets are
    /update_weights_from_distributed with the same keep_paused): an update in between must not end
    the pause, or queued requests would run on half-updated weights."""
    r = H.post(srv, "/pause_generation", {"mode": "in_place"})
    C.check(r.status == 200, "SGLang /pause_generation: %r" % r)
    r = H.post(srv, "/update_weights_from_disk", {"model_path": t1})
    C.check(r.status == 200 and r.json.get("success") is True, "SGLang update_weights_from_disk: %r" % r)
    C.check(H.get(srv, "/is_paused").json.get("is_paused") is True, "the update ended SGLang's pause")
    r = H.post(srv, "/continue_generation", {})
    C.check(r.status == 200 and H.get(srv, "/is_paused").json.get("is_paused") is False, "continue: %r" % r)
    r = H.post(srv, "/update_weights_from_disk", {"model_path": t0})
    C.check(r.status == 200 and H.get(srv, "/is_paused").json.get("is_paused") is False,
            "an update without a pause leaves generation running: %r" % r)


def test_prime_rl_no_root(C, srv, t1):
    H.error_ok(C, "weight_dir without --weights-root", H.post(srv, "/update_weights", {"weight_dir": t1}), 403,
               "weight_dir")


def is_501(C, what, r):
    e = (r.json or {}).get("error") if isinstance(r.json, dict) else None
    C.check(r.status == 501 and isinstance(e, dict) and NEEDS in (e.get("message") or ""),
            "%s: expected 501 naming %r, got %r" % (what, NEEDS, r))


def test_trl(C, srv, hidden):
    before = baseline(C, srv, "TRL")
    # vllm_client.py reset_prefix_cache(): self.session.post(url) (no body)
    r = H.post(srv, "/reset_prefix_cache/", None)
    C.check(r.status == 200 and r.json == {"message": "Request received, resetting prefix cache status: True"},
            "TRL /reset_prefix_cache/: %r" % r)
    C.check(H.get(srv, "/reset_prefix_cache/").status == 405, "GET /reset_prefix_cache/ is 405")
    # init_communicator(): world_size = vllm world size (1 here) + 1, host "0.0.0.0", group_port 51216
    init = {"host": "0.0.0.0", "port": 51216, "world_size": 2,
            "client_device_uuid": "5c7b2f04-6a3e-4f7e-9d3a-3b8e6f1d2c90"}
    for body, field in [({k: v for k, v in init.items() if k != "host"}, "host"),
                        (dict(init, host=""), "host"),
                        (dict(init, port="x"), "port"),
                        (dict(init, port=70000), "port"),
                        (dict(init, world_size=3), "world_size"),
                        ({k: v for k, v in init.items() if k != "world_size"}, "world_size"),
                        ({k: v for k, v in init.items() if k != "client_device_uuid"}, "client_device_uuid")]:
        H.error_ok(C, "init_communicator %s" % json.dumps(body)[:80], H.post(srv, "/init_communicator/", body), 400,
                   field)
    is_501(C, "init_communicator", H.post(srv, "/init_communicator/", init))
    # update_named_param(name, weights): {"name", "dtype": str(weights.dtype), "shape": tuple(weights.shape)}
    good = {"name": "model.norm.weight", "dtype": "torch.bfloat16", "shape": [hidden]}
    for body, field in [({k: v for k, v in good.items() if k != "name"}, "name"),
                        (dict(good, name=7), "name"),
                        (dict(good, dtype="torch.int4"), "dtype"),
                        ({k: v for k, v in good.items() if k != "dtype"}, "dtype"),
                        (dict(good, shape=hidden), "shape"),
                        (dict(good, shape=[-1]), "shape"),
                        (dict(good, shape=[1.5]), "shape")]:
        H.error_ok(C, "update_named_param %s" % json.dumps(body)[:80], H.post(srv, "/update_named_param/", body),
                   400, field)
    is_501(C, "update_named_param", H.post(srv, "/update_named_param/", good))
    is_501(C, "update_named_param float32", H.post(srv, "/update_named_param/", dict(good, dtype="torch.float32")))
    is_501(C, "close_communicator", H.post(srv, "/close_communicator/", None))
    C.check(H.post(srv, "/init_communicator", init).status == 404, "/init_communicator without the slash is 404")
    C.check(sums(srv) == before and H.get(srv, "/v1/weights").json["state"] == "ready", "TRL routes changed nothing")


def test_flush_cache(C, srv):
    for method in ("GET", "POST"):
        r = H.request(srv, method, "/flush_cache")
        C.check(r.status == 200 and r.raw.decode().startswith(FLUSHED) and
                r.headers.get("content-type", "").startswith("text/plain"), "%s /flush_cache: %r" % (method, r))
    r = H.post(srv, "/flush_cache", {})
    C.check(r.status == 200 and r.raw.decode().startswith(FLUSHED), "POST /flush_cache {}: %r" % r)
    r = H.get(srv, "/flush_cache?timeout=10")
    C.check(r.status == 200 and r.raw.decode().startswith(FLUSHED), "GET /flush_cache?timeout=10: %r" % r)
    for q in ("-1", "abc", ""):
        H.error_ok(C, "flush_cache?timeout=%s" % q, H.get(srv, "/flush_cache?timeout=" + q), 400, "timeout")


def test_admin_allow(C, binary, model):
    key = {"Authorization": "Bearer k-1"}
    admin = {"Authorization": "Bearer a-1"}

    def with_server(args, host, fn):
        srv = H.Server(C, binary, model, args, host=host)
        try:
            fn(srv)
        finally:
            H.stop_clean(C, srv)

    def loop_allowed(srv):
        for method, path in (("GET", "/v1/weights"), ("POST", "/flush_cache"), ("POST", "/pause"),
                             ("POST", "/resume")):
            r = H.request(srv, method, path)
            C.check(r.status == 200, "--admin-allow 127.0.0.0/8 --api-key, no key: %s %s: %r" % (method, path, r))
        H.error_ok(C, "--admin-allow leaves the API routes to the API key", H.get(srv, "/v1/models"), 401)
        C.check(H.get(srv, "/v1/models", headers=key).status == 200, "API route with the key")
        C.check("--admin-allow 127.0.0.0/8" in srv.stderr_text(), "the start-up log names the allow list")
    with_server(["--api-key", "k-1", "--admin-allow", "127.0.0.0/8"], "127.0.0.1", loop_allowed)

    def loop_outside_key(srv):
        H.error_ok(C, "--admin-allow 10.0.0.0/8 --api-key, no key", H.get(srv, "/v1/weights"), 401)
        C.check(H.get(srv, "/v1/weights", headers=key).status == 200, "--admin-allow 10.0.0.0/8 --api-key, key")
    with_server(["--api-key", "k-1", "--admin-allow", "10.0.0.0/8"], "127.0.0.1", loop_outside_key)

    def loop_outside_open(srv):
        r = H.get(srv, "/v1/weights")
        if H.error_ok(C, "--admin-allow 10.0.0.0/8, no keys: loopback client", r, 403):
            C.check("--admin-allow" in r.json["error"]["message"], "the 403 names --admin-allow: %r" % r)
        C.check(H.post(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 1}).status == 200,
                "generation unaffected")
    with_server(["--admin-allow", "10.0.0.0/8,fd00::/8"], "127.0.0.1", loop_outside_open)

    def any_allowed(srv):
        C.check(H.get(srv, "/v1/weights").status == 200, "--host 0.0.0.0 --admin-allow 127.0.0.0/8: loopback in")
        C.check(H.post(srv, "/reset_prefix_cache", {}).status == 200, "--host 0.0.0.0 --admin-allow: reset")
    with_server(["--admin-allow", "::1/128,127.0.0.0/8"], "0.0.0.0", any_allowed)

    def any_outside(srv):
        r = H.get(srv, "/v1/weights")
        if H.error_ok(C, "--host 0.0.0.0 --admin-allow 10.0.0.0/8: loopback client", r, 403):
            C.check("--admin-allow" in r.json["error"]["message"], "the 403 names --admin-allow: %r" % r)
        H.error_ok(C, "--host 0.0.0.0 --admin-allow 10.0.0.0/8 --api-key: the API key is no admin key",
                   H.get(srv, "/v1/weights", headers=key), 403)
    with_server(["--admin-allow", "10.0.0.0/8", "--api-key", "k-1"], "0.0.0.0", any_outside)

    def admin_key(srv):
        H.error_ok(C, "--admin-allow 10.0.0.0/8 --admin-key, no key", H.get(srv, "/v1/weights"), 401)
        C.check(H.get(srv, "/v1/weights", headers=admin).status == 200, "--admin-allow 10.0.0.0/8 --admin-key, key")
    with_server(["--admin-allow", "10.0.0.0/8", "--admin-key", "a-1"], "0.0.0.0", admin_key)

    # malformed lists refuse start-up (exit 1 naming the flag), before anything listens
    for bad in ("10.0.0.0/33", "10.0.0.1/8", "::1/129", "fd00::1/8", "10.0.0.0/", "10.0.0.0/08", "10.0.0.0/+8",
                "10.0.0.0/8/8", "010.0.0.0/8", "1.2.3/8", "1.2.3.4.5", "256.0.0.0/8", "abc", "fe80::1%lo",
                "", ",", "10.0.0.0/8,", " 10.0.0.0/8", "localhost"):
        p = subprocess.run([binary, "serve", "--model", model, "--port", "0", "--admin-allow", bad],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        err = p.stderr.decode(errors="replace")
        C.check(p.returncode != 0 and "--admin-allow" in err, "--admin-allow %r: rc %r, %s" % (bad, p.returncode,
                                                                                             err[-300:]))


def main():
    C = H.Checker("weights_dialects")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_dialects")
    extra = ["--layers", "2"]
    t0 = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=extra + ["--seed", "31"])
    t1 = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=extra + ["--seed", "32"])
    with open(os.path.join(t0, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    try:
        srv = H.Server(C, binary, t0, ["--weights-root", tmp])
        try:
            test_prime_rl(C, srv, tmp, t0, t1)
            test_sglang_pause(C, srv, t0, t1)
            test_trl(C, srv, hidden)
            test_flush_cache(C, srv)
        finally:
            H.stop_clean(C, srv)
        srv = H.Server(C, binary, t0)
        try:
            test_prime_rl_no_root(C, srv, t1)
        finally:
            H.stop_clean(C, srv)
        test_admin_allow(C, binary, t0)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
