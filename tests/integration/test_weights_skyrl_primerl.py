#!/usr/bin/env python3
"""SkyRL's and prime-rl's weight sync, replayed as their sources build the requests (CPU backend).

- SkyRL (NovaSky-AI/SkyRL@a956456 = a9564572eb8e91076be43c1bd5e4615e3de17265;
  skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py, new_inference_worker_wrap.py,
  vllm_server_actor.py, weight_sync/broadcast_strategy.py, delta_strategy.py):
  GET /get_world_size (a JSON body {} on a GET, as _call_all_servers sends it);
  POST /init_weight_transfer_engine {"init_info": BroadcastInitInfo.to_api_payload()} -> 501 before
  any network I/O (a fake TCPStore sees no connection); /pause?mode=keep&clear_cache=false;
  /reset_prefix_cache {"reset_running_requests": true}; /collective_rpc {"method":
  "skyrl_start_weight_update", "kwargs": {"is_checkpoint_format": true}} -> {"results": [null]} and a
  session; {"method": "update_weights_nccl", "kwargs": {"update_info": {names, dtype_names, shapes,
  "packed": true}}} -> the engine checks the names, then 501, and the session is aborted (SkyRL never
  calls finish after a failed update): weights unchanged; update_weights_ipc (sizes,
  ipc_handles_pickled) -> 501; skyrl_sleep/wake_for_weight_sync -> 501; /fetch_weights (delta) ->
  501; bad bodies -> 400 naming the field (kwargs.update_info.names, ...), weights unchanged.
  The working CPU path: start / finish over /collective_rpc around native HTTP buckets of T1 equals
  a cold start on T1 (checksums, greedy output), also after SkyRL's colocated order
  /sleep?level=2, /wake_up?tags=weights, sync, /wake_up?tags=kv_cache.
- prime-rl (PrimeIntellect-ai/prime-rl@559b447 = 559b44772e471d1538537b8805cc77f3824a5e64;
  src/prime_rl/utils/client.py init_nccl_broadcast / init_nixl_broadcast / update_weights,
  src/prime_rl/inference/vllm/server.py, worker/nccl.py, packages/prime-rl-configs/.../orchestrator.py
  NCCLWeightBroadcastConfig defaults): POST /init_broadcaster {"host": "localhost", "port",
  "rank_offset": 0, "inference_world_size": 1, "timeout": 1200, "quantize_in_weight_transfer": false}
  (and NIXL's with "session_id") -> 501 before any network I/O; bad bodies 400 naming the field
  (quantize_in_weight_transfer true is refused: kernel-format FP8); afterwards /update_weights
  {"weight_dir"} is still the filesystem mode: /pause?mode=keep, /update_weights, /resume equals a
  cold start on T1.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import base64
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tcpstore_fake as F  # noqa: E402
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

NEEDS = "need the CUDA backend"


def sums(srv):
    return W.checksums(srv, "target")


def baseline(C, srv, what):
    s = sums(srv)
    C.check(bool(s) and "_error" not in s, "%s: checksums before: %r" % (what, s))
    return s


def state(srv):
    return H.get(srv, "/v1/weights").json["state"]


def is_501(C, what, r, needle=NEEDS):
    e = (r.json or {}).get("error") if isinstance(r.json, dict) else None
    C.check(r.status == 501 and isinstance(e, dict) and needle in (e.get("message") or ""),
            "%s: expected 501 naming %r, got %r" % (what, needle, r))


def rpc(srv, method, kwargs=None, **extra):
    body = {"method": method}
    if kwargs is not None:
        body["kwargs"] = kwargs
    body.update(extra)
    return H.post(srv, "/collective_rpc", body)


def results_ok(C, what, r):
    return C.check(r.status == 200 and r.json == {"results": [None]}, "%s: %r" % (what, r))


def metadata(tensors):
    """SkyRL's weight_metadata (weight_extractor.get_weight_metadata): names, dtype_names, shapes."""
    names = sorted(tensors)
    dt = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    return {"names": names, "dtype_names": [dt[tensors[n].dtype] for n in names],
            "shapes": [list(tensors[n].shape) for n in names]}


def push_buckets(C, srv, what, tensors):
    names = sorted(tensors)
    for i in range(0, len(names), 8):
        r = W.post_bucket(srv, W.st_encode([tensors[n] for n in names[i:i + 8]]))
        if not C.check(r.status == 200, "%s: bucket %d: %r" % (what, i // 8, r)):
            return False
    return True


def test_skyrl_refused(C, srv, t1):
    before = baseline(C, srv, "SkyRL")
    r = H.request(srv, "GET", "/get_world_size", {})
    C.check(r.status == 200 and r.json.get("world_size") == 1, "SkyRL GET /get_world_size with {}: %r" % r)
    st = F.FakeStore()
    try:
        init = {"init_info": {"master_address": "127.0.0.1", "master_port": st.port, "rank_offset": 1,
                              "world_size": 2}}
        is_501(C, "SkyRL /init_weight_transfer_engine", H.post(srv, "/init_weight_transfer_engine", init))
        C.check(st.accepted == 0, "the CPU backend connected to the trainer's store (%d)" % st.accepted)
    finally:
        st.close()
    r = H.post(srv, "/pause?mode=keep&clear_cache=false", None)
    C.check(r.status == 200, "SkyRL /pause: %r" % r)
    r = H.post(srv, "/reset_prefix_cache", {"reset_running_requests": True})
    C.check(r.status == 200, "SkyRL /reset_prefix_cache: %r" % r)

    ui = dict(metadata(W.ckpt(t1)), packed=True)
    # broadcast strategy: start, update_weights_nccl (501 on the CPU backend), and no finish
    results_ok(C, "skyrl_start_weight_update", rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": True}))
    C.check(state(srv) == "updating", "start opened a session")
    is_501(C, "update_weights_nccl", rpc(srv, "update_weights_nccl", {"update_info": ui}))
    C.check(state(srv) == "ready", "the failed update aborted the session: %s" % state(srv))
    # a name the model lacks: the engine refuses it (400 naming it) before the 501
    results_ok(C, "start (2)", rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": True}))
    bad = dict(ui, names=ui["names"][:-1] + ["model.layers.9.mlp.up_proj.weight"])
    r = rpc(srv, "update_weights_nccl", {"update_info": bad})
    C.check(r.status == 400 and "model.layers.9.mlp.up_proj.weight" in r.raw.decode(), "unknown tensor: %r" % r)
    C.check(state(srv) == "ready", "the refused update aborted the session: %s" % state(srv))
    # bodies refused on the handler (each also aborts the session start opened)
    one = {"names": ["model.norm.weight"], "dtype_names": ["bfloat16"], "shapes": [ui["shapes"][ui["names"].index(
        "model.norm.weight")]]}
    for kw, field in [({}, "kwargs.update_info"),
                      ({"update_info": []}, "kwargs.update_info"),
                      ({"update_info": dict(one, names=[])}, "kwargs.update_info.names"),
                      ({"update_info": dict(one, names=[7])}, "kwargs.update_info.names"),
                      ({"update_info": dict(one, dtype_names=["int4"])}, "kwargs.update_info.dtype_names"),
                      ({"update_info": dict(one, shapes=[[-1]])}, "kwargs.update_info.shapes"),
                      ({"update_info": dict(one, packed="yes")}, "kwargs.update_info.packed"),
                      ({"update_info": dict(one, packed_buffer_size_bytes=0)},
                       "kwargs.update_info.packed_buffer_size_bytes"),
                      ({"update_info": dict(one, packed_num_buffers="x")}, "kwargs.update_info.packed_num_buffers")]:
        rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": True})
        H.error_ok(C, "update_weights_nccl %s" % json.dumps(kw)[:80], rpc(srv, "update_weights_nccl", kw), 400, field)
        C.check(state(srv) == "ready", "a refused body aborted the session (%s)" % field)
    # CUDA IPC chunks (update_weights_ipc): validated, then 501
    ipc = dict(one, sizes=[one["shapes"][0][0]], ipc_handles_pickled=base64.b64encode(b"\x80\x04}\x94.").decode())
    rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": True})
    is_501(C, "update_weights_ipc", rpc(srv, "update_weights_ipc", {"update_info": ipc}))
    C.check(state(srv) == "ready", "the 501 aborted the session")
    for kw, field in [({"update_info": dict(ipc, sizes=[1])}, "kwargs.update_info.sizes"),
                      ({"update_info": dict(ipc, sizes=None)}, "kwargs.update_info.sizes"),
                      ({"update_info": dict(ipc, ipc_handles_pickled="!!")}, "kwargs.update_info.ipc_handles_pickled"),
                      ({"update_info": dict(ipc, ipc_handles_pickled=None)},
                       "kwargs.update_info.ipc_handles_pickled")]:
        H.error_ok(C, "update_weights_ipc %s" % json.dumps(kw)[:80], rpc(srv, "update_weights_ipc", kw), 400, field)
    # the rest of /collective_rpc
    H.error_ok(C, "start kernel format", rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": False}), 400,
               "kwargs.is_checkpoint_format")
    H.error_ok(C, "start is_checkpoint_format 1", rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": 1}),
               400, "kwargs.is_checkpoint_format")
    H.error_ok(C, "no method", H.post(srv, "/collective_rpc", {"kwargs": {}}), 400, "method")
    H.error_ok(C, "another method", rpc(srv, "load_model"), 400, "method")
    H.error_ok(C, "positional args", rpc(srv, "skyrl_finish_weight_update", None, args=["x"]), 400, "args")
    H.error_ok(C, "kwargs a list", rpc(srv, "skyrl_finish_weight_update", []), 400, "kwargs")
    H.error_ok(C, "timeout -1", rpc(srv, "skyrl_finish_weight_update", None, timeout=-1), 400, "timeout")
    r = rpc(srv, "skyrl_finish_weight_update")
    C.check(r.status == 409, "finish without a session: %r" % r)
    is_501(C, "skyrl_sleep_for_weight_sync", rpc(srv, "skyrl_sleep_for_weight_sync", {"offload_kv": True}),
           "offload")
    H.error_ok(C, "sleep_for_weight_sync offload_kv 1", rpc(srv, "skyrl_sleep_for_weight_sync", {"offload_kv": 1}),
               400, "kwargs.offload_kv")
    is_501(C, "skyrl_wake_for_weight_sync", rpc(srv, "skyrl_wake_for_weight_sync", {"tags": ["weights"]}), "offload")
    H.error_ok(C, "wake_for_weight_sync tags", rpc(srv, "skyrl_wake_for_weight_sync", {"tags": ["x"]}), 400,
               "kwargs.tags")
    # delta sync: DeltaWeightTransferSender._apply_receiver_update -> fetch_weights
    is_501(C, "/fetch_weights", H.post(srv, "/fetch_weights", {"target_version": 3, "sync_dir": "/tmp/sync"}),
           "checkpoint-delta")
    H.error_ok(C, "fetch_weights {}", H.post(srv, "/fetch_weights", {}), 400, "target_version")
    H.error_ok(C, "fetch_weights version x", H.post(srv, "/fetch_weights", {"target_version": "x"}), 400,
               "target_version")
    H.error_ok(C, "fetch_weights uri 5", H.post(srv, "/fetch_weights", {"target_version": 1, "uri": 5}), 400, "uri")
    r = H.post(srv, "/resume", None)
    C.check(r.status == 200, "SkyRL /resume: %r" % r)
    C.check(sums(srv) == before and state(srv) == "ready", "SkyRL's refused calls changed the weights")


def test_skyrl_session(C, srv, t0, t1, cold1):
    """start / finish over /collective_rpc bracket a real full session (here fed by native HTTP
    buckets, the transport that works on the CPU backend)."""
    tens = W.ckpt(t1)
    results_ok(C, "start", rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": True}))
    push_buckets(C, srv, "SkyRL session", tens)
    results_ok(C, "finish", rpc(srv, "skyrl_finish_weight_update"))
    W.same(C, "start / HTTP buckets / finish vs cold T1", W.snap(srv, draft=False), cold1)
    # a full session: a missing tensor fails finish (coverage), weights inconsistent until repaired
    results_ok(C, "start (partial push)", rpc(srv, "skyrl_start_weight_update", {}))
    push_buckets(C, srv, "SkyRL partial push", {n: t for n, t in tens.items() if n != "model.norm.weight"})
    r = rpc(srv, "skyrl_finish_weight_update")
    C.check(r.status == 422 and "model.norm.weight" in r.raw.decode(), "finish without model.norm.weight: %r" % r)
    # SkyRL's colocated order: sleep level 2, wake the weights, sync, wake the KV cache
    r = H.post(srv, "/sleep?level=2", None)
    C.check(r.status == 200, "SkyRL /sleep?level=2: %r" % r)
    r = H.post(srv, "/wake_up?tags=weights", None)
    C.check(r.status == 200, "SkyRL /wake_up?tags=weights: %r" % r)
    results_ok(C, "start after sleep", rpc(srv, "skyrl_start_weight_update", {"is_checkpoint_format": True}))
    push_buckets(C, srv, "SkyRL after sleep", tens)
    results_ok(C, "finish after sleep", rpc(srv, "skyrl_finish_weight_update"))
    r = H.post(srv, "/wake_up?tags=kv_cache", None)
    C.check(r.status == 200 and r.json.get("is_sleeping") is False, "SkyRL /wake_up?tags=kv_cache: %r" % r)
    W.same(C, "sleep 2 / wake weights / sync / wake kv vs cold T1", W.snap(srv, draft=False), cold1)
    r = H.post(srv, "/v1/weights/load", {"path": t0})
    C.check(r.status == 200, "back to T0: %r" % r)


def test_primerl(C, srv, t1, cold1):
    before = baseline(C, srv, "prime-rl")
    st = F.FakeStore()
    try:
        # client.py init_nccl_broadcast with NCCLWeightBroadcastConfig's defaults (port: the store's)
        init = {"host": "localhost", "port": st.port, "rank_offset": 0, "inference_world_size": 1, "timeout": 1200,
                "quantize_in_weight_transfer": False}
        is_501(C, "prime-rl /init_broadcaster", H.post(srv, "/init_broadcaster", init))
        # init_nixl_broadcast's body (session_id) takes the same path
        is_501(C, "prime-rl /init_broadcaster (NIXL body)",
               H.post(srv, "/init_broadcaster", dict(init, session_id="default")))
        is_501(C, "prime-rl /init_broadcaster (2 servers, the second)",
               H.post(srv, "/init_broadcaster", dict(init, rank_offset=1, inference_world_size=2, port=str(st.port))))
        C.check(st.accepted == 0, "the CPU backend connected to the trainer's store (%d)" % st.accepted)
    finally:
        st.close()
    drop = lambda k: {x: v for x, v in init.items() if x != k}  # noqa: E731
    for body, field in [(drop("host"), "host"), (dict(init, host=""), "host"), (dict(init, host=5), "host"),
                        (drop("port"), "port"), (dict(init, port="x"), "port"), (dict(init, port=0), "port"),
                        (dict(init, port=70000), "port"), (drop("rank_offset"), "rank_offset"),
                        (dict(init, rank_offset=-1), "rank_offset"), (dict(init, rank_offset=1), "rank_offset"),
                        (dict(init, rank_offset=1.5), "rank_offset"),
                        (drop("inference_world_size"), "inference_world_size"),
                        (dict(init, inference_world_size=0), "inference_world_size"),
                        (dict(init, timeout=0), "timeout"), (dict(init, timeout="soon"), "timeout"),
                        (dict(init, quantize_in_weight_transfer=True), "quantize_in_weight_transfer"),
                        (dict(init, quantize_in_weight_transfer="no"), "quantize_in_weight_transfer"),
                        (dict(init, session_id=5), "session_id")]:
        H.error_ok(C, "init_broadcaster %s" % json.dumps(body)[:90], H.post(srv, "/init_broadcaster", body), 400,
                   field)
    C.check(sums(srv) == before and state(srv) == "ready", "refused /init_broadcaster calls changed the weights")
    # no broadcaster group: /update_weights {"weight_dir"} is the filesystem mode (client.py update_weights)
    r = H.post(srv, "/pause?mode=keep&clear_cache=false", None)
    C.check(r.status == 200, "prime-rl /pause: %r" % r)
    r = H.post(srv, "/update_weights", {"weight_dir": t1})
    C.check(r.status == 200 and r.json == {"status": "ok"}, "prime-rl /update_weights: %r" % r)
    r = H.post(srv, "/resume", None)
    C.check(r.status == 200, "prime-rl /resume: %r" % r)
    W.same(C, "prime-rl filesystem update vs cold T1", W.snap(srv, draft=False), cold1)


def main():
    C = H.Checker("weights_skyrl_primerl")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_skyrl_primerl")
    extra = ["--layers", "2"]
    t0 = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=extra + ["--seed", "31"])
    t1 = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=extra + ["--seed", "32"])
    try:
        cold1 = W.cold_snap(C, binary, t1, args=[])
        C.check("_error" not in cold1["target"] and all(g[0] != "error" for g in cold1["gen"]),
                "cold start on T1: %r" % (cold1["gen"],))
        srv = H.Server(C, binary, t0, ["--weights-root", tmp])
        try:
            test_skyrl_refused(C, srv, t1)
            test_skyrl_session(C, srv, t0, t1, cold1)
            test_primerl(C, srv, t1, cold1)
            H.healthy(C, srv, "skyrl / prime-rl")
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
