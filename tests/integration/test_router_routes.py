#!/usr/bin/env python3
"""The routes routers and framework probes read (issue: a fleet behind sglang-router / vllm-router).

  - GET /get_load: SGLang's list shape [{rid, http_worker_ipc, dp_rank (null), num_reqs,
    num_waiting_reqs, num_tokens}] (sgl-project/sglang nightly API test test_api_get_load) for a
    client with a User-Agent or ?format=sglang; the routers' object {"load": n, ...} (sglang-router
    and vllm-router get_worker_load read data["load"] as an integer; their reqwest client sends no
    User-Agent) without one or with ?format=router / vllm; a bad format 400. A request a pause
    (mode keep) holds counts in load, num_reqs and num_waiting_reqs, 0 again after the resume;
    /pause with a query that lacks mode keeps its default.
  - GET /liveness (prime-rl src/prime_rl/inference/vllm/server.py at 559b447): 200 {"status": "ok"},
    also while generation is paused; a bad ?timeout 400.
  - GET /server_info: enable_memory_saver false by default, true with --enable-memory-saver (slime's
    sglang_engine.py _init_external asserts it equals its --offload-rollout).
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import os
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import test_http_basic as H  # noqa: E402

UA = {"User-Agent": "python-requests/2.32"}


def test_get_load(C, srv):
    r = H.get(srv, "/get_load", headers=UA)
    C.check(r.status == 200 and isinstance(r.json, list) and len(r.json) == 1, "get_load list: %r" % r)
    if r.status == 200 and isinstance(r.json, list) and r.json:
        e = r.json[0]
        C.check(e.get("rid", 1) is None and e.get("http_worker_ipc", 1) is None and e.get("dp_rank", 1) is None,
                "get_load list nulls: %r" % e)
        C.check(all(isinstance(e.get(k), int) and e[k] == 0 for k in ("num_reqs", "num_waiting_reqs", "num_tokens")),
                "get_load idle counts: %r" % e)
    r = H.get(srv, "/get_load?format=sglang")
    C.check(r.status == 200 and isinstance(r.json, list), "get_load ?format=sglang: %r" % r)
    for q in ("", "?format=router", "?format=vllm"):
        r = H.get(srv, "/get_load" + q)  # http.client sends no User-Agent, as reqwest
        C.check(r.status == 200 and isinstance(r.json, dict) and r.json.get("load") == 0,
                "get_load router shape %r: %r" % (q, r))
    r = H.get(srv, "/get_load?format=xml", headers=UA)
    H.error_ok(C, "get_load bad format", r, 400, "format")

    # a request held by a pause (mode keep: generation stops, nothing is dropped) is counted, and
    # the engine loop still answers /liveness meanwhile; after the resume it finishes and the load is 0
    r = H.post(srv, "/pause?mode=keep", {})
    C.check(r.status == 200, "pause keep: %r" % r)
    done = {}

    def gen():
        done["r"] = H.post(srv, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 16, "temperature": 0},
                           timeout=120)

    t = threading.Thread(target=gen)
    t.start()
    load, t0 = None, time.time()
    while time.time() - t0 < 30:
        r = H.get(srv, "/get_load")
        if r.status == 200 and isinstance(r.json, dict) and r.json.get("load", 0) >= 1:
            load = r.json
            break
        time.sleep(0.02)
    C.check(load is not None and load["load"] == 1 and load["num_reqs"] == 1 and load["num_waiting_reqs"] == 1,
            "get_load counts the request a pause holds: %r" % load)
    r = H.get(srv, "/get_load", headers=UA)
    C.check(r.status == 200 and r.json[0].get("num_reqs") == 1, "the SGLang shape counts it too: %r" % r)
    r = H.get(srv, "/liveness?timeout=10")
    C.check(r.status == 200 and r.json == {"status": "ok"}, "liveness while paused: %r" % r)
    r = H.post(srv, "/resume", {})
    C.check(r.status == 200, "resume: %r" % r)
    t.join(120)
    C.check(done.get("r") is not None and done["r"].status == 200, "the held request after resume: %r" % done.get("r"))
    r = H.get(srv, "/get_load")
    C.check(r.status == 200 and r.json.get("load") == 0 and r.json.get("num_reqs") == 0, "get_load after: %r" % r)
    # a query without mode keeps pause's default (mode "abort"), as a body without it does
    r = H.post(srv, "/pause?unrelated=1", {})
    C.check(r.status == 200, "pause with another query variable: %r" % r)
    H.post(srv, "/resume", {})


def test_liveness(C, srv):
    r = H.get(srv, "/liveness")
    C.check(r.status == 200 and r.json == {"status": "ok"}, "liveness: %r" % r)
    for bad in ("abc", "0", "1000", "5x"):
        r = H.get(srv, "/liveness?timeout=" + bad)
        H.error_ok(C, "liveness timeout=%s" % bad, r, 400, "timeout")


def test_memory_saver(C, binary, model, srv):
    for path in ("/server_info", "/get_server_info"):
        r = H.get(srv, path)
        C.check(r.status == 200 and r.json.get("enable_memory_saver") is False, "%s default: %r" % (path, r))
    s2 = H.Server(C, binary, model, ["--enable-memory-saver"])
    try:
        r = H.get(s2, "/server_info")
        C.check(r.status == 200 and r.json.get("enable_memory_saver") is True, "--enable-memory-saver: %r" % r)
    finally:
        H.stop_clean(C, s2)


def main():
    C = H.Checker("router_routes")
    binary = H.gs_bin(C)
    tmp = H.scratch("router_routes")
    model = H.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = H.Server(C, binary, model, ["--max-model-len", "512"])
    try:
        test_liveness(C, srv)
        test_get_load(C, srv)
        test_memory_saver(C, binary, model, srv)
    finally:
        H.stop_clean(C, srv)
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
