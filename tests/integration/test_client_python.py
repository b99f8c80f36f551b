#!/usr/bin/env python3
"""The Python trainer client (clients/python/graphswap_client.py) against a live server.

- update_weights() pushes a whole new checkpoint (numpy float32 arrays, buckets of a few tensors);
  afterwards every checksum equals a server cold-started on that checkpoint (verify() == []), and
  greedy outputs are equal;
- a failing update (a tensor of the wrong shape in a later bucket) raises GraphswapError naming the
  tensor, and the session is aborted: the server says "inconsistent" (some buckets were written) and
  refuses generation, until the next complete update.
"""
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import numpy as np  # noqa: E402

import graphswap_client as gc  # noqa: E402
import ref_model  # noqa: E402
import test_http_basic as H  # noqa: E402


def tensors_f32(model_dir):
    raw = ref_model.read_checkpoint_tensors(model_dir)
    return [(n, t.to_f64().astype(np.float32)) for n, t in sorted(raw.items())]


def greedy(srv, ids):
    r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                        "return_token_ids": True})
    return r.json["choices"][0]["token_ids"] if r.status == 200 else r.status


def main():
    C = H.Checker("client_python")
    binary = H.gs_bin(C)
    tmp = H.scratch("client_python")
    T0 = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--seed", "1", "--no-tie"])
    T1 = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=["--seed", "2", "--no-tie"])
    hot = H.Server(C, binary, T0)
    cold = H.Server(C, binary, T1)
    try:
        a = gc.GraphswapClient("http://127.0.0.1:%d" % hot.port)
        b = gc.GraphswapClient("http://127.0.0.1:%d" % cold.port)
        C.check(a.verify(b) != [], "different checkpoints verify as equal")
        info = a.update_weights(tensors_f32(T1), bucket_bytes=64 << 10, version="step-1")
        C.check(info["state"] == "ready" and info["version"] == "step-1", "after update: %r" % info)
        C.check(info["last_update"]["buckets"] > 3, "expected several buckets: %r" % info["last_update"])
        diff = a.verify(b)
        C.check(diff == [], "hot-updated server differs from the cold start in %s" % diff[:5])
        for ids in ([1, 2, 3], [50, 60, 70, 80, 90]):
            C.check(greedy(hot, ids) == greedy(cold, ids), "greedy output differs after update for %r" % ids)
        # a failing update: the bad tensor sits in a later bucket, after others were written
        bad = tensors_f32(T0)
        i = next(k for k, (n, _) in enumerate(bad) if n.endswith("layers.1.mlp.up_proj.weight"))
        bad[i] = (bad[i][0], np.zeros((3, 3), np.float32))
        try:
            a.update_weights(bad, bucket_bytes=64 << 10)
            C.fail("an update with a wrong shape succeeded")
        except gc.GraphswapError as e:
            C.check(e.status == 400 and "layers.1.mlp.up_proj.weight" in str(e), "error: %s" % e)
        st = a.info()
        C.check(st["state"] == "inconsistent", "after a failed update: %r" % st)
        C.check(greedy(hot, [1, 2, 3]) == 503, "generation not refused while inconsistent")
        info = a.update_weights(tensors_f32(T1), version="step-2")
        C.check(info["state"] == "ready" and a.verify(b) == [], "a complete update did not repair the server")
        # the client's serialiser, read back by the independent reader of tests/reference
        x, y = np.arange(6, dtype=np.float16).reshape(2, 3), np.linspace(-1, 1, 5, dtype=np.float32)
        path = os.path.join(tmp, "client.safetensors")
        with open(path, "wb") as f:
            f.write(gc.to_safetensors([("x", x), ("y", y)]))
        back, _ = ref_model.read_safetensors(path)
        C.check([(t.name, t.dtype, t.shape) for t in back] == [("x", "F16", (2, 3)), ("y", "F32", (5,))] and
                np.array_equal(back[0].to_f64(), x.astype(np.float64)) and
                np.array_equal(back[1].to_f64(), y.astype(np.float64)), "to_safetensors round trip")
        H.sanitizer_clean(C, hot)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
