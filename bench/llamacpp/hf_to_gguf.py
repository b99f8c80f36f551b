#!/usr/bin/env python3
"""Convert a Hugging Face Qwen3 / Qwen3-MoE checkpoint folder to a GGUF file for llama.cpp.

    python hf_to_gguf.py CHECKPOINT_DIR OUT.gguf [--outtype auto|f32|bf16|q8_0]
    python hf_to_gguf.py --selftest          # Q8_0 against ggml's own quantize_row_q8_0_ref

Reads config.json, model.safetensors (or the shards listed in model.safetensors.index.json),
tokenizer.json (byte-level BPE) and tokenizer_config.json. Needs only numpy and the `gguf`
package (its GGUFWriter and constants); safetensors files are parsed here from their header
(8-byte little-endian header size, JSON header, raw little-endian data), no torch.

Weights: --outtype auto keeps the checkpoint's dtype (bf16 stays bf16, anything else becomes
f32); f32 / bf16 force one type for the matrices (bf16 by round-to-nearest-even from f32).
1-D tensors (the RMSNorm weights) are always written as f32, as llama.cpp's converter does.
Qwen3 uses NEOX-style RoPE in llama.cpp, so q/k rows are written unpermuted.

--outtype q8_0: GGML Q8_0 for every matrix, token_embd and output included, as llama.cpp's own
convert_hf_to_gguf.py --outtype q8_0 does by default (conversion/base.py ModelBase.prepare_tensors
at llama.cpp 0c1e570: 1-D tensors and *_norm.weight F32, FFN_GATE_INP (the MoE router) F32, every
other .weight the file type's Q8_0, token_embd / output special-cased only for TQ1_0 / TQ2_0; a
row length that is no multiple of 32 falls back to F16 there and here). The quantizer is written
here (q8_0_quantize) to the definition in ggml/src/ggml-quants.c quantize_row_q8_0_ref and
ggml/src/ggml-common.h block_q8_0 (same commit); --selftest checks it bit for bit against the
quantize_row_q8_0_ref that llama-cpp-python's libggml-base exports.

Block-FP8 checkpoints (config.json quantization_config {quant_method fp8, fmt e4m3,
weight_block_size [R, C]}: X.weight F8_E4M3 + X.weight_scale_inv F32 [ceil(rows/R), ceil(cols/C)],
the Qwen3-FP8 layout) are read as llama.cpp's converter reads them (conversion/base.py
dequant_simple): each weight dequantized to f32(code) * scale of its block, one f32 multiply,
which is exactly the matrix graphswap's FP8 matmul computes with (kern.h KOP_MATMUL) and what
`graphswap mkmodel --dtype f32 --fp8 R,C --fp8-dequantized` writes. So `--outtype q8_0` on an FP8
checkpoint is Q8_0 of the very weights graphswap serves, and `--outtype f32` their exact F32 twin.

Qwen3ForCausalLM -> GGUF architecture `qwen3`; Qwen3MoeForCausalLM -> `qwen3moe`. The MoE part
matches llama.cpp's own converter and loader field by field, as vendored in llama-cpp-python
0.3.36 (llama.cpp / ggml commit 0c1e570, the build setup.sh makes):
  - convert_hf_to_gguf.py -> conversion/qwen.py `Qwen3MoeModel(Qwen2MoeModel)`: per-expert
    mlp.experts.E.{gate,up,down}_proj.weight stacked over E (torch.stack dim 0), or the fused
    transformers 5 mlp.experts.gate_up_proj [E, 2I, H] split on dim -2 (gate rows first) and
    mlp.experts.down_proj [E, H, I] as is; `expert_feed_forward_length` = moe_intermediate_size;
  - conversion/base.py `TextModel.set_gguf_parameters`: `expert_count` = num_experts,
    `expert_used_count` = num_experts_per_tok, `feed_forward_length` = intermediate_size;
    `ModelBase.prepare_tensors`: FFN_GATE_INP (the router) is always written F32;
  - gguf-py/gguf/constants.py MODEL_ARCH.QWEN3MOE (tensor list) and tensor_mapping.py:
    model.layers.L.mlp.gate -> blk.L.ffn_gate_inp [E, H]; mlp.experts.{gate,up,down}_proj ->
    blk.L.ffn_{gate,up,down}_exps ([E, I, H], [E, I, H], [E, H, I]; ggml ne reversed);
  - src/models/qwen3moe.cpp: every layer is a MoE layer (ffn_gate_inp + *_exps required, no
    dense FFN), softmax gating, and build_moe_ffn(..., norm_w = true, ...) hard-coded: the top-k
    weights are always renormalised; no GGUF key (expert_weights_norm, expert_gating_func) is
    read for it. So norm_topk_prob false, decoder_sparse_step != 1 and mlp_only_layers are
    refused here (llama.cpp's own converter writes such checkpoints without complaint, and
    llama.cpp then computes a different model).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("hf_to_gguf.py: needs the `gguf` package (pip install gguf); see bench/llamacpp/setup.sh")

# Hugging Face architecture -> GGUF architecture
ARCHS = {"Qwen3ForCausalLM": ("qwen3", "qwen3"), "Qwen3MoeForCausalLM": ("qwen3_moe", "qwen3moe")}

# safetensors dtype -> (numpy dtype of the raw bytes, is bf16)
ST_DTYPES = {
    "F32": (np.float32, False),
    "F16": (np.float16, False),
    "BF16": (np.uint16, True),
    "F64": (np.float64, False),
}
F8 = "F8_E4M3"  # block-FP8 weight codes (with X.weight_scale_inv); read through fp8_weight()

# Hugging Face per-layer suffix -> GGUF per-block name (llama.cpp's qwen3 tensor set)
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Qwen3-MoE: the router, and the experts in either layout transformers writes
MOE_ROUTER = "mlp.gate.weight"  # [E, H] -> blk.L.ffn_gate_inp.weight (always F32, as llama.cpp)
EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
FUSED_RE = re.compile(r"^mlp\.experts\.(gate_up|down)_proj(?:\.weight)?$")
DENSE_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")

# the Qwen2 / Qwen3 split regex (tokenizer.json pre_tokenizer) -> llama.cpp pre-tokenizer "qwen2";
# the Llama 3 one (digits in groups of up to 3) -> "llama-bpe"
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def die(msg: str) -> None:
    sys.exit(f"hf_to_gguf.py: {msg}")


# ---------------------------------------------------------------- safetensors


class SafetensorsFile:
    """One .safetensors file: the header parsed by hand, tensors as read-only memmap views."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                die(f"{path}: too short for a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 * 1024 * 1024:
                die(f"{path}: implausible header size {n}")
            header = json.loads(f.read(n))
        self.data_start = 8 + n
        header.pop("__metadata__", None)
        self.header = header
        size = os.path.getsize(path)
        self.mm = np.memmap(path, dtype=np.uint8, mode="r") if size > self.data_start else None

    def names(self):
        return list(self.header)

    def raw_u8(self, name: str) -> np.ndarray:
        """An F8_E4M3 tensor's codes, as uint8 with the checkpoint's shape."""
        info = self.header[name]
        b, e = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        if e - b != (int(np.prod(shape)) if shape else 1):
            die(f"{self.path}: tensor {name}: {e - b} bytes for shape {shape} F8_E4M3")
        return self.mm[self.data_start + b:self.data_start + e].reshape(shape)

    def get(self, name: str) -> tuple[np.ndarray, bool]:
        """(array with the checkpoint's shape, is_bf16); bf16 comes back as raw uint16."""
        info = self.header[name]
        dt = info["dtype"]
        if dt == F8:
            die(f"{self.path}: tensor {name} is F8_E4M3 but config.json has no fp8 quantization_config "
                f"with weight_block_size (or the tensor has no {name}_scale_inv)")
        if dt not in ST_DTYPES:
            die(f"{self.path}: tensor {name} has unsupported dtype {dt}")
        npdt, is_bf16 = ST_DTYPES[dt]
        b, e = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * np.dtype(npdt).itemsize:
            die(f"{self.path}: tensor {name}: {e - b} bytes for shape {shape} {dt}")
        raw = self.mm[self.data_start + b:self.data_start + e]
        arr = raw.view(npdt).reshape(shape)
        if sys.byteorder == "big":  # safetensors is little-endian
            arr = arr.byteswap()
        return arr, is_bf16


def open_checkpoint(d: Path) -> dict[str, SafetensorsFile]:
    """tensor name -> the file that holds it (single file or sharded with an index)."""
    index = d / "model.safetensors.index.json"
    single = d / "model.safetensors"
    files: dict[str, SafetensorsFile] = {}
    where: dict[str, SafetensorsFile] = {}
    if index.is_file():
        wm = json.loads(index.read_text())["weight_map"]
        for name, fname in wm.items():
            if fname not in files:
                files[fname] = SafetensorsFile(d / fname)
            where[name] = files[fname]
        for f in files.values():  # every header entry must be in the index
            for name in f.names():
                if name not in where:
                    where[name] = f
    elif single.is_file():
        f = SafetensorsFile(single)
        for name in f.names():
            where[name] = f
    else:
        shards = sorted(d.glob("*.safetensors"))
        if not shards:
            die(f"{d}: no model.safetensors, model.safetensors.index.json or *.safetensors")
        for p in shards:
            f = SafetensorsFile(p)
            for name in f.names():
                where[name] = f
    return where


# ---------------------------------------------------------------- dtype conversion


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even, NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def _e4m3_table() -> np.ndarray:
    """float8_e4m3fn code -> float32 (exact): sign, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal (m/8 * 2^-6); S.1111.111 (0x7f / 0xff) is NaN, there is no infinity."""
    t = np.empty(256, dtype=np.float32)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
        t[c] = -v if c & 0x80 else v
    t[0x7F] = t[0xFF] = np.nan
    return t


E4M3 = _e4m3_table()


def fp8_dequantize(codes: np.ndarray, scale: np.ndarray, block: tuple[int, int], name: str) -> np.ndarray:
    """f32(code) * scale[row // R, col // C] in float32 (one rounding, as graphswap's FP8 matmul and
    llama.cpp's dequant_simple). codes [rows, cols] uint8, scale [ceil(rows/R), ceil(cols/C)] f32."""
    if codes.ndim != 2:
        die(f"{name}: F8_E4M3 weight of shape {list(codes.shape)}; only 2-D projections are supported")
    R, C = block
    rows, cols = codes.shape
    want = (-(-rows // R), -(-cols // C))
    if tuple(scale.shape) != want:
        die(f"{name}_scale_inv: shape {list(scale.shape)}, expected {list(want)} for blocks {R}x{C}")
    s = np.asarray(scale, dtype=np.float32)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        die(f"{name}_scale_inv: a scale is not finite and positive")
    w = E4M3[codes]
    if np.isnan(w).any():
        die(f"{name}: NaN code (0x7f / 0xff) in an F8_E4M3 weight")
    full = np.repeat(np.repeat(s, R, axis=0), C, axis=1)[:rows, :cols]
    return np.multiply(w, full, dtype=np.float32)


# ---------------------------------------------------------------- GGML Q8_0
#
# Written to the definition in ggml (llama.cpp commit 0c1e570, as vendored in llama-cpp-python
# 0.3.36): ggml/src/ggml-common.h `block_q8_0` = { ggml_half d; int8_t qs[QK8_0 = 32]; }, 34 bytes
# with no padding, blocks consecutive along a row (ne0); ggml/src/ggml-quants.c
# `quantize_row_q8_0_ref`: per block of 32, amax = max |x| (f32), d = amax / 127 (f32 division),
# id = 1/d (0 when d == 0), q = roundf(x * id) (f32 product; roundf: half away from zero), and the
# block stores d converted to f16 (round to nearest even) -- q is computed with the f32 id, not
# with the f16-rounded d.

QK8_0 = 32
Q8_0_BLOCK_BYTES = 2 + QK8_0


def q8_0_quantize(x: np.ndarray) -> np.ndarray:
    """float32 [..., K] (K % 32 == 0) -> GGML Q8_0 bytes, uint8 [..., K / 32 * 34]."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % QK8_0:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of {QK8_0}")
    if not np.all(np.isfinite(x)):
        die("Q8_0: a non-finite weight")
    blk = x.reshape(-1, QK8_0)
    amax = np.abs(blk).max(axis=1)
    d = np.divide(amax, np.float32(127), dtype=np.float32)
    inv = np.zeros_like(d)
    np.divide(np.float32(1), d, out=inv, where=d != 0)
    v = np.multiply(blk, inv[:, None], dtype=np.float32)
    # roundf: floor(|v|) + (fraction >= 0.5), sign restored; |v| - floor(|v|) is exact here
    a = np.abs(v)
    fl = np.floor(a)
    r = fl + (a - fl >= np.float32(0.5))
    q = np.copysign(r, v).astype(np.int8)
    out = np.empty((blk.shape[0], Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK8_0 * Q8_0_BLOCK_BYTES)


def q8_0_dequantize(b: np.ndarray) -> np.ndarray:
    blk = np.ascontiguousarray(b).reshape(-1, Q8_0_BLOCK_BYTES)
    d = blk[:, :2].copy().view("<f2").astype(np.float32)
    q = blk[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(*b.shape[:-1], b.shape[-1] // Q8_0_BLOCK_BYTES * QK8_0)


def selftest() -> int:
    """q8_0_quantize bit for bit against ggml's quantize_row_q8_0_ref (ctypes, from the
    llama-cpp-python install setup.sh makes) on random rows and edge cases."""
    import ctypes
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(4096).astype(np.float32),
            (rng.standard_normal(4096) * 1e-3).astype(np.float32),
            np.zeros(64, np.float32),                                      # d = 0 blocks
            np.array([127, 0.5, -0.5, 1.5, -2.5, 126.5, -126.5] + [0] * 25, np.float32),  # halves
            np.array([1e-7] * 16 + [-3e-8] * 16, np.float32),               # f16-subnormal d
            (rng.integers(-300, 300, 4096) / 2).astype(np.float32)]          # many exact .5 ties
    got = [q8_0_quantize(r) for r in rows]
    for i, (r, g) in enumerate(zip(rows, got)):  # round trip: d/2 plus 127 x the f16 rounding of d
        d = np.abs(r).reshape(-1, 32).max(1) / np.float32(127)
        bound = 0.5 * d + 127 * np.abs(d - d.astype(np.float16).astype(np.float32)) + 1e-12
        if not np.all(np.abs(q8_0_dequantize(g) - r).reshape(-1, 32) <= bound[:, None] * (1 + 1e-5)):
            print(f"hf_to_gguf.py selftest: row {i}: Q8_0 round trip off by more than d/2")
            return 1
    try:
        import llama_cpp
    except ImportError:
        print("hf_to_gguf.py selftest: no llama_cpp; checked the round trip only")
        return 0
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).resolve().parent / "lib" / "libggml-base.so"))
    f = lib.quantize_row_q8_0_ref
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f.restype = None
    for i, (r, g) in enumerate(zip(rows, got)):
        ref = np.zeros(r.size // QK8_0 * Q8_0_BLOCK_BYTES, np.uint8)
        f(r.ctypes.data, ref.ctypes.data, r.size)
        if not np.array_equal(ref, g):
            bad = int(np.argmax(ref != g))
            print(f"hf_to_gguf.py selftest: row {i}: Q8_0 differs from ggml quantize_row_q8_0_ref at byte {bad}")
            return 1
    print(f"hf_to_gguf.py selftest: Q8_0 bit-identical to ggml quantize_row_q8_0_ref "
          f"({sum(r.size for r in rows)} values, {len(rows)} rows)")
    return 0


def to_f32(arr: np.ndarray, is_bf16: bool) -> np.ndarray:
    if is_bf16:
        return bf16_to_f32(arr)
    return np.ascontiguousarray(arr, dtype=np.float32)


def to_bf16(arr: np.ndarray, is_bf16: bool) -> np.ndarray:
    if is_bf16:
        return np.ascontiguousarray(arr)
    return f32_to_bf16(np.asarray(arr, dtype=np.float32))


# ---------------------------------------------------------------- config / tokenizer


def hp(cfg: dict, *keys, default=None, required=True):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required and default is None:
        die(f"config.json lacks {' / '.join(keys)}")
    return default


def token_id_of(tok, vocab_lookup: dict[str, int]):
    if tok is None:
        return None
    if isinstance(tok, dict):
        tok = tok.get("content")
    if not isinstance(tok, str):
        return None
    return vocab_lookup.get(tok)


def looks_special(text: str) -> bool:
    return (text.startswith("<|") and text.endswith("|>")) or text in ("<pad>", "<mask>")


def load_tokenizer(d: Path, cfg: dict, n_vocab: int, pre_override: str | None):
    tj_path = d / "tokenizer.json"
    if not tj_path.is_file():
        die(f"{d}: no tokenizer.json (a byte-level BPE tokenizer.json is needed for llama.cpp)")
    tj = json.loads(tj_path.read_text(encoding="utf-8"))
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        die(f"{tj_path}: model.type {model.get('type')!r}, only byte-level BPE is supported")
    vocab: dict[str, int] = dict(model["vocab"])
    added = tj.get("added_tokens", []) or []
    added_by_id = {}
    for a in added:
        vocab[a["content"]] = a["id"]
        added_by_id[a["id"]] = a
    if vocab and max(vocab.values()) >= n_vocab:
        die(f"tokenizer has id {max(vocab.values())} >= vocab size {n_vocab}")
    rev = {i: t for t, i in vocab.items()}

    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        elif i in added_by_id:
            a = added_by_id[i]
            tokens.append(a["content"])
            special = a.get("special", False) or looks_special(a["content"])
            types.append(int(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED))
        else:
            tokens.append(rev[i])
            types.append(int(gguf.TokenType.NORMAL))

    merges = []
    for m in model.get("merges", []) or []:
        if isinstance(m, str):
            merges.append(m)
        else:  # newer tokenizers store [left, right]
            if any(" " in p for p in m):
                die("merge with a space in a token: not representable in GGUF's 'left right' form")
            merges.append(f"{m[0]} {m[1]}")
    if not merges:
        die(f"{tj_path}: no BPE merges (llama.cpp's gpt2 tokenizer needs them)")

    # pre-tokenizer: find the Split regex
    pre = pre_override
    if pre is None:
        pattern = None

        def walk(node):
            nonlocal pattern
            if isinstance(node, dict):
                if node.get("type") == "Split" and isinstance(node.get("pattern"), dict):
                    pattern = pattern or node["pattern"].get("Regex")
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(tj.get("pre_tokenizer"))
        if pattern == QWEN2_SPLIT:
            pre = "qwen2"
        elif pattern == LLAMA3_SPLIT:
            pre = "llama-bpe"
        else:
            pre = "qwen2"
            print(f"hf_to_gguf.py: warning: unrecognised pre-tokenizer regex {pattern!r}; writing "
                  "'qwen2' (text tokenization in llama.cpp may differ; token ids are unaffected)",
                  file=sys.stderr)

    tc_path = d / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.is_file() else {}

    def first_id(v):
        if isinstance(v, list):
            return v[0] if v else None
        return v

    bos = token_id_of(tc.get("bos_token"), vocab)
    if bos is None:
        bos = first_id(cfg.get("bos_token_id"))
    eos = token_id_of(tc.get("eos_token"), vocab)
    if eos is None:
        eos = first_id(cfg.get("eos_token_id"))
    pad = token_id_of(tc.get("pad_token"), vocab)
    if pad is None:
        pad = first_id(cfg.get("pad_token_id"))
    return {
        "tokens": tokens, "types": types, "merges": merges, "pre": pre,
        "bos": bos, "eos": eos, "pad": pad,
        "add_bos": bool(tc.get("add_bos_token", False)),
        "chat_template": tc.get("chat_template") if isinstance(tc.get("chat_template"), str) else None,
    }


# ---------------------------------------------------------------- main


def moe_params(cfg: dict, n_layer: int) -> dict:
    """Qwen3-MoE hyperparameters; dies on what llama.cpp's qwen3moe graph cannot express."""
    n_expert = int(hp(cfg, "num_experts", "num_local_experts"))
    n_used = int(hp(cfg, "num_experts_per_tok"))
    n_ff_exp = int(hp(cfg, "moe_intermediate_size"))
    if n_expert < 1 or not 1 <= n_used <= n_expert:
        die(f"num_experts {n_expert} / num_experts_per_tok {n_used}: need 1 <= k <= E")
    # llama.cpp src/models/qwen3moe.cpp: build_moe_ffn(..., LLM_FFN_SILU, norm_w = true, ...,
    # LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX) with no GGUF key to turn the renormalisation off
    if not cfg.get("norm_topk_prob", False):
        die(f"norm_topk_prob {cfg.get('norm_topk_prob')!r}: llama.cpp's qwen3moe always renormalises the "
            "top-k router weights (build_moe_ffn norm_w = true, no GGUF key); it cannot compute this model")
    # llama.cpp's qwen3moe loader creates ffn_gate_inp + ffn_*_exps in every layer, no dense FFN
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    dense = sorted(int(i) for i in (cfg.get("mlp_only_layers") or []) if 0 <= int(i) < n_layer)
    if step != 1 or dense:
        sparse = [i for i in range(n_layer) if i not in dense and (i + 1) % step == 0]
        die(f"decoder_sparse_step {step} / mlp_only_layers {dense}: dense MLP layers "
            f"{sorted(set(range(n_layer)) - set(sparse))}; llama.cpp's qwen3moe has a MoE FFN in every "
            "layer and no dense one")
    if cfg.get("shared_expert_intermediate_size"):
        die("shared_expert_intermediate_size set: a shared expert is Qwen2-MoE, not in llama.cpp's qwen3moe")
    if cfg.get("scoring_func", "softmax") not in ("softmax", None):
        die(f"scoring_func {cfg.get('scoring_func')!r}: llama.cpp's qwen3moe gates with softmax")
    return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": n_ff_exp}


def convert(src: Path, out: Path, outtype: str, pre_override: str | None, quiet: bool,
            shown: Path | None = None) -> None:
    cfg = json.loads((src / "config.json").read_text())
    archs = cfg.get("architectures") or []
    hf_arch = archs[0] if archs else {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.get(
        cfg.get("model_type"))
    if hf_arch not in ARCHS or cfg.get("model_type") not in (None, ARCHS[hf_arch][0]):
        die(f"{src}: model_type {cfg.get('model_type')!r} / {archs}: only Qwen3ForCausalLM and "
            "Qwen3MoeForCausalLM are supported")
    arch = ARCHS[hf_arch][1]
    is_moe = arch == "qwen3moe"
    if cfg.get("attention_bias"):
        die(f"attention_bias=true: llama.cpp's {arch} graph has no q/k/v biases")
    if cfg.get("use_sliding_window"):
        die(f"use_sliding_window=true: llama.cpp's {arch} has no sliding-window attention")
    if cfg.get("hidden_act", "silu") != "silu":
        die(f"hidden_act {cfg.get('hidden_act')!r}: llama.cpp's {arch} uses SiLU")

    where = open_checkpoint(src)
    n_layer = int(hp(cfg, "num_hidden_layers"))
    n_embd = int(hp(cfg, "hidden_size"))
    n_head = int(hp(cfg, "num_attention_heads"))
    n_head_kv = int(hp(cfg, "num_key_value_heads", default=n_head))
    head_dim = int(hp(cfg, "head_dim", default=n_embd // n_head))
    n_ff = cfg.get("intermediate_size")
    if not is_moe:
        n_ff = int(hp(cfg, "intermediate_size"))
    moe = moe_params(cfg, n_layer) if is_moe else None
    eps = float(hp(cfg, "rms_norm_eps"))
    rope = cfg.get("rope_parameters") or {}  # transformers 5 layout
    rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
        die(f"rope scaling {scaling} is not supported by this converter")
    ctx_len = int(hp(cfg, "max_position_embeddings", default=4096))
    tied = bool(cfg.get("tie_word_embeddings", False))

    if "model.embed_tokens.weight" not in where:
        die("checkpoint has no model.embed_tokens.weight")
    n_vocab = int(where["model.embed_tokens.weight"].header["model.embed_tokens.weight"]["shape"][0])
    if cfg.get("vocab_size") and int(cfg["vocab_size"]) != n_vocab:
        die(f"config vocab_size {cfg['vocab_size']} != embedding rows {n_vocab}")

    src_dtypes = {where[n].header[n]["dtype"] for n in where}
    if outtype == "auto":
        outtype = "bf16" if src_dtypes == {"BF16"} else "f32"
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}.get(
        outtype, gguf.LlamaFileType.ALL_F32)

    # block-FP8 (Qwen3-FP8 layout): X.weight F8_E4M3 + X.weight_scale_inv, dequantized on reading
    qc = cfg.get("quantization_config") or {}
    fp8_block = None
    if qc:
        if qc.get("quant_method") != "fp8":
            die(f"quantization_config quant_method {qc.get('quant_method')!r}: only fp8 (block FP8) is supported")
        if qc.get("fmt", "e4m3") != "e4m3":
            die(f"quantization_config fmt {qc.get('fmt')!r}: only e4m3 is supported")
        wbs = qc.get("weight_block_size")
        if not (isinstance(wbs, list) and len(wbs) == 2 and all(isinstance(x, int) and x > 0 for x in wbs)):
            die(f"quantization_config weight_block_size {wbs!r}: need [rows, cols]")
        fp8_block = (wbs[0], wbs[1])
    elif F8 in src_dtypes:
        die("F8_E4M3 tensors but no quantization_config in config.json")
    scales = {n for n in where if n.endswith(".weight_scale_inv")}
    for n in sorted(scales):
        w8 = n[:-len("_scale_inv")]
        if fp8_block is None or w8 not in where or where[w8].header[w8]["dtype"] != F8:
            die(f"{n}: a scale without an F8_E4M3 {w8} (or no fp8 quantization_config)")
    for n in where:
        if where[n].header[n]["dtype"] == F8 and n + "_scale_inv" not in where:
            die(f"{n}: F8_E4M3 without {n}_scale_inv")

    def get(n) -> tuple[np.ndarray, bool]:
        """(array, is_bf16) of a checkpoint tensor; an FP8 weight comes back dequantized (f32)."""
        f = where[n]
        if f.header[n]["dtype"] == F8:
            sc, sb = where[n + "_scale_inv"].get(n + "_scale_inv")
            return fp8_dequantize(f.raw_u8(n), to_f32(sc, sb), fp8_block, n), False
        return f.get(n)

    layer_map = dict(LAYER_MAP)
    if is_moe:
        for k in DENSE_MLP:
            del layer_map[k]
        layer_map[MOE_ROUTER] = "ffn_gate_inp.weight"

    # map names first so that a missing or unknown tensor fails before anything is written.
    # plan entries: (gguf name, how): ("one", hf name) | ("stack", [hf names per expert]) |
    # ("fused", hf gate_up name, "gate" | "up") | ("one", hf fused down name)
    plan: list[tuple[str, tuple]] = []
    experts: dict[int, dict] = {}  # layer -> {"per": {(part, e): name}, "fused": {part: name}}
    for name in where:
        if name.endswith("rotary_emb.inv_freq") or name in scales:
            continue
        if name in TOP_MAP:
            if name == "lm_head.weight" and tied:
                continue
            plan.append((TOP_MAP[name], ("one", name)))
            continue
        m = LAYER_RE.match(name)
        if m:
            bid, rest = int(m.group(1)), m.group(2)
            if bid >= n_layer:
                die(f"{name}: layer {bid} >= num_hidden_layers {n_layer}")
            if rest in layer_map:
                plan.append((f"blk.{bid}.{layer_map[rest]}", ("one", name)))
                continue
            if is_moe and (em := EXPERT_RE.match(rest)):
                e = int(em.group(1))
                if e >= moe["n_expert"]:
                    die(f"{name}: expert {e} >= num_experts {moe['n_expert']}")
                experts.setdefault(bid, {"per": {}, "fused": {}})["per"][(em.group(2), e)] = name
                continue
            if is_moe and (fm := FUSED_RE.match(rest)):
                experts.setdefault(bid, {"per": {}, "fused": {}})["fused"][fm.group(1)] = name
                continue
            if is_moe and rest in DENSE_MLP:
                die(f"{name}: a dense MLP layer; llama.cpp's qwen3moe has a MoE FFN in every layer")
        die(f"unexpected tensor {name} (not part of a {hf_arch} checkpoint)")

    if is_moe:
        E, I = moe["n_expert"], moe["n_ff_exp"]

        def shape_of(n):
            return tuple(int(x) for x in where[n].header[n]["shape"])

        for bid in range(n_layer):
            ex = experts.get(bid, {"per": {}, "fused": {}})
            per, fused = ex["per"], ex["fused"]
            if per and fused:
                die(f"layer {bid}: both per-expert and fused expert tensors")
            if fused:
                if set(fused) != {"gate_up", "down"}:
                    die(f"layer {bid}: fused experts need both mlp.experts.gate_up_proj and down_proj, "
                        f"have {sorted(fused)}")
                gu, dn = fused["gate_up"], fused["down"]
                if shape_of(gu) != (E, 2 * I, n_embd):
                    die(f"{gu}: shape {list(shape_of(gu))}, expected [{E}, {2 * I}, {n_embd}]")
                if shape_of(dn) != (E, n_embd, I):
                    die(f"{dn}: shape {list(shape_of(dn))}, expected [{E}, {n_embd}, {I}]")
                plan.append((f"blk.{bid}.ffn_gate_exps.weight", ("fused", gu, "gate")))
                plan.append((f"blk.{bid}.ffn_up_exps.weight", ("fused", gu, "up")))
                plan.append((f"blk.{bid}.ffn_down_exps.weight", ("one", dn)))
            elif per:
                for part in ("gate", "up", "down"):
                    names = []
                    for e in range(E):
                        n = per.get((part, e))
                        if n is None:
                            die(f"layer {bid}: no model.layers.{bid}.mlp.experts.{e}.{part}_proj.weight")
                        want = (n_embd, I) if part == "down" else (I, n_embd)
                        if shape_of(n) != want:
                            die(f"{n}: shape {list(shape_of(n))}, expected {list(want)}")
                        names.append(n)
                    plan.append((f"blk.{bid}.ffn_{part}_exps.weight", ("stack", names)))
            rname = f"model.layers.{bid}.{MOE_ROUTER}"
            if rname in where and shape_of(rname) != (E, n_embd):
                die(f"{rname}: shape {list(shape_of(rname))}, expected [{E}, {n_embd}]")

    have = {g for g, _ in plan}
    if len(have) != len(plan):
        die("two checkpoint tensors map to the same GGUF tensor")
    need = {"token_embd.weight", "output_norm.weight"} | ({"output.weight"} if not tied else set())
    need |= {f"blk.{b}.{v}" for b in range(n_layer) for v in layer_map.values()}
    if is_moe:
        need |= {f"blk.{b}.ffn_{p}_exps.weight" for b in range(n_layer) for p in ("gate", "up", "down")}
    missing = sorted(need - have)
    if missing:
        die(f"checkpoint lacks tensors for {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")

    def order(item):
        g = item[0]
        if g.startswith("blk."):
            b, rest = g[4:].split(".", 1)
            return (1, int(b), rest)
        return (0 if g == "token_embd.weight" else 2, 0, g)

    plan.sort(key=order)

    tok = load_tokenizer(src, cfg, n_vocab, pre_override)

    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(src.name)
    w.add_file_type(int(ftype))
    w.add_context_length(ctx_len)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    if n_ff is not None:
        w.add_feed_forward_length(int(n_ff))
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(eps)
    if moe:
        w.add_expert_count(moe["n_expert"])
        w.add_expert_used_count(moe["n_expert_used"])
        w.add_expert_feed_forward_length(moe["n_ff_exp"])
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    if tok["bos"] is not None:
        w.add_bos_token_id(int(tok["bos"]))
    if tok["eos"] is not None:
        w.add_eos_token_id(int(tok["eos"]))
    if tok["pad"] is not None:
        w.add_pad_token_id(int(tok["pad"]))
    w.add_add_bos_token(tok["add_bos"])
    if tok["chat_template"]:
        w.add_chat_template(tok["chat_template"])

    def load(how) -> tuple[np.ndarray, bool, str]:
        """(array in the GGUF's numpy shape, is_bf16, source description)"""
        if how[0] == "one":
            arr, b = get(how[1])
            return arr, b, how[1]
        if how[0] == "stack":
            parts = [get(n) for n in how[1]]
            if len({b for _, b in parts}) != 1:
                die(f"{how[1][0]} ...: experts of one layer in different dtypes")
            return np.stack([a for a, _ in parts], axis=0), parts[0][1], re.sub(r"\.experts\.0\.", ".experts.*.", how[1][0])
        arr, b = get(how[1])  # fused gate_up [E, 2I, H]: gate rows first
        half = arr.shape[1] // 2
        sl = arr[:, :half, :] if how[2] == "gate" else arr[:, half:, :]
        return np.ascontiguousarray(sl), b, f"{how[1]}[:, {':' + str(half) if how[2] == 'gate' else str(half) + ':'}]"

    total = 0
    for g_name, how in plan:
        arr, is_bf16, what = load(how)
        # 1-D (norms) and the MoE router are always F32 (llama.cpp conversion/base.py prepare_tensors)
        if arr.ndim <= 1 or outtype == "f32" or g_name.endswith("ffn_gate_inp.weight"):
            data, kind = to_f32(arr, is_bf16), "f32"
            w.add_tensor(g_name, data)
        elif outtype == "q8_0" and arr.shape[-1] % QK8_0 == 0:
            # every other matrix, token_embd and output included (llama.cpp's converter's default)
            data, kind = q8_0_quantize(to_f32(arr, is_bf16)), "q8_0"
            w.add_tensor(g_name, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # byte shape
        elif outtype == "q8_0":  # llama.cpp: QuantError -> F16
            print(f"hf_to_gguf.py: warning: {g_name}: row length {arr.shape[-1]} is not a multiple of 32, "
                  "writing F16 (as llama.cpp's converter does)", file=sys.stderr)
            data, kind = to_f32(arr, is_bf16).astype(np.float16), "f16"
            w.add_tensor(g_name, data)
        else:
            data, kind = to_bf16(arr, is_bf16), "bf16"
            w.add_tensor(g_name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        total += data.nbytes
        if not quiet:
            print(f"  {what:52s} -> {g_name:28s} {kind:4s} {list(arr.shape)}")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    extra = (f", {moe['n_expert']} experts (top-{moe['n_expert_used']}, expert ffn {moe['n_ff_exp']})"
             if moe else "")
    print(f"wrote {shown or out}: {arch}, {n_layer} layers, hidden {n_embd}{extra}, vocab {n_vocab}, "
          f"{outtype}, {len(plan)} tensors, {total / 1e6:.1f} MB of weights, pre-tokenizer {tok['pre']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Hugging Face Qwen3 / Qwen3-MoE checkpoint -> GGUF (llama.cpp qwen3 / qwen3moe)")
    ap.add_argument("model_dir", type=Path, nargs="?",
                    help="checkpoint folder (config.json + safetensors + tokenizer.json)")
    ap.add_argument("outfile", type=Path, nargs="?", help="GGUF file to write")
    ap.add_argument("--outtype", choices=["auto", "f32", "bf16", "q8_0"], default="auto",
                    help="matrix dtype (default auto: bf16 for a bf16 checkpoint, else f32; q8_0: GGML "
                         "Q8_0 for every matrix incl. token_embd / output, as llama.cpp's converter)")
    ap.add_argument("--selftest", action="store_true",
                    help="check the Q8_0 quantizer against ggml's quantize_row_q8_0_ref and exit")
    ap.add_argument("--pre", default=None,
                    help="override tokenizer.ggml.pre (default: detected from tokenizer.json, e.g. qwen2)")
    ap.add_argument("-q", "--quiet", action="store_true", help="do not list the tensors")
    a = ap.parse_args(argv)
    if a.selftest:
        return selftest()
    if a.model_dir is None or a.outfile is None:
        ap.error("CHECKPOINT_DIR and OUT.gguf are required")
    if not (a.model_dir / "config.json").is_file():
        die(f"{a.model_dir}: no config.json")
    a.outfile.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.outfile.with_name(a.outfile.name + ".part")
    try:
        convert(a.model_dir, tmp, a.outtype, a.pre, a.quiet, shown=a.outfile)
        os.replace(tmp, a.outfile)
    finally:
        if tmp.exists():
            tmp.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
