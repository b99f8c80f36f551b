#!/usr/bin/env python3
"""AReaL's vLLM backend weight sync, replayed as AReaL builds the requests.

Source: inclusionAI/AReaL@4aef98d8d818af55b43621aaadba047ae10f4e77
- areal/engine/vllm_remote.py VLLMBackend: build_disk_weight_update_requests -> POST
  /areal_update_weights {"model_path": str(meta.path)}; get_pause_request / get_resume_request ->
  POST /areal_pause_generation {} and /areal_continue_generation {}; build_init_weights_group_request
  -> POST /areal_init_weights_update_group {"master_address", "master_port": str(port), "rank_offset":
  1 + server_idx * tp * pp, "world_size": gen world + 1, "backend": "nccl", "group_name"};
  build_distributed_weight_update_requests -> POST /areal_set_update_weight_meta {"names", "dtypes"
  (str(t.dtype) without "torch."), "shapes", "group_name"} then POST /areal_update_weights_xccl {};
  build_generation_request -> /v1/completions (token prompt, return_tokens_as_token_ids, logprobs 0),
  parsed as parse_generation_response does ("token_id:N").
- areal/infra/remote_inf_engine.py + areal/infra/utils/http.py: aiohttp post(json=payload), only
  raise_for_status() is checked; areal/engine/fsdp_engine.py _update_weights_from_disk: pause ->
  update -> continue.
- areal/engine/vllm_ext/areal_vllm_server.py answers {"success", "message"} (to_json_response).
Here: the disk update (pause, update, continue) gives the checksums and greedy outputs of a cold
start on the new checkpoint; generation stays paused through the update until continue; the load is
confined to --weights-root (403 naming model_path; 403 without a root); bad bodies are 400 naming the
field and change nothing; pause aborts a running request (finish_reason "abort") and queues new ones
until continue; the NCCL routes validate their bodies (400 naming the field) and answer 501 ("need the
CUDA backend") on the CPU backend; the LoRA routes answer 501.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
from test_weights_dialects import NEEDS, baseline, sums  # noqa: E402

PROMPTS = [[5, 17, 300], [9, 2, 44, 61]]
GROUP = "update_weight_group"


def areal_completion(ids, max_tokens=12):
    """VLLMBackend.build_generation_request for a token prompt (greedy)."""
    return {"top_p": 1.0, "top_k": int(1e8), "max_tokens": max_tokens, "temperature": 0.0, "stop_token_ids": [],
            "ignore_eos": True, "skip_special_tokens": True, "return_tokens_as_token_ids": True, "logprobs": 0,
            "use_beam_search": False, "stream": False, "prompt": list(ids)}


def parse(r):
    """parse_generation_response: (tokens, logprobs, finish_reason) or the response when it failed."""
    if r.status != 200 or not isinstance(r.json, dict):
        return r
    c = r.json["choices"][0]
    return ([int(t.split(":")[1]) for t in c["logprobs"]["tokens"]], c["logprobs"]["token_logprobs"],
            c["finish_reason"])


def outputs(srv):
    return [parse(H.post(srv, "/v1/completions", areal_completion(ids))) for ids in PROMPTS]


def areal_ok(C, what, r):
    ok = r.status == 200 and isinstance(r.json, dict) and r.json.get("success") is True and \
        isinstance(r.json.get("message"), str)
    return C.check(ok, "%s: expected 200 {success: true, message}: %r" % (what, r))


def is_paused(srv):
    return H.get(srv, "/is_paused").json.get("is_paused")


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()), daemon=True)
    t.start()
    return t, out


def wait_running(srv, n, limit=20):
    t0 = time.time()
    while time.time() - t0 < limit:
        r = H.get(srv, "/v1/loads?include=core")
        if r.status == 200 and r.json["loads"][0]["num_running_reqs"] >= n:
            return True
        time.sleep(0.02)
    return False


def test_disk(C, srv, root, t0, t1, cold):
    before = baseline(C, srv, "AReaL disk")
    out0 = outputs(srv)
    v0 = H.get(srv, "/v1/weights").json["version_number"]
    # _update_weights_from_disk: pause_generation -> update_weights_from_disk -> continue_generation
    r = H.post(srv, "/areal_pause_generation", {})
    areal_ok(C, "/areal_pause_generation", r)
    C.check(is_paused(srv) is True, "paused after /areal_pause_generation")
    r = H.post(srv, "/areal_update_weights", {"model_path": t1})
    if areal_ok(C, "/areal_update_weights", r):
        C.check(r.json == {"success": True, "message": "TP rank: 0 success\n"}, "AReaL's answer: %r" % r)
    # AReaL holds /v1/completions until continue: the update leaves generation paused
    C.check(is_paused(srv) is True, "still paused after /areal_update_weights")
    t, held = in_thread(lambda: parse(H.post(srv, "/v1/completions", areal_completion(PROMPTS[0]))))
    time.sleep(0.5)
    C.check(t.is_alive(), "a completion ran before /areal_continue_generation: %r" % (held.get("r"),))
    areal_ok(C, "/areal_continue_generation", H.post(srv, "/areal_continue_generation", {}))
    t.join(120)
    C.check(held.get("r") == cold["out"][0], "the held completion after continue %r != cold start on T1 %r" %
            (held.get("r"), cold["out"][0]))
    C.check(is_paused(srv) is False, "not paused after /areal_continue_generation")
    w = H.get(srv, "/v1/weights").json
    C.check(w["state"] == "ready" and w["version_number"] == v0 + 1, "after the AReaL update: %r" % w)
    got = sums(srv)
    C.check(got == cold["sums"], "checksums after /areal_update_weights != a cold start on T1")
    C.check(got != before, "the AReaL update changed no weight")
    C.check(outputs(srv) == cold["out"], "outputs after /areal_update_weights != a cold start on T1")
    # == the native load of the same folder
    r = H.post(srv, "/v1/weights/load", {"path": t0})
    C.check(r.status == 200 and sums(srv) == before and outputs(srv) == out0, "native load of T0: %r" % r)
    r = H.post(srv, "/v1/weights/load", {"path": t1})
    C.check(r.status == 200 and sums(srv) == got, "native load of T1 == the AReaL load: %r" % r)
    # without a pause (and a relative path: under --weights-root); every body field AReaL's model has
    r = H.post(srv, "/areal_update_weights", {"model_path": os.path.relpath(t0, root), "load_format": "auto",
                                              "abort_all_requests": True})
    areal_ok(C, "/areal_update_weights relative, load_format auto", r)
    C.check(sums(srv) == before and is_paused(srv) is False, "relative model_path loads T0, not paused")
    # refused bodies change nothing
    for body, status, field in [({"model_path": "/"}, 403, "model_path"),
                                ({"model_path": os.path.join(root, "..")}, 403, "model_path"),
                                ({}, 400, "model_path"),
                                ({"model_path": None}, 400, "model_path"),
                                ({"model_path": 5}, 400, "model_path"),
                                ({"model_path": "nope"}, 400, "model_path"),
                                ({"model_path": t1, "load_format": "pt"}, 400, "load_format"),
                                ({"model_path": t1, "load_format": 3}, 400, "load_format"),
                                ({"model_path": t1, "abort_all_requests": "yes"}, 400, "abort_all_requests")]:
        H.error_ok(C, "/areal_update_weights %s" % json.dumps(body)[:80], H.post(srv, "/areal_update_weights", body),
                   status, field)
    H.error_ok(C, "/areal_update_weights not JSON", H.post(srv, "/areal_update_weights", "{"), 400)
    C.check(sums(srv) == before and H.get(srv, "/v1/weights").json["state"] == "ready" and is_paused(srv) is False,
            "refused AReaL updates changed nothing")


def test_pause(C, srv):
    # a running request is aborted by the pause (AReaL resubmits it), a new one waits for continue
    t, run = in_thread(lambda: H.post(srv, "/v1/completions", areal_completion(PROMPTS[1], 3500)))
    C.check(wait_running(srv, 1), "the long completion never ran")
    areal_ok(C, "/areal_pause_generation", H.post(srv, "/areal_pause_generation", {}))
    t.join(120)
    p = parse(run["r"]) if "r" in run else None
    C.check(isinstance(p, tuple) and p[2] == "abort" and len(p[0]) < 3500,
            "the running completion ends \"abort\" at the pause: %r" % (p,))
    t, held = in_thread(lambda: parse(H.post(srv, "/v1/completions", areal_completion(PROMPTS[0], 4))))
    time.sleep(0.5)
    C.check(t.is_alive(), "a completion ran while paused: %r" % (held.get("r"),))
    areal_ok(C, "/areal_pause_generation again", H.post(srv, "/areal_pause_generation", {}))
    areal_ok(C, "/areal_continue_generation", H.post(srv, "/areal_continue_generation", {}))
    t.join(120)
    q = held.get("r")
    C.check(isinstance(q, tuple) and q[2] == "length" and len(q[0]) == 4, "the held completion: %r" % (q,))
    areal_ok(C, "/areal_continue_generation when running", H.post(srv, "/areal_continue_generation", {}))
    H.error_ok(C, "/areal_pause_generation [1]", H.post(srv, "/areal_pause_generation", "[1]"), 400)


def is_501(C, what, r):
    j = r.json if isinstance(r.json, dict) else {}
    C.check(r.status == 501 and j.get("success") is False and NEEDS in (j.get("message") or ""),
            "%s: expected 501 {success: false, message: ...%s...}, got %r" % (what, NEEDS, r))


def test_nccl(C, srv, hidden):
    before = baseline(C, srv, "AReaL NCCL")
    # build_init_weights_group_request (server_idx 0, tp = pp = 1)
    init = {"master_address": "127.0.0.1", "master_port": "29513", "rank_offset": 1, "world_size": 2,
            "backend": "nccl", "group_name": GROUP}
    for body, field in [({k: v for k, v in init.items() if k != k0}, k0) for k0 in init] + [
            (dict(init, backend="hccl"), "backend"),
            (dict(init, master_port="x"), "master_port"),
            (dict(init, master_port="70000"), "master_port"),
            (dict(init, rank_offset=2), "rank_offset"),
            (dict(init, rank_offset=0), "rank_offset"),
            (dict(init, world_size=1), "world_size"),
            (dict(init, master_address=""), "master_address"),
            (dict(init, group_name=""), "group_name")]:
        H.error_ok(C, "/areal_init_weights_update_group %s" % json.dumps(body)[:90],
                   H.post(srv, "/areal_init_weights_update_group", body), 400, field)
    is_501(C, "/areal_init_weights_update_group", H.post(srv, "/areal_init_weights_update_group", init))
    is_501(C, "/areal_init_weights_update_group int port",
           H.post(srv, "/areal_init_weights_update_group", dict(init, master_port=29513)))
    # build_distributed_weight_update_requests: ParamSpec dtype is str(tensor.dtype) without "torch."
    meta = {"names": ["model.norm.weight", "model.layers.0.input_layernorm.weight"], "dtypes": ["bfloat16"] * 2,
            "shapes": [[hidden], [hidden]], "group_name": GROUP}
    for body, field in [({k: v for k, v in meta.items() if k != k0}, k0) for k0 in meta] + [
            (dict(meta, names=[]), "names"),
            (dict(meta, names=["model.norm.weight", 7]), "names"),
            (dict(meta, names=["model.norm.weight"] * 2), "names"),
            (dict(meta, dtypes=["bfloat16"]), "dtypes"),
            (dict(meta, dtypes=["bfloat16", "int4"]), "dtypes"),
            (dict(meta, shapes=[[hidden]]), "shapes"),
            (dict(meta, shapes=[[hidden], [-1]]), "shapes"),
            (dict(meta, shapes=[[hidden], [1.5]]), "shapes"),
            (dict(meta, shapes=[[hidden], hidden]), "shapes"),
            (dict(meta, group_name=5), "group_name"),
            (dict(meta, group_name=""), "group_name")]:
        H.error_ok(C, "/areal_set_update_weight_meta %s" % json.dumps(body)[:90],
                   H.post(srv, "/areal_set_update_weight_meta", body), 400, field)
    is_501(C, "/areal_set_update_weight_meta", H.post(srv, "/areal_set_update_weight_meta", meta))
    is_501(C, "/areal_set_update_weight_meta float32",
           H.post(srv, "/areal_set_update_weight_meta", dict(meta, dtypes=["float32", "float32"])))
    is_501(C, "/areal_update_weights_xccl", H.post(srv, "/areal_update_weights_xccl", {}))
    is_501(C, "/areal_update_weights_xccl no body", H.post(srv, "/areal_update_weights_xccl", None))
    H.error_ok(C, "/areal_update_weights_xccl [1]", H.post(srv, "/areal_update_weights_xccl", "[1]"), 400)
    # LoRA: graphswap serves no adapters
    for path in ("/areal_update_weights_lora", "/areal_set_update_weight_meta_lora", "/areal_update_weights_lora_xccl"):
        r = H.post(srv, path, {})
        C.check(r.status == 501 and isinstance(r.json, dict) and r.json.get("success") is False and
                "LoRA" in (r.json.get("message") or ""), "%s: %r" % (path, r))
    C.check(H.get(srv, "/areal_update_weights").status == 405, "GET /areal_update_weights is 405")
    C.check(sums(srv) == before and H.get(srv, "/v1/weights").json["state"] == "ready" and is_paused(srv) is False,
            "the NCCL routes changed nothing")


def main():
    C = H.Checker("weights_areal")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_areal")
    extra = ["--layers", "2"]
    t0 = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=extra + ["--seed", "41"])
    t1 = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=extra + ["--seed", "42"])
    with open(os.path.join(t0, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    try:
        srv = H.Server(C, binary, t1)  # the cold start the hot update must equal
        try:
            cold = {"sums": sums(srv), "out": outputs(srv)}
            C.check(all(isinstance(o, tuple) and len(o[0]) == 12 for o in cold["out"]), "cold outputs: %r" % cold)
        finally:
            H.stop_clean(C, srv)
        srv = H.Server(C, binary, t0, ["--weights-root", tmp])
        try:
            test_disk(C, srv, tmp, t0, t1, cold)
            test_pause(C, srv)
            test_nccl(C, srv, hidden)
        finally:
            H.stop_clean(C, srv)
        srv = H.Server(C, binary, t0)
        try:
            H.error_ok(C, "/areal_update_weights without --weights-root",
                       H.post(srv, "/areal_update_weights", {"model_path": t1}), 403, "model_path")
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
