#!/usr/bin/env python3
"""The Python trainer client (clients/python/graphswap_client.py) against a live server.

- update_weights() pushes a whole new checkpoint (numpy float32 arrays, buckets of a few tensors);
  afterwards every checksum equals a server cold-started on that checkpoint (verify() == []), and
  greedy outputs are equal;
- a failing update (a tensor of the wrong shape in a later bucket) raises GraphswapError naming the
  tensor, and the session is aborted: the server says "inconsistent" (some buckets were written) and
  refuses generation, until the next complete update.
- checkpoint-name checksums: the client's tensor_sha256 of every tensor of the checkpoint (numpy
  float32 arrays, raw Tensor bytes, Python floats) equals the server's
  /v1/weights/checksums?names=checkpoint entry; verify_state_dict() == [].
- without numpy (blocked in a subprocess) the module imports and a whole update of BF16 tensors built
  with from_floats() (Python floats) and Tensor (raw bytes) succeeds and verifies;
- torch bf16 tensors (only if torch is importable; else a clear skip message);
- `pip install --no-deps --no-build-isolation --no-index --target DIR` of clients/python works offline
  and installs an importable graphswap_client.
"""
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
CLIENT_DIR = os.path.abspath(os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, CLIENT_DIR)
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


def raw_state_dict(model_dir):
    return {n: gc.Tensor(t.dtype, t.shape, t.data) for n, t in sorted(ref_model.read_checkpoint_tensors(model_dir).items())}


def check_checksums(C, cl, model_dir):
    """The client's hash of every checkpoint tensor equals the server's (the server is at model_dir)."""
    dtype, theirs = cl.checkpoint_checksums()
    raw = raw_state_dict(model_dir)
    C.check(set(raw) <= set(theirs) and len(raw) > 10, "server checkpoint names %d, checkpoint %d: missing %s" %
            (len(theirs), len(raw), sorted(set(raw) - set(theirs))[:4]))
    for label, sd in (("numpy float32", dict(tensors_f32(model_dir))), ("raw Tensor", raw),
                      ("Python floats", {n: gc.from_floats(t.to_f64().ravel().tolist(), t.shape, "F32")
                                         for n, t in ref_model.read_checkpoint_tensors(model_dir).items()})):
        mine = gc.state_dict_checksums(sd, dtype)
        bad = sorted(n for n in raw if mine.get(n) != theirs.get(n))
        C.check(bad == [], "%s: client hash != server hash for %d tensors, e.g. %s" % (label, len(bad), bad[:3]))
    C.check(cl.verify_state_dict(raw) == [], "verify_state_dict of the checkpoint itself")
    other = dict(raw)
    n0 = sorted(other)[0]
    other[n0] = gc.from_floats([0.0] * (len(other[n0].data) // 2), other[n0].shape, "BF16")
    C.check(cl.verify_state_dict(other) == [n0], "verify_state_dict does not name the changed tensor")


NO_NUMPY = r"""
import sys
sys.modules["numpy"] = None  # any "import numpy" now raises ImportError
sys.path.insert(0, sys.argv[1])
import graphswap_client as gc
import json
port, spec = int(sys.argv[2]), json.load(open(sys.argv[3]))
cl = gc.GraphswapClient("http://127.0.0.1:%d" % port)
sd = []
for i, (name, dtype, shape, hexdata, floats) in enumerate(spec):
    # every other tensor from Python floats (rounded to bf16 here), the rest as raw bf16 bytes
    sd.append((name, gc.from_floats(floats, shape, "BF16") if i % 2 else gc.Tensor(dtype, shape, bytes.fromhex(hexdata))))
info = cl.update_weights(sd, bucket_bytes=64 << 10, version="no-numpy")
assert info["state"] == "ready" and info["version"] == "no-numpy", info
assert cl.verify_state_dict(sd) == [], cl.verify_state_dict(sd)
try:
    gc.to_safetensors([("x", [1.0, 2.0])])
    raise SystemExit("a list was accepted as a tensor")
except TypeError:
    pass
print("NO-NUMPY-OK")
"""


def check_no_numpy(C, srv, model_dir):
    """The client without numpy: import, BF16 tensors from raw bytes and from Python floats."""
    import json

    tmp = H.scratch("client_python_nonumpy")
    spec = []
    for n, t in sorted(ref_model.read_checkpoint_tensors(model_dir).items()):
        C.check(t.dtype == "BF16", "test checkpoint tensor %s is %s, not BF16" % (n, t.dtype))
        spec.append((n, t.dtype, list(t.shape), t.data.hex(), t.to_f64().ravel().tolist()))
    sp = os.path.join(tmp, "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    script = os.path.join(tmp, "no_numpy.py")
    with open(script, "w") as f:
        f.write(NO_NUMPY)
    p = subprocess.run([sys.executable, script, CLIENT_DIR, str(srv.port), sp], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode(errors="replace")
    C.check(p.returncode == 0 and "NO-NUMPY-OK" in out, "client without numpy: rc %d: %s" % (p.returncode, out[-2000:]))


def check_torch(C, cl, model_dir):
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not importable here: bf16 torch tensors are not tested (the raw-bytes and "
              "Python-float bf16 paths are)")
        return
    sd = [(n, torch.from_numpy(a).to(torch.bfloat16)) for n, a in tensors_f32(model_dir)]
    info = cl.update_weights(sd, bucket_bytes=64 << 10, version="torch-bf16")
    C.check(info["state"] == "ready", "torch bf16 update: %r" % info)
    C.check(cl.verify_state_dict(sd) == [], "torch bf16: verify_state_dict")
    dtype, theirs = cl.checkpoint_checksums()
    C.check(all(gc.tensor_sha256(t, dtype) == theirs[n] for n, t in sd), "torch bf16: tensor_sha256")


def check_pip_install(C, tmp):
    """pip installs the client offline (setuptools from this Python, no index, no build isolation).
    The source is copied first: setuptools builds in-tree (build/, *.egg-info)."""
    src = os.path.join(tmp, "pip-src")
    dst = os.path.join(tmp, "pip-target")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(CLIENT_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    try:
        import setuptools  # noqa: F401
    except ImportError:
        print("SKIP: pip install: no setuptools in this Python (pip install --no-build-isolation needs it)")
        return
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", "--target", dst, src],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0 and "No module named pip" in out:
        print("SKIP: pip install: no pip in this Python")
        return
    C.check(p.returncode == 0, "pip install --target: %s" % out[-2000:])
    p = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import graphswap_client as g; "
                        "print(g.__file__); print(g.tensor_sha256(g.from_floats([1.0]), 'BF16'))", dst],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode(errors="replace")
    C.check(p.returncode == 0 and out.startswith(dst), "installed client does not import from the target: %s" % out)


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
        check_checksums(C, a, T1)
        check_no_numpy(C, hot, T1)
        check_torch(C, a, T1)
        C.check(a.verify(b) == [], "the extra updates left the server off T1")
        check_pip_install(C, tmp)
        H.sanitizer_clean(C, hot)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
