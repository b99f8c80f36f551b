"""Independent float64 numpy reference for Qwen3 / Qwen3-MoE / Llama / Qwen2 causal LMs (Hugging Face layout).

Written from the published model semantics (see shared/reference/MODELS.md); standard library +
numpy only. Provides:

  * a strict safetensors reader (own parser) and writer (used by the tests to build or corrupt
    checkpoints),
  * checkpoint loading (config.json, model.safetensors or sharded index), with a strict check that
    the tensor set is exactly the expected Hugging Face set with the expected shapes and dtype,
  * RefModel: full causal forward in float64 with an optional KV cache,
    teacher-forced per-step log-probabilities, greedy decoding, and a no-cache brute-force decoder.

Semantics (per decoder layer, pre-norm residual):
    h = x + o_proj(attn(RoPE(qk_norm(q_proj(rms(x)))), RoPE(qk_norm(k_proj(rms(x)))), v_proj(rms(x))))
    y = h + down(silu(gate(rms(h))) * up(rms(h)))
RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w.  q_norm / k_norm (Qwen3 only) are RMSNorms over head_dim
shared by all heads, applied before RoPE.  RoPE is neox "rotate half" with
inv_freq[i] = theta^(-2i/hd), i in [0, hd/2), rescaled per rope type (rope_frequencies below:
linear, dynamic, llama3, yarn, from the formulas of transformers' modeling_rope_utils.py), with cos
and sin multiplied by the type's attention factor (yarn).  Attention: causal, GQA (query head h uses kv head
h // (nh/nkv)), scale hd^-0.5.  Final RMSNorm, lm_head (or embed_tokens when tied).
Biases: Qwen2 q/k/v; Llama q/k/v/o when attention_bias, gate/up/down when mlp_bias; Qwen3 (and
Qwen3-MoE) q/k/v/o when attention_bias.

Qwen3-MoE (Qwen3MoeForCausalLM) is Qwen3 except for the MLP of its sparse layers (see MOE_NOTES
below for the sources): layer l is sparse iff l not in mlp_only_layers, num_experts > 0 and
(l + 1) % decoder_sparse_step == 0; a dense layer is the Qwen3 MLP of intermediate_size.  A sparse
block on the post-attention-normed state x [T, H]:
    p = softmax(x @ gate.weight^T)                      over all E experts (float64 here)
    S = the k = num_experts_per_tok experts of largest p, ties to the lower expert id
    w = p[S] (/ sum(p[S]) when norm_topk_prob)
    out = sum_{e in S} w_e * down_e(silu(gate_e(x)) * up_e(x))     (SwiGLU of moe_intermediate_size)
"""

import json
import os
import struct

import numpy as np

ARCHS = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}

ST_MAX_HEADER = 100_000_000

# dtype name -> (numpy dtype used to view the raw little-endian bytes, width)
ST_DTYPES = {
    "BOOL": (np.dtype("u1"), 1),
    "U8": (np.dtype("u1"), 1),
    "I8": (np.dtype("i1"), 1),
    "F8_E4M3": (np.dtype("u1"), 1),
    "F8_E5M2": (np.dtype("u1"), 1),
    "I16": (np.dtype("<i2"), 2),
    "U16": (np.dtype("<u2"), 2),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I32": (np.dtype("<i4"), 4),
    "U32": (np.dtype("<u4"), 4),
    "F32": (np.dtype("<f4"), 4),
    "F64": (np.dtype("<f8"), 8),
    "I64": (np.dtype("<i8"), 8),
    "U64": (np.dtype("<u8"), 8),
}

TORCH_DTYPE_TO_ST = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


class FormatError(Exception):
    """A checkpoint that does not follow the expected format."""


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

class RawTensor:
    """One tensor as stored: dtype name, shape, raw little-endian bytes."""

    __slots__ = ("name", "dtype", "shape", "data")

    def __init__(self, name, dtype, shape, data):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self.data = bytes(data)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def to_f64(self):
        return decode_array(self.dtype, self.shape, self.data)


def decode_array(dtype, shape, data):
    """Raw bytes of a float tensor -> float64 numpy array of the given shape."""
    if dtype == "BF16":
        u16 = np.frombuffer(data, dtype="<u2")
        f32 = (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)
        arr = f32.astype(np.float64)
    elif dtype == "F16":
        arr = np.frombuffer(data, dtype="<f2").astype(np.float64)
    elif dtype == "F32":
        arr = np.frombuffer(data, dtype="<f4").astype(np.float64)
    elif dtype == "F64":
        arr = np.frombuffer(data, dtype="<f8").astype(np.float64)
    else:
        raise FormatError("unsupported float dtype %s" % dtype)
    return arr.reshape(shape)


def encode_array(dtype, arr):
    """float/int numpy array -> raw little-endian bytes in the given safetensors dtype."""
    arr = np.ascontiguousarray(arr)
    if dtype == "BF16":
        f32 = arr.astype(np.float32)
        u32 = f32.view(np.uint32).astype(np.uint64)
        # round to nearest even on the upper 16 bits (finite values only)
        rounded = (u32 + np.uint64(0x7FFF) + ((u32 >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        return rounded.astype("<u2").tobytes()
    if dtype == "F16":
        return arr.astype("<f2").tobytes()
    if dtype == "F32":
        return arr.astype("<f4").tobytes()
    if dtype == "F64":
        return arr.astype("<f8").tobytes()
    if dtype in ST_DTYPES:
        return arr.astype(ST_DTYPES[dtype][0]).tobytes()
    raise FormatError("unknown dtype %s" % dtype)


def round_to_dtype(dtype, arr):
    """What an array becomes after a store/load round trip in `dtype` (float64 result)."""
    return decode_array(dtype, np.shape(arr), encode_array(dtype, arr))


def read_safetensors(path):
    """Parses and validates a safetensors file. Returns (list of RawTensor in header order, metadata)."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise FormatError("%s: file too short (%d bytes)" % (path, len(buf)))
    (n,) = struct.unpack("<Q", buf[:8])
    if n > ST_MAX_HEADER or 8 + n > len(buf):
        raise FormatError("%s: bad header length %d (file %d bytes)" % (path, n, len(buf)))
    try:
        header = json.loads(buf[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: bad header JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise FormatError("%s: header is not an object" % path)
    meta = header.pop("__metadata__", None)
    data = buf[8 + n:]
    spans = []
    tensors = []
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = info["shape"]
            begin, end = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError("%s: tensor %s: malformed header entry" % (path, name))
        if dtype not in ST_DTYPES:
            raise FormatError("%s: tensor %s: unknown dtype %s" % (path, name, dtype))
        numel = 1
        for s in shape:
            if not isinstance(s, int) or s < 0:
                raise FormatError("%s: tensor %s: bad shape %r" % (path, name, shape))
            numel *= s
        if not (0 <= begin <= end <= len(data)):
            raise FormatError("%s: tensor %s: offsets [%d,%d) out of bounds" % (path, name, begin, end))
        if end - begin != numel * ST_DTYPES[dtype][1]:
            raise FormatError("%s: tensor %s: size %d != numel*width" % (path, name, end - begin))
        spans.append((begin, end, name))
        tensors.append(RawTensor(name, dtype, shape, data[begin:end]))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise FormatError("%s: tensor %s: data not contiguous (hole or overlap at %d)" % (path, name, pos))
        pos = end
    if pos != len(data):
        raise FormatError("%s: data section %d bytes but tensors cover %d" % (path, len(data), pos))
    return tensors, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes RawTensors (in the given order) as a valid safetensors file."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for t in tensors:
        nbytes = len(t.data)
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for t in tensors:
            f.write(t.data)


def checkpoint_files(model_dir):
    """Returns (dict name -> file name, index json or None) for a checkpoint directory."""
    idx_path = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(idx_path):
        with open(idx_path) as f:
            index = json.load(f)
        wm = index.get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise FormatError("%s: no weight_map" % idx_path)
        return dict(wm), index
    if os.path.exists(single):
        return None, None
    raise FormatError("%s: neither model.safetensors nor model.safetensors.index.json" % model_dir)


def read_checkpoint_tensors(model_dir):
    """All tensors of a checkpoint as {name: RawTensor}, validating the index against the shards."""
    wm, index = checkpoint_files(model_dir)
    out = {}
    if wm is None:
        tensors, _ = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        for t in tensors:
            out[t.name] = t
        return out
    total = 0
    for fname in sorted(set(wm.values())):
        tensors, _ = read_safetensors(os.path.join(model_dir, fname))
        for t in tensors:
            if t.name in out:
                raise FormatError("tensor %s stored twice" % t.name)
            if wm.get(t.name) != fname:
                raise FormatError("tensor %s is in %s but the index maps it to %s" % (t.name, fname, wm.get(t.name)))
            out[t.name] = t
            total += len(t.data)
    for name in wm:
        if name not in out:
            raise FormatError("index lists %s but no shard holds it" % name)
    ts = index.get("metadata", {}).get("total_size")
    if ts is not None and int(ts) != total:
        raise FormatError("index metadata.total_size %s != %d bytes of tensor data" % (ts, total))
    return out


# ---------------------------------------------------------------------------------------------
# config and parameter table
# ---------------------------------------------------------------------------------------------

def read_geometry(cfg, d):
    """The transformer geometry every config.json shares (targets and drafters) onto cfg."""
    cfg.raw = d
    cfg.hidden = int(d["hidden_size"])
    cfg.inter = int(d["intermediate_size"])
    cfg.layers = int(d["num_hidden_layers"])
    cfg.heads = int(d["num_attention_heads"])
    cfg.kv_heads = int(d.get("num_key_value_heads") or cfg.heads)
    hd = d.get("head_dim")
    cfg.head_dim = int(hd) if hd is not None else cfg.hidden // cfg.heads
    cfg.vocab = int(d["vocab_size"])
    cfg.eps = float(d["rms_norm_eps"])


def rope_settings(d):
    """(theta, rope dict or None) from config.json: rope_parameters (transformers 5) or rope_theta +
    rope_scaling (transformers 4)."""
    rp = d.get("rope_parameters")
    rs = d.get("rope_scaling")
    p = rp if rp is not None else rs
    theta = d.get("rope_theta")
    if p is not None and p.get("rope_theta") is not None:
        theta = p["rope_theta"]
    return float(theta if theta is not None else 10000.0), p


def rope_frequencies(theta, p, head_dim, max_pos):
    """(inv_freq [hd/2] float64, attention_factor) for rope dict p (None: plain RoPE).
    Written from the published formulas (transformers' _compute_*_parameters):
      linear: inv / factor
      dynamic: the default table while the sequence fits max_position_embeddings (always, here)
      llama3: wavelength bands around original_max_position_embeddings / {low,high}_freq_factor
      yarn: ramp blend of inv and inv / factor between the beta_fast / beta_slow correction dims,
            attention factor 0.1 ln(factor) + 1 (or mscale ratio, or given)."""
    d = head_dim
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    kind = "default" if p is None else p.get("rope_type", p.get("type", "default"))
    if kind in ("default", "dynamic"):
        return inv, 1.0
    if kind == "linear":
        return inv / float(p["factor"]), 1.0
    if kind == "llama3":
        f, lo, hi = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p["original_max_position_embeddings"])
        wl = 2 * np.pi / inv
        smooth = (old / wl - lo) / (hi - lo)
        out = np.where(wl > old / lo, inv / f, inv)
        mid = (wl >= old / hi) & (wl <= old / lo)
        out = np.where(mid, (1 - smooth) * inv / f + smooth * inv, out)
        return out, 1.0
    if kind == "yarn":
        old = float(p.get("original_max_position_embeddings") or max_pos)
        f = p.get("factor")
        f = float(f) if f is not None else max_pos / old

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * np.log(s) + 1.0
        af = p.get("attention_factor")
        if af is None:
            ms, msa = p.get("mscale"), p.get("mscale_all_dim")
            af = mscale(f, ms) / mscale(f, msa) if ms and msa else mscale(f)
        bf, bs = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def corr_dim(rot):
            return d * np.log(old / (rot * 2 * np.pi)) / (2 * np.log(theta))
        low, high = corr_dim(bf), corr_dim(bs)
        if p.get("truncate", True):
            low, high = np.floor(low), np.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        keep = 1 - ramp                      # weight of the unscaled frequency
        return inv / f * (1 - keep) + inv * keep, float(af)
    raise FormatError("rope_type %r not supported by the reference" % (kind,))


# ---------------------------------------------------------------------------------------------
# Qwen3-MoE
# ---------------------------------------------------------------------------------------------
#
# MOE_NOTES -- what the Qwen3-MoE part below is written from (huggingface/transformers):
#  * src/transformers/models/qwen3_moe/modeling_qwen3_moe.py @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015
#    (transformers 4.x): Qwen3MoeDecoderLayer picks Qwen3MoeSparseMoeBlock iff
#    `layer_idx not in config.mlp_only_layers and config.num_experts > 0 and
#    (layer_idx + 1) % config.decoder_sparse_step == 0`, else Qwen3MoeMLP(intermediate_size).
#    Qwen3MoeSparseMoeBlock: gate = nn.Linear(H, E, bias=False) (-> mlp.gate.weight [E, H]),
#    experts = nn.ModuleList of Qwen3MoeMLP(moe_intermediate_size) (-> mlp.experts.<e>.gate_proj /
#    up_proj / down_proj .weight, [I, H] / [I, H] / [H, I]); forward: routing_weights =
#    softmax(router_logits, dim=1, dtype=float32); topk(routing_weights, top_k); when
#    norm_topk_prob: divided by their sum; cast to the hidden dtype; out = sum of
#    expert(x) * weight, added to the residual by the decoder layer.
#  * the transformers 5 form of the same file (read in the transformers 5.25.0 wheel from PyPI,
#    models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeExperts / Qwen3MoeTopKRouter, @use_experts_implementation):
#    gate_up_proj = nn.Parameter([E, 2 * moe_intermediate_size, H]), down_proj = nn.Parameter([E, H, I])
#    (parameters, so no ".weight" suffix: mlp.experts.gate_up_proj / mlp.experts.down_proj);
#    `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`: the first I rows are the gate, the
#    next I the up; Qwen3MoeTopKRouter holds `weight` [E, H] under mlp.gate (-> mlp.gate.weight),
#    softmax in float32, topk, optional renormalisation -- the same numbers as 4.x.
#  * src/transformers/conversion_mapping.py @ 000c33fdfde12e1ffafbfcdb3c926df5727a00b6 (transformers 5):
#    mapping["qwen3_moe"] = mapping["qwen2_moe"]: "mlp.experts.*.gate_proj.weight" +
#    "mlp.experts.*.up_proj.weight" -> "mlp.experts.gate_up_proj" by MergeModulelist(dim=0) then
#    Concatenate(dim=1) (so gate_up_proj[e] = cat(gate_e, up_e) along the rows), and
#    "mlp.experts.*.down_proj.weight" -> "mlp.experts.down_proj" by MergeModulelist(dim=0).  So
#    transformers 5 loads the per-expert (4.x / Qwen's published) layout too.
#  * src/transformers/models/qwen3_moe/configuration_qwen3_moe.py @ 008e574391258935f3ecc3035c882e73bbcac419:
#    defaults num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768,
#    norm_topk_prob False, decoder_sparse_step 1, mlp_only_layers None -> [] (Qwen3-30B-A3B's
#    config.json sets norm_topk_prob true); router_aux_loss_coef / output_router_logits are
#    training-only.  That (recent) version also has attribute_map {"num_experts": "num_local_experts"},
#    so a config.json saved by it may name the count num_local_experts: read as an alias here
#    (checked with 5.25.0: save_pretrained writes "num_local_experts" and no "num_experts", and the
#    per-expert tensor names; 5.25.0's conversion_mapping.py maps "qwen3_moe" to "qwen2_moe"'s rules).
#  torch.topk does not document its order among equal values; the reference breaks ties to the
#  lower expert id (a stable sort of -p).

MOE_DEFAULTS = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                "norm_topk_prob": False, "decoder_sparse_step": 1}


def _cfg_int(d, key, default, lo):
    v = d.get(key)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise FormatError("config.json: %s = %r: expected an integer >= %d" % (key, v, lo))
    return v


def read_moe(cfg, d):
    """The Qwen3MoeConfig fields onto cfg: n_experts, experts_per_tok, moe_inter, norm_topk,
    sparse_step, mlp_only (list), sparse (per-layer bool)."""
    ne, nle = d.get("num_experts"), d.get("num_local_experts")
    if ne is not None and nle is not None and ne != nle:
        raise FormatError("config.json: num_experts %r and num_local_experts %r differ" % (ne, nle))
    src = dict(d)
    if ne is None and nle is not None:
        src["num_experts"] = nle
    cfg.n_experts = _cfg_int(src, "num_experts", MOE_DEFAULTS["num_experts"], 0)
    cfg.experts_per_tok = _cfg_int(d, "num_experts_per_tok", MOE_DEFAULTS["num_experts_per_tok"], 1)
    cfg.moe_inter = _cfg_int(d, "moe_intermediate_size", MOE_DEFAULTS["moe_intermediate_size"], 1)
    cfg.sparse_step = _cfg_int(d, "decoder_sparse_step", MOE_DEFAULTS["decoder_sparse_step"], 1)
    nt = d.get("norm_topk_prob", MOE_DEFAULTS["norm_topk_prob"])
    if not isinstance(nt, bool):
        raise FormatError("config.json: norm_topk_prob = %r: expected a boolean" % (nt,))
    cfg.norm_topk = nt
    mo = d.get("mlp_only_layers")
    mo = [] if mo is None else mo
    if not isinstance(mo, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in mo):
        raise FormatError("config.json: mlp_only_layers = %r: expected a list of layer indices" % (mo,))
    cfg.mlp_only = list(mo)
    if cfg.n_experts > 0 and cfg.experts_per_tok > cfg.n_experts:
        # torch.topk would raise (k out of range)
        raise FormatError("config.json: num_experts_per_tok %d > num_experts %d" % (cfg.experts_per_tok, cfg.n_experts))
    cfg.sparse = [(l not in cfg.mlp_only) and cfg.n_experts > 0 and (l + 1) % cfg.sparse_step == 0
                  for l in range(cfg.layers)]


def route(x, gate_w, k, norm):
    """Router of a sparse block. x [T, H], gate_w [E, H] -> (probabilities [T, E], chosen ids [T, k]
    in order of decreasing probability (ties: lower id first), weights [T, k])."""
    # einsum's own loop, not x @ gate_w.T: a BLAS (OpenBLAS, once installed, is what numpy's
    # matmul calls) may compute two equal rows of gate_w in different kernels (an edge tile), so
    # experts with byte-equal router rows would not tie exactly (test_moe_reference's router_tie)
    logits = np.einsum("th,eh->te", x, gate_w, optimize=False)
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p = p / p.sum(axis=-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")          # stable: equal p keep id order
    sel = order[:, :k]
    w = np.take_along_axis(p, sel, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    return p, sel, w


def moe_block(x, gate_w, wg, wu, wd, k, norm):
    """x [T, H]; wg / wu [E, I, H]; wd [E, H, I]. Returns sum_e w_e * down_e(silu(gate_e x) * up_e x)."""
    _, sel, w = route(x, gate_w, k, norm)
    out = np.zeros_like(x)
    for e in np.unique(sel):
        rows, slot = np.nonzero(sel == e)
        xe = x[rows]
        h = silu(xe @ wg[e].T) * (xe @ wu[e].T)
        out[rows] += w[rows, slot][:, None] * (h @ wd[e].T)
    return out


def router_margins(p, k):
    """Per token: p_(k) - p_(k+1), the gap between the last chosen and the first unchosen expert
    probability (inf when k == E). A tiny gap means a routing decision that rounding can flip."""
    if k >= p.shape[-1]:
        return np.full(p.shape[0], np.inf)
    s = -np.sort(-p, axis=-1)
    return s[:, k - 1] - s[:, k]


class Config:
    def __init__(self, d):
        archs = d.get("architectures") or []
        if len(archs) != 1 or archs[0] not in ARCHS:
            raise FormatError("unsupported architectures %r" % (archs,))
        self.arch = ARCHS[archs[0]]
        read_geometry(self, d)
        self.theta, self.rope = rope_settings(d)
        self.max_pos = int(d.get("max_position_embeddings", 4096))
        self.tie = bool(d.get("tie_word_embeddings", False))
        self.torch_dtype = d.get("torch_dtype", d.get("dtype"))
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise FormatError("hidden_act %r not supported by the reference" % act)
        if float((self.rope or {}).get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))) != 1.0:
            raise FormatError("partial_rotary_factor not supported by the reference")
        if self.heads % self.kv_heads != 0:
            raise FormatError("num_attention_heads %d not a multiple of num_key_value_heads %d"
                              % (self.heads, self.kv_heads))
        if self.head_dim % 2 != 0:
            raise FormatError("odd head_dim %d" % self.head_dim)
        attn_bias = bool(d.get("attention_bias", False))
        self.qkv_bias = self.arch == "qwen2" or attn_bias
        self.o_bias = self.arch in ("llama", "qwen3", "qwen3_moe") and attn_bias
        self.mlp_bias = self.arch == "llama" and bool(d.get("mlp_bias", False))
        self.qk_norm = self.arch in ("qwen3", "qwen3_moe")
        self.sparse = [False] * self.layers
        if self.arch == "qwen3_moe":
            read_moe(self, d)

    def is_moe(self):
        return any(self.sparse)

    def expected_tensors(self, moe_layout="per_expert"):
        """{name: shape} of exactly the tensors a checkpoint of this config must contain.
        moe_layout (sparse layers only): "per_expert" (transformers 4 / Qwen's checkpoints:
        mlp.experts.<e>.{gate,up,down}_proj.weight) or "fused" (transformers 5 parameters:
        mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I])."""
        if moe_layout not in ("per_expert", "fused"):
            raise ValueError("moe_layout %r" % (moe_layout,))
        H, I, V, hd = self.hidden, self.inter, self.vocab, self.head_dim
        nq, nkv = self.heads * hd, self.kv_heads * hd
        e = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
        if not self.tie:
            e["lm_head.weight"] = (V, H)
        for l in range(self.layers):
            p = "model.layers.%d." % l
            e[p + "input_layernorm.weight"] = (H,)
            e[p + "post_attention_layernorm.weight"] = (H,)
            e[p + "self_attn.q_proj.weight"] = (nq, H)
            e[p + "self_attn.k_proj.weight"] = (nkv, H)
            e[p + "self_attn.v_proj.weight"] = (nkv, H)
            e[p + "self_attn.o_proj.weight"] = (H, nq)
            if self.qkv_bias:
                e[p + "self_attn.q_proj.bias"] = (nq,)
                e[p + "self_attn.k_proj.bias"] = (nkv,)
                e[p + "self_attn.v_proj.bias"] = (nkv,)
            if self.o_bias:
                e[p + "self_attn.o_proj.bias"] = (H,)
            if self.qk_norm:
                e[p + "self_attn.q_norm.weight"] = (hd,)
                e[p + "self_attn.k_norm.weight"] = (hd,)
            if self.sparse[l]:
                E, MI = self.n_experts, self.moe_inter
                e[p + "mlp.gate.weight"] = (E, H)
                if moe_layout == "fused":
                    e[p + "mlp.experts.gate_up_proj"] = (E, 2 * MI, H)
                    e[p + "mlp.experts.down_proj"] = (E, H, MI)
                else:
                    for x in range(E):
                        q = p + "mlp.experts.%d." % x
                        e[q + "gate_proj.weight"] = (MI, H)
                        e[q + "up_proj.weight"] = (MI, H)
                        e[q + "down_proj.weight"] = (H, MI)
                continue
            e[p + "mlp.gate_proj.weight"] = (I, H)
            e[p + "mlp.up_proj.weight"] = (I, H)
            e[p + "mlp.down_proj.weight"] = (H, I)
            if self.mlp_bias:
                e[p + "mlp.gate_proj.bias"] = (I,)
                e[p + "mlp.up_proj.bias"] = (I,)
                e[p + "mlp.down_proj.bias"] = (H,)
        return e


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return Config(json.load(f))


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def log_softmax(logits):
    m = np.max(logits, axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def moe_layout_of(raw):
    """"fused" when the checkpoint holds transformers 5's fused expert parameters, else "per_expert"
    (the strict tensor-set check then rejects a checkpoint that mixes the two)."""
    fused = any(n.endswith(".mlp.experts.gate_up_proj") or n.endswith(".mlp.experts.down_proj") for n in raw)
    return "fused" if fused else "per_expert"


def expert_arrays(w, cfg, l, layout):
    """(gate_w [E, H], wg [E, I, H], wu [E, I, H], wd [E, H, I]) of sparse layer l from the loaded
    float64 tensors w, in either layout."""
    p = "model.layers.%d.mlp." % l
    E, I = cfg.n_experts, cfg.moe_inter
    if layout == "fused":
        gu = w[p + "experts.gate_up_proj"]
        return w[p + "gate.weight"], gu[:, :I, :], gu[:, I:, :], w[p + "experts.down_proj"]
    wg = np.stack([w[p + "experts.%d.gate_proj.weight" % e] for e in range(E)])
    wu = np.stack([w[p + "experts.%d.up_proj.weight" % e] for e in range(E)])
    wd = np.stack([w[p + "experts.%d.down_proj.weight" % e] for e in range(E)])
    return w[p + "gate.weight"], wg, wu, wd


def convert_moe_layout(tensors, cfg, to):
    """RawTensors of a Qwen3-MoE checkpoint (a list, or dict name -> RawTensor) converted to layout
    `to` ("fused" / "per_expert") byte for byte (same dtype, no rounding); a list in the order of
    cfg.expected_tensors(to). Fusing follows conversion_mapping.py: gate_up_proj[e] = gate_e rows
    then up_e rows; down_proj[e] = down_e."""
    by = tensors if isinstance(tensors, dict) else {t.name: t for t in tensors}
    out = []
    for name, shape in cfg.expected_tensors(to).items():
        if name in by:
            out.append(by[name])
            continue
        l = int(name.split(".")[2])
        p = "model.layers.%d.mlp.experts." % l
        E, I = cfg.n_experts, cfg.moe_inter
        if to == "fused":
            dt = by[p + "0.gate_proj.weight"].dtype
            if name.endswith("gate_up_proj"):
                data = b"".join(by[p + "%d.gate_proj.weight" % e].data + by[p + "%d.up_proj.weight" % e].data
                                for e in range(E))
            else:
                data = b"".join(by[p + "%d.down_proj.weight" % e].data for e in range(E))
            out.append(RawTensor(name, dt, shape, data))
        else:
            e, part = int(name.split(".")[5]), name.split(".")[6]
            if part in ("gate_proj", "up_proj"):
                t = by[p + "gate_up_proj"]
                rb = len(t.data) // (E * 2 * I)          # bytes per row of H values
                base = e * 2 * I * rb + (0 if part == "gate_proj" else I * rb)
                out.append(RawTensor(name, t.dtype, shape, t.data[base:base + I * rb]))
            else:
                t = by[p + "down_proj"]
                nb = len(t.data) // E
                out.append(RawTensor(name, t.dtype, shape, t.data[e * nb:(e + 1) * nb]))
    return out


class KVCache:
    def __init__(self, cfg):
        self.k = [np.zeros((cfg.kv_heads, 0, cfg.head_dim)) for _ in range(cfg.layers)]
        self.v = [np.zeros((cfg.kv_heads, 0, cfg.head_dim)) for _ in range(cfg.layers)]

    def length(self):
        return self.k[0].shape[1] if self.k else 0


class RefModel:
    def __init__(self, model_dir, strict=True):
        self.dir = model_dir
        self.cfg = load_config(model_dir)
        raw = read_checkpoint_tensors(model_dir)
        cfg = self.cfg
        self.moe_layout = moe_layout_of(raw) if cfg.is_moe() else None
        expected = cfg.expected_tensors(self.moe_layout or "per_expert")
        if strict:
            want_dt = TORCH_DTYPE_TO_ST.get(cfg.torch_dtype)
            missing = sorted(set(expected) - set(raw))
            extra = sorted(set(raw) - set(expected))
            if missing:
                raise FormatError("missing tensor(s): %s" % ", ".join(missing))
            if extra:
                raise FormatError("unexpected tensor(s): %s" % ", ".join(extra))
            for name, shape in expected.items():
                if raw[name].shape != tuple(shape):
                    raise FormatError("tensor %s has shape %s, expected %s" % (name, raw[name].shape, shape))
                if want_dt is not None and raw[name].dtype != want_dt:
                    raise FormatError("tensor %s has dtype %s but torch_dtype is %s"
                                      % (name, raw[name].dtype, cfg.torch_dtype))
        self.w = {}
        for name in expected:
            if name not in raw:
                raise FormatError("missing tensor %s" % name)
            self.w[name] = raw[name].to_f64()
        self.lm_head = self.w["lm_head.weight"] if not cfg.tie else self.w["model.embed_tokens.weight"]
        # sparse layer l -> (gate_w [E, H], wg [E, I, H], wu [E, I, H], wd [E, H, I]) whatever the layout
        self.experts = {}
        for l in range(cfg.layers):
            if cfg.sparse[l]:
                self.experts[l] = expert_arrays(self.w, cfg, l, self.moe_layout)
        hd = cfg.head_dim
        self.inv_freq, self.attn_factor = rope_frequencies(cfg.theta, cfg.rope, hd, cfg.max_pos)

    # -- pieces ----------------------------------------------------------------------------------
    def _lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        if b is not None:
            y = y + b
        return y

    def _rope(self, x, positions):
        """x: [heads, T, hd]; neox rotate-half."""
        ang = np.asarray(positions, dtype=np.float64)[:, None] * self.inv_freq[None, :]   # [T, hd/2]
        cos = np.cos(np.concatenate([ang, ang], axis=-1))[None] * self.attn_factor
        sin = np.sin(np.concatenate([ang, ang], axis=-1))[None] * self.attn_factor
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def forward(self, ids, cache=None, return_hidden=False, router=None):
        """Runs tokens `ids` at positions cache.length().. (0.. without cache).
        Returns logits [T, V] (float64); appends K/V to the cache when given. router: a dict that
        receives, per sparse layer l, route()'s (probabilities, chosen ids, weights) of these tokens."""
        cfg = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= cfg.vocab:
            raise ValueError("token id out of range")
        start = cache.length() if cache is not None else 0
        T = len(ids)
        pos = np.arange(start, start + T)
        nh, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        group = nh // nkv
        scale = hd ** -0.5
        x = self.w["model.embed_tokens.weight"][ids]                       # [T, H]
        hiddens = []
        for l in range(cfg.layers):
            p = "model.layers.%d." % l
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], cfg.eps)
            q = self._lin(h, p + "self_attn.q_proj").reshape(T, nh, hd).transpose(1, 0, 2)
            k = self._lin(h, p + "self_attn.k_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
            v = self._lin(h, p + "self_attn.v_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
            if cfg.qk_norm:
                q = rms_norm(q, self.w[p + "self_attn.q_norm.weight"], cfg.eps)
                k = rms_norm(k, self.w[p + "self_attn.k_norm.weight"], cfg.eps)
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            if cache is not None:
                k = np.concatenate([cache.k[l], k], axis=1)
                v = np.concatenate([cache.v[l], v], axis=1)
                cache.k[l], cache.v[l] = k, v
            S = k.shape[1]                                                 # start + T
            kk = np.repeat(k, group, axis=0)                               # [nh, S, hd]
            vv = np.repeat(v, group, axis=0)
            scores = np.einsum("htd,hsd->hts", q, kk) * scale              # [nh, T, S]
            mask = np.arange(S)[None, :] > pos[:, None]                    # key after query
            scores = np.where(mask[None], -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            pr = np.exp(scores)
            pr = pr / pr.sum(axis=-1, keepdims=True)
            att = np.einsum("hts,hsd->htd", pr, vv).transpose(1, 0, 2).reshape(T, nh * hd)
            x = x + self._lin(att, p + "self_attn.o_proj")
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], cfg.eps)
            if cfg.sparse[l]:
                x = x + moe_block(h, *self.experts[l], cfg.experts_per_tok, cfg.norm_topk)
            else:
                m = silu(self._lin(h, p + "mlp.gate_proj")) * self._lin(h, p + "mlp.up_proj")
                x = x + self._lin(m, p + "mlp.down_proj")
            if router is not None and cfg.sparse[l]:
                router[l] = route(h, self.experts[l][0], cfg.experts_per_tok, cfg.norm_topk)
            hiddens.append(x)
        x = rms_norm(x, self.w["model.norm.weight"], cfg.eps)
        logits = x @ self.lm_head.T
        if return_hidden:
            return logits, hiddens
        return logits

    # -- generation-level helpers ----------------------------------------------------------------
    def step_logprobs(self, prompt, generated):
        """Teacher forcing over prompt + generated in one pass. Returns float64 [len(generated), V]:
        row i is log_softmax of the logits that predict generated[i]."""
        prompt = list(prompt)
        generated = list(generated)
        seq = prompt + generated[:-1] if generated else prompt
        logits = self.forward(seq)
        return log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + len(generated)])

    def step_logits(self, prompt, generated):
        prompt = list(prompt)
        generated = list(generated)
        seq = prompt + generated[:-1] if generated else prompt
        logits = self.forward(seq)
        return logits[len(prompt) - 1:len(prompt) - 1 + len(generated)]

    def greedy(self, prompt, n):
        """Greedy decoding with a KV cache. Returns (tokens, logits rows [n, V])."""
        cache = KVCache(self.cfg)
        logits = self.forward(list(prompt), cache)[-1]
        toks, rows = [], []
        for i in range(n):
            t = int(np.argmax(logits))
            toks.append(t)
            rows.append(logits)
            if i + 1 < n:
                logits = self.forward([t], cache)[-1]
        return toks, np.array(rows)

    def greedy_bruteforce(self, prompt, n):
        """Greedy decoding without a cache: recomputes the whole prefix every step."""
        seq = list(prompt)
        toks, rows = [], []
        for _ in range(n):
            logits = self.forward(seq)[-1]
            t = int(np.argmax(logits))
            toks.append(t)
            rows.append(logits)
            seq.append(t)
        return toks, np.array(rows)


def top2_gap(logits_row):
    s = np.sort(np.asarray(logits_row))
    return float(s[-1] - s[-2])


# ---------------------------------------------------------------------------------------------
# building checkpoints (self-check and test helpers)
# ---------------------------------------------------------------------------------------------

def make_config_dict(arch, hidden, layers, heads, kv_heads, head_dim, inter, vocab, tie, dtype="bfloat16",
                     theta=1000000.0, eps=1e-6, attention_bias=False, experts=8, experts_per_tok=2,
                     moe_inter=16, norm_topk=True, sparse_step=1, mlp_only=()):
    """A config.json dict; the MoE arguments are used for arch "qwen3_moe" only."""
    name = {v: k for k, v in ARCHS.items()}[arch]
    d = {
        "architectures": [name],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": dtype,
        "hidden_act": "silu",
        "rope_scaling": None,
    }
    if arch == "llama":
        d["attention_bias"] = attention_bias
    if arch == "qwen3_moe":
        d.update({"attention_bias": attention_bias, "num_experts": experts, "num_experts_per_tok": experts_per_tok,
                  "moe_intermediate_size": moe_inter, "norm_topk_prob": norm_topk,
                  "decoder_sparse_step": sparse_step, "mlp_only_layers": list(mlp_only),
                  "router_aux_loss_coef": 0.001, "output_router_logits": False})
    return d


def write_random_checkpoint(out_dir, cfg_dict, seed=0, shards=1, std=0.3, moe_layout="per_expert"):
    """Writes config.json and random weights (norm weights around 1, non-zero biases). Returns cfg.
    Qwen3-MoE: the weights are drawn in the per-expert layout, then converted when moe_layout is
    "fused", so both layouts of one seed hold the same numbers."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = Config(cfg_dict)
    st_dt = TORCH_DTYPE_TO_ST[cfg_dict["torch_dtype"]]
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape in cfg.expected_tensors().items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.2 * rng.standard_normal(shape)
        elif name.endswith("embed_tokens.weight"):
            a = rng.standard_normal(shape)
        else:
            a = std * rng.standard_normal(shape) / np.sqrt(shape[-1]) * 3.0
        tensors.append(RawTensor(name, st_dt, shape, encode_array(st_dt, a)))
    if cfg.is_moe() and moe_layout != "per_expert":
        tensors = convert_moe_layout(tensors, cfg, moe_layout)
    write_sharded(out_dir, tensors, shards)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    return cfg


def write_sharded(out_dir, tensors, shards):
    """Writes tensors as model.safetensors (shards == 1) or N shards + index."""
    for fn in os.listdir(out_dir):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, fn))
    if shards == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
        return
    groups = [tensors[i::shards] for i in range(shards)]
    wm = {}
    total = 0
    for k, g in enumerate(groups):
        fn = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        write_safetensors(os.path.join(out_dir, fn), g, {"format": "pt"})
        for t in g:
            wm[t.name] = fn
            total += len(t.data)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)
