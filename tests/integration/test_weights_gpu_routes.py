#!/usr/bin/env python3
"""The GPU weight-transport routes on the CPU backend: what can be checked without a GPU.

NCCL (vLLM /init_weight_transfer_engine + /update_weights, SGLang /init_weights_update_group +
/update_weights_from_distributed + /destroy_weights_update_group) and CUDA IPC (/v1/weights/ipc/open,
/v1/weights/ipc/bucket) need the CUDA backend. On the CPU backend:
- a malformed body -> 400 naming the field (init_info.world_size, update_info.names, offsets, ...);
- a well-formed init / destroy / SGLang update -> 501 with the documented message ("need the CUDA
  backend"); SGLang routes answer {"success": false, "message"};
- without nccl_unique_id_b64 the init routes take the id from the trainer's TCPStore at
  master_address:master_port (vLLM: rendezvous at init; SGLang: join at init, fetch at the first
  update): master_address / master_port (SGLang: group_name) are then required (400), and on the
  CPU backend the 501 comes before any network I/O: a fake TCPStore (tcpstore_fake.py) the bodies
  point at sees no connection;
- /update_weights and /v1/weights/ipc/bucket run the engine's checks first: without a session 409;
  in a session, a name / shape / dtype the model does not have -> 400 naming the tensor; a good
  bucket -> 501; nothing is written (an abort afterwards leaves "ready", checksums unchanged).
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

NEEDS = "need the CUDA backend"
UID = base64.b64encode(bytes(range(128))).decode()
HANDLE = base64.b64encode(bytes(64)).decode()


def is_501(C, what, r, sglang=False):
    ok = C.check(r.status == 501, "%s: expected 501, got %r" % (what, r))
    j = r.json if isinstance(r.json, dict) else {}
    msg = j.get("message") if sglang else (j.get("error") or {}).get("message")
    if sglang:
        ok &= C.check(j.get("success") is False, "%s: SGLang body lacks success=false: %r" % (what, j))
    ok &= C.check(isinstance(msg, str) and NEEDS in msg, "%s: message does not say %r: %r" % (what, NEEDS, j))
    return ok


def test_init(C, srv):
    init = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2,
            "nccl_unique_id_b64": UID}
    bad = [
        ({}, "init_info"),
        ({"init_info": 3}, "init_info"),
        ({"init_info": dict(init, world_size=None)}, "init_info.world_size"),
        ({"init_info": dict(init, world_size=1)}, "init_info.world_size"),
        ({"init_info": dict(init, rank_offset=0)}, "init_info.rank_offset"),
        ({"init_info": dict(init, rank_offset=2)}, "init_info.rank_offset"),
        ({"init_info": dict(init, master_port="http")}, "init_info.master_port"),
        ({"init_info": dict(init, master_address=5)}, "init_info.master_address"),
        ({"init_info": {k: v for k, v in init.items() if k not in ("nccl_unique_id_b64", "master_address")}},
         "init_info.master_address"),
        ({"init_info": {k: v for k, v in init.items() if k not in ("nccl_unique_id_b64", "master_port")}},
         "init_info.master_port"),
        ({"init_info": dict(init, nccl_unique_id_b64=None, master_port="29500x")}, "init_info.master_port"),
        ({"init_info": dict(init, nccl_unique_id_b64=None, master_port=0)}, "init_info.master_port"),
        ({"init_info": dict(init, nccl_unique_id_b64="AAAA")}, "init_info.nccl_unique_id_b64"),
        ({"init_info": dict(init, nccl_unique_id_b64="!!")}, "init_info.nccl_unique_id_b64"),
    ]
    for body, field in bad:
        H.error_ok(C, "init_weight_transfer_engine %s" % json.dumps(body)[:80], H.post(srv, "/init_weight_transfer_engine", body),
                   400, field)
    is_501(C, "init_weight_transfer_engine", H.post(srv, "/init_weight_transfer_engine", {"init_info": init}))
    # master_port as a string is accepted (SGLang callers send either)
    is_501(C, "init_weight_transfer_engine (port string)",
           H.post(srv, "/init_weight_transfer_engine", {"init_info": dict(init, master_port="29500")}))

    sg = dict(init, group_name="weight_update_group", backend="nccl")
    H.error_ok(C, "init_weights_update_group backend gloo",
               H.post(srv, "/init_weights_update_group", dict(sg, backend="gloo")), 400, "backend")
    r = H.post(srv, "/init_weights_update_group", {k: v for k, v in sg.items() if k not in ("nccl_unique_id_b64", "group_name")})
    H.error_ok(C, "init_weights_update_group without an id nor group_name", r, 400, "group_name")
    r = H.post(srv, "/init_weights_update_group", {k: v for k, v in sg.items() if k not in ("nccl_unique_id_b64", "master_address")})
    if H.error_ok(C, "init_weights_update_group without an id nor master_address", r, 400, "master_address"):
        C.check("TCPStore" in r.json["error"]["message"], "the message explains the rendezvous: %r" % r.json)
    H.error_ok(C, "init_weights_update_group world_size", H.post(srv, "/init_weights_update_group", dict(sg, world_size="x")),
               400, "world_size")
    is_501(C, "init_weights_update_group", H.post(srv, "/init_weights_update_group", sg), sglang=True)
    is_501(C, "destroy_weights_update_group", H.post(srv, "/destroy_weights_update_group", {"group_name": "g"}), sglang=True)

    # the frameworks' own bodies (no nccl_unique_id_b64): the rendezvous would run, but on the CPU
    # backend the 501 comes first; the trainer's (fake) TCPStore sees no connection
    st = F.FakeStore()
    try:
        vi = {"master_address": "127.0.0.1", "rank_offset": 1, "world_size": 2, "timeout_s": 2}
        for port in (st.port, str(st.port)):
            is_501(C, "init_weight_transfer_engine via TCPStore (port %r)" % (port,),
                   H.post(srv, "/init_weight_transfer_engine", {"init_info": dict(vi, master_port=port)}))
        sgs = dict(vi, master_port=st.port, group_name="weight_update_group", backend="nccl")
        is_501(C, "init_weights_update_group via TCPStore", H.post(srv, "/init_weights_update_group", sgs), sglang=True)
        H.error_ok(C, "init_weights_update_group via TCPStore, bad group_name",
                   H.post(srv, "/init_weights_update_group", dict(sgs, group_name="g\n")), 400, "group_name")
        C.check(st.accepted == 0, "the CPU backend connected to the trainer's store (%d connections)" % st.accepted)
    finally:
        st.close()


def test_update(C, srv, hidden):
    good = {"names": ["model.norm.weight"], "dtype_names": ["bfloat16"], "shapes": [[hidden]]}
    bad = [
        ({}, "update_info"),
        ({"update_info": []}, "update_info"),
        ({"update_info": dict(good, names=[])}, "update_info.names"),
        ({"update_info": dict(good, names=[7])}, "update_info.names"),
        ({"update_info": dict(good, names=["a", "a"], dtype_names=["bfloat16"] * 2, shapes=[[1]] * 2)}, "update_info.names"),
        ({"update_info": dict(good, dtype_names=[])}, "update_info.dtype_names"),
        ({"update_info": dict(good, dtype_names=["int4"])}, "update_info.dtype_names"),
        ({"update_info": dict(good, shapes=[[-1]])}, "update_info.shapes"),
        ({"update_info": dict(good, shapes=[[1.5]])}, "update_info.shapes"),
        ({"update_info": dict(good, shapes=[5])}, "update_info.shapes"),
        ({"update_info": {"names": good["names"], "shapes": good["shapes"]}}, "update_info.dtype_names"),
        # vLLM's packed framing fields (NCCLWeightTransferUpdateInfo)
        ({"update_info": dict(good, packed="yes")}, "update_info.packed"),
        ({"update_info": dict(good, packed=True, packed_buffer_size_bytes=0)}, "update_info.packed_buffer_size_bytes"),
        ({"update_info": dict(good, packed=True, packed_num_buffers="two")}, "update_info.packed_num_buffers"),
    ]
    for body, field in bad:
        H.error_ok(C, "update_weights %s" % json.dumps(body)[:90], H.post(srv, "/update_weights", body), 400, field)
    r = H.post(srv, "/update_weights", {"update_info": good})
    H.error_ok(C, "update_weights without a session", r, 409)

    before = H.get(srv, "/v1/weights/checksums").json
    r = H.post(srv, "/start_weight_update", {"mode": "partial"})
    C.check(r.status == 200, "start_weight_update: %r" % r)
    model_bad = [
        (dict(good, names=["model.nope.weight"]), "model.nope.weight"),
        (dict(good, shapes=[[hidden + 1]]), "shape"),
        (dict(good, dtype_names=["I32"]), "dtype"),
        (dict(good, names=["model.norm.weight", "x.y"], dtype_names=["float32", "float16"], shapes=[[hidden], [2]]), "x.y"),
    ]
    for ui, word in model_bad:
        H.error_ok(C, "update_weights (model check) %s" % json.dumps(ui)[:90], H.post(srv, "/update_weights", {"update_info": ui}),
                   400, word)
    is_501(C, "update_weights (good bucket)", H.post(srv, "/update_weights", {"update_info": good}))
    for dt in ("torch.bfloat16", "float32", "F16", "half"):
        is_501(C, "update_weights dtype %s" % dt, H.post(srv, "/update_weights", {"update_info": dict(good, dtype_names=[dt])}))
    is_501(C, "update_weights packed", H.post(srv, "/update_weights", {"update_info": dict(
        good, packed=True, packed_buffer_size_bytes=1 << 20, packed_num_buffers=2)}))

    # IPC in the same session
    H.error_ok(C, "ipc/open bad handle", H.post(srv, "/v1/weights/ipc/open", {"handle_b64": "AAAA", "bytes": 10}), 400, "handle_b64")
    H.error_ok(C, "ipc/open no bytes", H.post(srv, "/v1/weights/ipc/open", {"handle_b64": HANDLE}), 400, "bytes")
    H.error_ok(C, "ipc/open offset", H.post(srv, "/v1/weights/ipc/open", {"handle_b64": HANDLE, "bytes": 10, "offset": 3}),
               400, "offset")
    is_501(C, "ipc/open (in a session)", H.post(srv, "/v1/weights/ipc/open", {"handle_b64": HANDLE, "bytes": 1 << 20}))
    ib = {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[hidden]], "offsets": [0]}
    ipc_bad = [
        ({k: v for k, v in ib.items() if k != "offsets"}, "offsets"),
        (dict(ib, offsets=[1]), "offsets"),
        (dict(ib, offsets=[-2]), "offsets"),
        (dict(ib, names=["model.norm.weight", "model.layers.0.input_layernorm.weight"], dtypes=["bfloat16"] * 2,
              shapes=[[hidden]] * 2, offsets=[0, 2]), "overlap"),
        (dict(ib, dtypes=["x"]), "dtypes"),
    ]
    for body, word in ipc_bad:
        H.error_ok(C, "ipc/bucket %s" % json.dumps(body)[:90], H.post(srv, "/v1/weights/ipc/bucket", body), 400, word)
    H.error_ok(C, "ipc/bucket unknown tensor", H.post(srv, "/v1/weights/ipc/bucket", dict(ib, names=["zz"])), 400, "zz")
    is_501(C, "ipc/bucket (good)", H.post(srv, "/v1/weights/ipc/bucket", ib))

    r = H.post(srv, "/v1/weights/abort", {})
    C.check(r.status == 200 and r.json.get("state") == "ready", "abort after refused GPU buckets leaves ready: %r" % r)
    after = H.get(srv, "/v1/weights/checksums").json
    C.check(before and after and before.get("tensors") == after.get("tensors"), "nothing was written")

    # outside a session
    H.error_ok(C, "ipc/open outside a session", H.post(srv, "/v1/weights/ipc/open", {"handle_b64": HANDLE, "bytes": 64}), 409)
    H.error_ok(C, "ipc/bucket outside a session", H.post(srv, "/v1/weights/ipc/bucket", ib), 409)

    # SGLang one-shot update
    sg = {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[hidden]], "group_name": "g",
          "flush_cache": True, "weight_version": "v1"}
    H.error_ok(C, "update_weights_from_distributed no names",
               H.post(srv, "/update_weights_from_distributed", dict(sg, names=None)), 400, "names")
    H.error_ok(C, "update_weights_from_distributed bad dtypes",
               H.post(srv, "/update_weights_from_distributed", dict(sg, dtypes=["bf16", "bf16"])), 400, "dtypes")
    H.error_ok(C, "update_weights_from_distributed bad load_format",
               H.post(srv, "/update_weights_from_distributed", dict(sg, load_format="direct")), 400, "load_format")
    is_501(C, "update_weights_from_distributed", H.post(srv, "/update_weights_from_distributed", sg), sglang=True)
    is_501(C, "update_weights_from_distributed flattened_bucket",
           H.post(srv, "/update_weights_from_distributed", dict(sg, load_format="flattened_bucket")), sglang=True)
    w = H.get(srv, "/v1/weights").json
    C.check(w.get("state") == "ready" and not w.get("session_open"), "still ready: %r" % w)


def main():
    C = H.Checker("weights_gpu_routes")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_gpu_routes")
    model = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--layers", "2", "--seed", "21"])
    with open(os.path.join(model, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    try:
        srv = H.Server(C, binary, model)
        try:
            test_init(C, srv)
            test_update(C, srv, hidden)
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
