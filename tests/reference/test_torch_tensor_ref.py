#!/usr/bin/env python3
"""/update_weights_from_tensor with real torch tensors (reference: torch itself writes the pickles).

Needs torch (skipped with exit 77 where it is absent, as in `make check`'s default path; run it with
a Python that has torch: GS_BIN=... GS_TEST_TMP=... python3 tests/reference/test_torch_tensor_ref.py).
The trainer side is SGLang's: torch.multiprocessing's "file_system" sharing strategy,
multiprocessing.reduction.ForkingPickler (sglang/srt/utils/common.py MultiprocessingSerializer), a
list of (name, tensor) and a flattened bucket ({"flattened_tensor", "metadata"}: sglang's
FlattenedTensorMetadata, defined here under its module name when sglang is not installed).
Checks: after each push of a second checkpoint, checkpoint checksums equal a cold start of it and
graphswap's hashes equal sha256 of torch's own bytes (t.contiguous() as bytes).
"""
import base64
import dataclasses
import hashlib
import io
import os
import sys
import types

sys.dont_write_bytecode = True
try:
    import torch
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
except ImportError:
    print("SKIP: torch is not installed (pip install torch to run this reference test)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

TORCH_DT = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}


def metadata_class():
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata
        return FlattenedTensorMetadata
    except ImportError:
        pass
    m = types.ModuleType("sglang.srt.weight_sync.tensor_bucket")

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int
    FlattenedTensorMetadata.__module__ = m.__name__
    FlattenedTensorMetadata.__qualname__ = "FlattenedTensorMetadata"
    m.FlattenedTensorMetadata = FlattenedTensorMetadata
    for k in ("sglang", "sglang.srt", "sglang.srt.weight_sync"):
        sys.modules.setdefault(k, types.ModuleType(k))
    sys.modules[m.__name__] = m
    return FlattenedTensorMetadata


def serialize(obj):
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode()


def torch_tensors(ckpt_dir):
    return {n: torch.frombuffer(bytearray(t.data), dtype=TORCH_DT[t.dtype]).reshape(t.shape).clone()
            for n, t in W.ckpt(ckpt_dir).items()}


def main():
    C = H.Checker("torch_tensor_ref")
    binary = H.gs_bin(C)
    tmp = H.scratch("torch_tensor_ref")
    mp.set_sharing_strategy("file_system")
    Meta = metadata_class()
    ck0 = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--layers", "2", "--seed", "41", "--no-tie"])
    ck1 = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=["--layers", "2", "--seed", "42", "--no-tie"])
    try:
        cold1 = W.cold_snap(C, binary, ck1)
        cold0 = W.cold_snap(C, binary, ck0)
        srv = H.Server(C, binary, ck0, args=W.SPEC_ARGS)
        try:
            t1 = torch_tensors(ck1)
            r = H.post(srv, "/update_weights_from_tensor",
                       {"serialized_named_tensors": [serialize(list(t1.items()))], "weight_version": "torch-1"})
            C.check(r.status == 200 and r.json.get("success") is True, "named list: %r" % r)
            W.same(C, "torch named list", W.snap(srv, draft=False), cold1, version="torch-1")
            sums = H.get(srv, "/v1/weights/checksums?names=checkpoint").json["tensors"]
            for n, t in t1.items():
                want = hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                C.check(sums.get(n) == want, "%s: graphswap's hash is not sha256 of torch's bytes" % n)
            t0 = torch_tensors(ck0)
            flat = torch.cat([t.flatten() for t in t0.values()])
            md, off = [], 0
            for n, t in t0.items():
                md.append(Meta(n, t.shape, t.dtype, off, off + t.numel(), t.numel()))
                off += t.numel()
            r = H.post(srv, "/update_weights_from_tensor",
                       {"serialized_named_tensors": [serialize({"flattened_tensor": flat, "metadata": md})],
                        "load_format": "flattened_bucket", "flush_cache": False, "weight_version": "torch-2"})
            C.check(r.status == 200 and r.json.get("success") is True, "flattened bucket: %r" % r)
            W.same(C, "torch flattened bucket", W.snap(srv, draft=False), cold0, version="torch-2")
            mp.set_sharing_strategy("file_descriptor")
            r = H.post(srv, "/update_weights_from_tensor",
                       {"serialized_named_tensors": [serialize(list(t1.items()))]})
            C.check(r.status == 501 and "file_system" in r.json.get("message", ""), "file_descriptor strategy: %r" % r)
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
