#!/usr/bin/env python3
"""prime-rl's NCCL metadata pickles through graphswap's strict unpickler (server/rendezvous/primerl_meta.c,
driven by `graphswap primerl-meta`), without torch.

prime-rl's trainer (PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64
src/prime_rl/transports/weights/nccl.py broadcast_state_dict) sends, before each state dict's
per-dtype broadcasts, pickle.dumps({torch.dtype: [(name, tensor.shape, tensor.numel()), ...]}).
Here a fake `torch` module (FakeTorch) stands in: its dtypes reduce to the global torch.<name> and
its Size to (torch.Size, (tuple(self),)), as real torch's do, so Python's own pickle module writes
the same bytes; the first check compares them with bytes real torch 2.15 wrote (REAL_TORCH below,
also embedded in tests/unit/test_primerl_meta.c). Then:
- the non-layer dict at protocols 2, 3, 4, 5 (5 is Python 3.14's default) parses to the same names /
  dtypes / shapes / numels, in the pickle's order;
- a MoE-sized layer (2500 tensors of three dtypes: APPENDS batches of 1000, an APPEND of one, and
  several FRAMEs) round-trips; every shape of 0..8 dimensions and numels above 2^32 parse;
- refusals, each with a message and exit status 1: 9 dimensions, a numel that is not the product of
  the shape, a plain tuple for the shape, a complex dtype, a string key, an OrderedDict, a list at
  the top, a reduce to os.system, a pickle of protocol 1, trailing bytes, more than 1 MiB, every
  truncation of a small pickle, and 400 random single-byte mutations (never a crash).
With GS_PYTHON_TORCH=<python with torch>, the fake's bytes are also compared with real torch's for
the layer and shape cases. Environment (ctest): GS_BIN.
"""
import collections
import json
import os
import pickle
import random
import subprocess
import sys
import types

GS_BIN = os.environ.get("GS_BIN", "build/graphswap")

# pickle.dumps(m, protocol=P).hex() by torch 2.15.0 / Python 3.11.7 for NONLAYER (P = 4, 2) and
# SHAPES (P = 5)
REAL_TORCH = {
    ("nonlayer", 4): "800495af000000000000007d94288c05746f726368948c0862666c6f617431369493945d94288c196d6f64656c2e656d6265645f746f6b656e732e776569676874948c05746f726368948c0453697a659493944b204b108694859452944d000287948c116d6f64656c2e6e6f726d2e7765696768749468084b108594859452944b1087946568018c07666c6f617433329493945d948c0e6c6d5f686561642e7765696768749468084b204b108694859452944d0002879461752e",
    ("nonlayer", 2): "80027d71002863746f7263680a62666c6f617431360a71015d71022858190000006d6f64656c2e656d6265645f746f6b656e732e776569676874710363746f7263680a53697a650a71044b204b108671058571065271074d000287710858110000006d6f64656c2e6e6f726d2e776569676874710968044b1085710a85710b52710c4b1087710d6563746f7263680a666c6f617433320a710e5d710f580e0000006c6d5f686561642e776569676874711068044b204b108671118571125271134d000287711461752e",
    ("shapes", 5): "80059586000000000000007d948c05746f726368948c07666c6f617431369493945d94288c0161948c05746f726368948c0453697a6594939429859452944b0187948c0162946808284b024b034b044b057494859452944b7887948c01639468084a701101004a701101008694859452948a05001110240187948c017a9468084b004b078694859452944b00879465732e",
}


def fake_torch():
    """A module named torch whose dtypes and Size pickle as real torch's do."""
    torch = types.ModuleType("torch")

    class dtype:
        __module__ = "torch"

        def __init__(self, name):
            self.name = name

        def __reduce__(self):  # torch.dtype: pickled by name, a global torch.<name>
            return self.name

    class Size(tuple):
        def __reduce__(self):  # torch.Size.__reduce__
            return (Size, (tuple(self),))

    # real torch names Size's module with a string object of its own (not the one its dtypes'
    # globals use), so pickle memoizes "torch" twice: the same here
    Size.__module__ = "".join(["tor", "ch"])
    Size.__qualname__ = Size.__name__ = "Size"
    torch.Size = Size
    for n in ("bfloat16", "float16", "float32", "float64", "complex64", "int64", "float8_e4m3fn"):
        setattr(torch, n, dtype(n))
    sys.modules["torch"] = torch
    return torch


torch = fake_torch()
S = torch.Size


def nonlayer():
    return {torch.bfloat16: [("model.embed_tokens.weight", S([32, 16]), 512), ("model.norm.weight", S([16]), 16)],
            torch.float32: [("lm_head.weight", S([32, 16]), 512)]}


def shapes():
    return {torch.float16: [("a", S([]), 1), ("b", S([2, 3, 4, 5]), 120), ("c", S([70000, 70000]), 4900000000),
                            ("z", S([0, 7]), 0)]}


def layer(n=2500):
    """One decoder layer of a large MoE model: per-expert tensors, three dtypes."""
    m = {torch.bfloat16: [], torch.float32: [], torch.float16: []}
    for e in range(n):
        m[torch.bfloat16].append((f"model.layers.17.mlp.experts.{e}.gate_proj.weight", S([96, 64]), 96 * 64))
    m[torch.float32].append(("model.layers.17.input_layernorm.weight", S([64]), 64))  # one item: APPEND
    for e in range(1001):
        m[torch.float16].append((f"model.layers.17.mlp.experts.{e}.router_bias", S([1, 1, 1, e]), e))
    return m


def expect(m):
    """What graphswap primerl-meta prints for the metadata m."""
    size = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int64": 8, "float8_e4m3fn": 1}
    return {"groups": [{"dtype": dt.name, "bytes": sum(n for _, _, n in items) * size[dt.name],
                        "tensors": [{"name": k, "shape": list(s), "numel": n} for k, s, n in items]}
                       for dt, items in m.items()]}


def run(data):
    p = subprocess.run([GS_BIN, "primerl-meta"], input=data, capture_output=True, timeout=60)
    if p.returncode not in (0, 1):
        raise AssertionError(f"primerl-meta exited {p.returncode} on {data[:64].hex()}...: {p.stderr.decode()[-2000:]}")
    out = json.loads(p.stdout)
    assert (p.returncode == 0) == ("groups" in out), (p.returncode, out)
    return out


def ok(data, m, what):
    out = run(data)
    assert out == expect(m), f"{what}: {json.dumps(out)[:600]}"
    print(f"ok: {what} ({len(data)} bytes, {sum(len(v) for v in m.values())} tensors)")


def refused(data, want, what):
    out = run(data)
    assert "error" in out, f"{what}: accepted: {json.dumps(out)[:300]}"
    assert want in out["error"], f"{what}: {out['error']!r} lacks {want!r}"
    print(f"ok: {what} refused: {out['error']}")


def check_real_torch():
    for (which, proto), hx in REAL_TORCH.items():
        got = pickle.dumps(nonlayer() if which == "nonlayer" else shapes(), protocol=proto)
        assert got.hex() == hx, f"the fake torch pickles {which} (protocol {proto}) unlike real torch"
    print("ok: the fake torch module pickles byte for byte as torch 2.15")
    py = os.environ.get("GS_PYTHON_TORCH")
    if not py:
        print("skip: GS_PYTHON_TORCH unset: the layer case is not compared with real torch")
        return
    src = open(__file__).read().split("# --- real-torch " + "comparison ---")[0]
    script = src.replace("torch = fake_torch()", "import torch") + "\nimport sys\nsys.stdout.write(" \
        "pickle.dumps(layer(), protocol=4).hex() + ' ' + pickle.dumps(shapes(), protocol=3).hex())\n"
    p = subprocess.run([py, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    a, b = p.stdout.split()
    assert a == pickle.dumps(layer(), protocol=4).hex() and b == pickle.dumps(shapes(), protocol=3).hex()
    print(f"ok: real torch ({py}) pickles the layer and shapes cases as the fake does")


# --- real-torch comparison ---
def main():
    check_real_torch()
    for proto in (2, 3, 4, 5):
        ok(pickle.dumps(nonlayer(), protocol=proto), nonlayer(), f"non-layer dict, protocol {proto}")
    ok(pickle.dumps(shapes(), protocol=5), shapes(), "0 and 4 dims, a LONG1 numel, protocol 5")
    big = pickle.dumps(layer(), protocol=4)
    assert big.count(b"\x95") >= 3 and len(big) > 3 * 65536, "the layer should span several FRAMEs"
    ok(big, layer(), "a 3502-tensor layer, protocol 4")
    ok(pickle.dumps(layer(), protocol=2), layer(), "a 3502-tensor layer, protocol 2")
    for nd in range(9):
        dims = [3] * nd
        m = {torch.bfloat16: [("w", S(dims), 3 ** nd)]}
        ok(pickle.dumps(m, protocol=4), m, f"{nd} dims")
    ok(pickle.dumps({}, protocol=4), {}, "an empty state dict")

    refused(pickle.dumps({torch.bfloat16: [("w", S([1] * 9), 1)]}, protocol=4), "more than 8 dimensions", "9 dims")
    refused(pickle.dumps({torch.bfloat16: [("w", S([2, 3]), 5)]}), "not the product of its shape", "numel 5 of [2, 3]")
    refused(pickle.dumps({torch.bfloat16: [("w", (2, 3), 6)]}), "is not a torch.Size", "a tuple shape")
    refused(pickle.dumps({torch.complex64: [("w", S([2]), 2)]}), "torch.complex64 is not a dtype", "complex64")
    refused(pickle.dumps({"bfloat16": [("w", S([2]), 2)]}), "not a torch dtype", "a string key")
    refused(pickle.dumps(collections.OrderedDict(nonlayer())), "SETITEM(S) to a non-dict", "an OrderedDict")
    refused(pickle.dumps([("w", S([2]), 2)]), "the object is not a dict", "a list")
    refused(pickle.dumps({torch.bfloat16: [("w", S([2]), 2, 0)]}), "is not a (name, torch.Size, numel)", "a 4-tuple")
    refused(pickle.dumps({torch.bfloat16: [(7, S([2]), 2)]}), "the name is not a string", "an int name")
    refused(pickle.dumps({torch.bfloat16: [("w", os.system, 2)]}), "is not a torch.Size", "os.system as the shape")
    refused(pickle.dumps(nonlayer(), protocol=1), "not a pickle of protocol 2+", "protocol 1")
    refused(pickle.dumps(nonlayer()) + b".", "trailing data after STOP", "a byte after STOP")
    refused(pickle.dumps(layer(16000), protocol=4), "longer than 1 MiB", "a 1.2 MiB pickle")
    small = pickle.dumps(nonlayer(), protocol=4)
    for n in range(len(small)):
        assert "error" in run(small[:n]), f"a truncation to {n} bytes was accepted"
    print(f"ok: all {len(small)} truncations refused")
    rnd = random.Random(559)
    for _ in range(400):  # single-byte mutations: a clean answer either way, never a crash
        b = bytearray(small)
        b[rnd.randrange(len(b))] = rnd.randrange(256)
        run(bytes(b))
    print("ok: 400 random mutations answered cleanly")
    print("PASS")


if __name__ == "__main__":
    main()
