#!/usr/bin/env python3
"""SGLang's POST /update_weights_from_tensor (server/dialects/sglang_tensor.c, server/rendezvous/torch_ipc.c)
as slime's colocated sync and verl's SGLang rollout send it, with CPU tensors shared through torch's
"file_system" strategy (the pickles of tests/integration/torch_pickle_fake.py: torch's opcodes, real
POSIX shared memory).

Body and answer: sgl-project/sglang 05bed317 managers/io_struct.py UpdateWeightsFromTensorReqInput
{serialized_named_tensors, load_format, flush_cache, abort_all_requests, weight_version},
entrypoints/http_server.py update_weights_from_tensor -> {"success", "message"}; slime
(THUDM/slime 624b824a backends/megatron_utils/update_weight/update_weight_from_tensor.py) sends
load_format "flattened_bucket" with flush_cache false between /pause_generation and
/continue_generation.

- A whole checkpoint pushed as (name, tensor) lists in shuffled buckets: checkpoint checksums and
  greedy tokens equal a cold start of it; the version is weight_version; one hook per call.
- The same as flattened buckets (one flat storage per bucket), slime's way, inside a pause that stays
  in force until /continue_generation.
- A tensor at an offset in a larger storage, and two tensors of one storage.
- Refused, each leaving the weights unchanged: not base64, not a pickle, a global other than torch's
  (os.system), a truncated pickle, the file_descriptor strategy (501), a CUDA tensor (501), a missing
  or too small shared-memory object, a non-contiguous tensor, a tensor outside its storage, an
  unknown name, a wrong shape, a bad load_format, a flattened bucket whose range overruns.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import base64
import os
import random
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402
import torch_pickle_fake as F  # noqa: E402

ROUTE = "/update_weights_from_tensor"
STORAGES = []


def storage(data, **kw):
    s = F.Storage(data, **kw)
    STORAGES.append(s)
    return s


def tensor_of(raw):
    """A shared CPU tensor holding a checkpoint tensor's bytes."""
    return F.Tensor(storage(raw.data), F.ST2TORCH[raw.dtype], raw.shape)


def body(obj, **kw):
    b = {"serialized_named_tensors": [base64.b64encode(F.dumps(obj)).decode()]}
    b.update(kw)
    return b


def ckpt_sums(srv):
    r = H.get(srv, "/v1/weights/checksums?names=checkpoint")
    return r.json["tensors"] if r.status == 200 else {"_error": repr(r)}


def ok(C, what, r):
    return C.check(r.status == 200 and r.json.get("success") is True, "%s: %r" % (what, r))


def buckets_of(names, rng, k=4):
    names = list(names)
    rng.shuffle(names)
    return [names[i:i + k] for i in range(0, len(names), k)]


def test_named_lists(C, srv, ck, cold1, rng):
    T1 = W.ckpt(ck["T1"])
    h0 = W.hooks(srv)
    bs = buckets_of(T1, rng)
    for i, b in enumerate(bs):
        r = H.post(srv, ROUTE, body([(n, tensor_of(T1[n])) for n in b], flush_cache=True, weight_version="t-1"))
        ok(C, "named-list bucket %d of %d" % (i + 1, len(bs)), r)
    W.check_hooks(C, "named lists", h0, W.hooks(srv), len(bs), 0)
    C.check(H.get(srv, "/get_weight_version").json["weight_version"] == "t-1", "weight_version not applied")
    W.same(C, "after the named-list updates", W.snap(srv, draft=False), cold1, version="t-1")


def test_flattened(C, srv, ck, cold0, rng):
    T0 = W.ckpt(ck["T0"])
    r = H.post(srv, "/pause_generation", {"mode": "abort"})
    C.check(r.status == 200, "pause_generation: %r" % r)
    for i, b in enumerate(buckets_of(T0, rng, 5)):
        dt = {T0[n].dtype for n in b}
        C.check(len(dt) == 1, "bucket mixes dtypes %r" % dt)
        flat, md, off = b"", [], 0
        for n in b:
            t = T0[n]
            ne = t.numel()
            md.append(F.FlattenedTensorMetadata(n, F.Size(t.shape), getattr(F.torch, F.ST2TORCH[t.dtype]), off,
                                                off + ne, ne))
            flat += t.data
            off += ne
        ft = F.Tensor(storage(flat), F.ST2TORCH[T0[b[0]].dtype], (off,))
        r = H.post(srv, ROUTE, body({"flattened_tensor": ft, "metadata": md}, load_format="flattened_bucket",
                                    flush_cache=False, weight_version="t-2"))
        ok(C, "flattened bucket %d" % i, r)
        C.check(H.get(srv, "/is_paused").json.get("is_paused") is True, "the update ended the pause")
    r = H.post(srv, "/continue_generation", {})
    C.check(r.status == 200, "continue_generation: %r" % r)
    W.same(C, "after the flattened buckets", W.snap(srv, draft=False), cold0, version="t-2")


def test_views(C, srv, ck):
    """A tensor at an offset of a larger storage; two tensors sharing one storage."""
    T0 = W.ckpt(ck["T0"])
    a, b = "model.norm.weight", "model.layers.0.input_layernorm.weight"
    ta, tb = T0[a], T0[b]
    es = F.ESIZE[F.ST2TORCH[ta.dtype]]
    pad = b"\x7f" * (3 * es)
    st = storage(pad + ta.data + tb.data + pad)
    before = ckpt_sums(srv)
    r = H.post(srv, ROUTE, body([(a, F.Tensor(st, F.ST2TORCH[ta.dtype], ta.shape, offset=3)),
                                 (b, F.Tensor(st, F.ST2TORCH[tb.dtype], tb.shape, offset=3 + ta.numel()))]))
    ok(C, "views of one storage", r)
    C.check(ckpt_sums(srv) == before, "writing the same values through views changed checksums")


def refused(C, srv, what, b, status, word):
    before = ckpt_sums(srv)
    r = H.post(srv, ROUTE, b)
    msg = (r.json or {}).get("message", "") if isinstance(r.json, dict) else ""
    C.check(r.status == status and isinstance(r.json, dict) and r.json.get("success") is False and word in msg,
            "%s: expected %d naming %r, got %r" % (what, status, word, r))
    C.check(ckpt_sums(srv) == before, "%s changed the weights" % what)


def test_refused(C, srv, ck):
    T0 = W.ckpt(ck["T0"])
    n = "model.norm.weight"
    t = T0[n]
    good = tensor_of(t)
    dt = F.ST2TORCH[t.dtype]
    refused(C, srv, "not base64", {"serialized_named_tensors": ["***"]}, 400, "base64")
    refused(C, srv, "no payload", {"serialized_named_tensors": []}, 400, "serialized_named_tensors")
    refused(C, srv, "not a pickle", {"serialized_named_tensors": [base64.b64encode(b"hello").decode()]}, 400,
            "pickle")
    raw = F.dumps([(n, good)])
    refused(C, srv, "truncated", {"serialized_named_tensors": [base64.b64encode(raw[:-7]).decode()]}, 400,
            "FRAME longer than the data")
    refused(C, srv, "os.system", body([(n, F.Raw(os.system, ("true",)))]), 400, "not a tensor")
    refused(C, srv, "file_descriptor strategy",
            body([(n, F.Raw(F.red.rebuild_tensor, (F.TensorCls, F.TypedStorage(F.Raw(F.red.rebuild_storage_fd, (
                F.UntypedStorage, 5, len(t.data))), dt), (0, F.Size(t.shape), (1,), False))))]), 501, "file_system")
    refused(C, srv, "CUDA tensor", body([(n, F.cuda_tensor(t.shape, dt))]), 501, "CUDA")
    gone = storage(t.data)
    gone.unlink()
    refused(C, srv, "missing shared memory", body([(n, F.Tensor(gone, dt, t.shape))]), 400, "shared memory")
    small = storage(t.data[:-2])
    small.nbytes = len(t.data)  # the pickle claims more than the object holds
    refused(C, srv, "short shared memory", body([(n, F.Tensor(small, dt, t.shape))]), 400, "shared memory")
    two = "model.layers.0.self_attn.q_proj.weight"
    q = T0[two]
    refused(C, srv, "non-contiguous", body([(two, F.Tensor(storage(q.data), dt, q.shape,
                                                            stride=list(reversed(F.contiguous_strides(q.shape)))))]),
            400, "contiguous")
    refused(C, srv, "outside its storage", body([(n, F.Tensor(storage(t.data), dt, t.shape, offset=1))]), 400,
            "outside")
    refused(C, srv, "unknown name", body([("model.nope.weight", good)]), 400, "model.nope.weight")
    refused(C, srv, "wrong shape", body([(n, F.Tensor(storage(t.data + t.data), dt, (t.shape[0] * 2,)))]), 400, n)
    refused(C, srv, "bad load_format", body([(n, good)], load_format="zip"), 400, "load_format")
    md = [F.FlattenedTensorMetadata(n, F.Size(t.shape), getattr(F.torch, dt), 1, 1 + t.numel(), t.numel())]
    refused(C, srv, "range overruns", body({"flattened_tensor": F.Tensor(storage(t.data), dt, (t.numel(),)),
                                            "metadata": md}, load_format="flattened_bucket"), 400, "range")
    H.healthy(C, srv, "after the refused payloads")


def main():
    C = H.Checker("weights_from_tensor")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_from_tensor")
    if not os.path.isdir("/dev/shm"):
        print("SKIP: no /dev/shm on this machine")
        return 77
    rng = random.Random(3)
    ck = {"T0": H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--layers", "2", "--seed", "31", "--no-tie"]),
          "T1": H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=["--layers", "2", "--seed", "32", "--no-tie"])}
    try:
        cold0 = W.cold_snap(C, binary, ck["T0"])
        cold1 = W.cold_snap(C, binary, ck["T1"])
        srv = H.Server(C, binary, ck["T0"], args=W.SPEC_ARGS)
        try:
            test_named_lists(C, srv, ck, cold1, rng)
            test_flattened(C, srv, ck, cold0, rng)
            test_views(C, srv, ck)
            test_refused(C, srv, ck)
        finally:
            H.stop_clean(C, srv)
    finally:
        for s in STORAGES:
            s.unlink()
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
