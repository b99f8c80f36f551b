"""PyTorch models for training the default pair: a Qwen3 target, a DFlash drafter and a DSpark
drafter, written from the published model math (transformers' Qwen3, z-lab/dflash, DeepSpec) and
saved in their Hugging Face checkpoint layouts, which graphswap loads.

Math (docs/DESIGN.md and docs/MODELS.md of the repository say the same):
  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w, in fp32.
  RoPE: neox rotate-half, inv_freq = theta^(-2i/hd), cos/sin in fp32.
  Qwen3 layer: h = x + o(attn(RoPE(q_norm(q(rms(x)))), RoPE(k_norm(k(rms(x)))), v(rms(x))))
               y = h + down(silu(gate(rms(h))) * up(rms(h)));  GQA, causal, scale hd^-0.5.
  Drafter (DFlash and DSpark backbone): context row c_t = hidden_norm(fc(concat_j hs_j[t])), where
  hs_j is the target's residual stream after layer j; every drafter layer attends (non-causally)
  over K/V of the context rows < start (k_proj/k_norm/v_proj of c_t, no input norm) and of its own
  block [anchor, MASK * (B-1)] at positions start..start+B-1.
  DFlash: slot i (1..B-1) predicts the token at start+i, through the target's lm_head.
  DSpark: slot k (0..B-1) predicts the token at start+k+1, through its own lm_head plus the Markov
  bias w2(w1[prev]); the confidence head sigmoid(proj([h_k ; w1[prev_k]])) predicts that draft k
  is accepted given that drafts 0..k-1 were.
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Geo:
    def __init__(self, hidden, inter, layers, heads, kv_heads, head_dim, vocab, eps=1e-6, theta=10000.0):
        self.hidden, self.inter, self.layers = hidden, inter, layers
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.vocab, self.eps, self.theta = vocab, eps, theta


def rms(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_cs(pos, hd, theta):
    """cos, sin [.., T, hd] for integer positions pos [.., T]."""
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    f = pos.float()[..., None] * inv
    f = torch.cat([f, f], -1)
    return f.cos(), f.sin()


def rope(x, cos, sin):
    """x [N, heads, T, hd]; cos/sin [N or 1, T, hd]."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos[:, None] + rot * sin[:, None]


class Layer(nn.Module):
    def __init__(self, g):
        super().__init__()
        H, I, hd = g.hidden, g.inter, g.head_dim
        self.g = g
        self.input_layernorm = nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = nn.Parameter(torch.ones(H))
        self.q_proj = nn.Linear(H, g.heads * hd, bias=False)
        self.k_proj = nn.Linear(H, g.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(H, g.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(g.heads * hd, H, bias=False)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def names(self, pre):
        """HF tensor name -> parameter."""
        a, m = pre + "self_attn.", pre + "mlp."
        return {pre + "input_layernorm.weight": self.input_layernorm,
                pre + "post_attention_layernorm.weight": self.post_attention_layernorm,
                a + "q_proj.weight": self.q_proj.weight, a + "k_proj.weight": self.k_proj.weight,
                a + "v_proj.weight": self.v_proj.weight, a + "o_proj.weight": self.o_proj.weight,
                a + "q_norm.weight": self.q_norm, a + "k_norm.weight": self.k_norm,
                m + "gate_proj.weight": self.gate_proj.weight, m + "up_proj.weight": self.up_proj.weight,
                m + "down_proj.weight": self.down_proj.weight}

    def kv(self, x, cos, sin):
        """K, V [N, kv_heads, T, hd] of rows x [N, T, H] (already normed as the caller wants)."""
        g = self.g
        N, T, _ = x.shape
        k = self.k_proj(x).view(N, T, g.kv_heads, g.head_dim)
        k = rope(rms(k, self.k_norm, g.eps).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(N, T, g.kv_heads, g.head_dim).transpose(1, 2)
        return k, v

    def forward(self, x, cos, sin, ctx_kv=None, mask=None, causal=False):
        """x [N, T, H]. ctx_kv: extra (K, V) placed before the rows' own keys; mask [T, Tk] bool."""
        g = self.g
        N, T, _ = x.shape
        h = rms(x, self.input_layernorm, g.eps)
        q = self.q_proj(h).view(N, T, g.heads, g.head_dim)
        q = rope(rms(q, self.q_norm, g.eps).transpose(1, 2), cos, sin)
        k, v = self.kv(h, cos, sin)
        if ctx_kv is not None:
            k = torch.cat([ctx_kv[0], k], 2)
            v = torch.cat([ctx_kv[1], v], 2)
        rep = g.heads // g.kv_heads
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        x = x + self.o_proj(a.transpose(1, 2).reshape(N, T, g.heads * g.head_dim))
        h = rms(x, self.post_attention_layernorm, g.eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Target(nn.Module):
    def __init__(self, g, tie=True):
        super().__init__()
        self.g, self.tie = g, tie
        self.embed_tokens = nn.Embedding(g.vocab, g.hidden)
        self.layers = nn.ModuleList(Layer(g) for _ in range(g.layers))
        self.norm = nn.Parameter(torch.ones(g.hidden))
        self.lm_head = None if tie else nn.Linear(g.hidden, g.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        for l in self.layers:  # scaled init of the residual writers (GPT-2 style)
            nn.init.normal_(l.o_proj.weight, std=0.02 / math.sqrt(2 * g.layers))
            nn.init.normal_(l.down_proj.weight, std=0.02 / math.sqrt(2 * g.layers))

    def head_weight(self):
        return self.embed_tokens.weight if self.tie else self.lm_head.weight

    def names(self):
        d = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm}
        for i, l in enumerate(self.layers):
            d.update(l.names(f"model.layers.{i}."))
        if not self.tie:
            d["lm_head.weight"] = self.lm_head.weight
        return d

    def forward(self, ids, feat_ids=(), logits=True):
        """ids [N, T] -> (final hidden normed [N, T, H], logits or None, feats [N, T, k*H] or None).
        feat_ids: target layer ids (residual after layer j; -1 the embedding output; L-1 the
        final-normed state, as Hugging Face's hidden_states[L] is)."""
        N, T = ids.shape
        x = self.embed_tokens(ids)
        cos, sin = rope_cs(torch.arange(T)[None], self.g.head_dim, self.g.theta)
        feats = {}
        if -1 in feat_ids:
            feats[-1] = x
        for j, l in enumerate(self.layers):
            x = l(x, cos, sin, causal=True)
            if j in feat_ids:
                feats[j] = x
        h = rms(x, self.norm, self.g.eps)
        if self.g.layers - 1 in feat_ids:
            feats[self.g.layers - 1] = h
        f = torch.cat([feats[j] for j in feat_ids], -1) if feat_ids else None
        return h, (h @ self.head_weight().T if logits else None), f


class Drafter(nn.Module):
    """DFlash (kind 'dflash') or DSpark (kind 'dspark') drafter over a frozen target."""

    def __init__(self, g, kind, block, target_ids, mask_id, markov_rank=0, conf_head=False, target=None):
        super().__init__()
        self.g, self.kind, self.block = g, kind, block
        self.target_ids, self.mask_id = list(target_ids), mask_id
        H = g.hidden
        self.fc = nn.Linear(len(target_ids) * H, H, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.layers = nn.ModuleList(Layer(g) for _ in range(g.layers))
        self.norm = nn.Parameter(torch.ones(H))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        self.markov_rank, self.conf = markov_rank, conf_head
        if kind == "dspark":  # own copies of the target's embedding and head, frozen (DeepSpec)
            self.embed_tokens = nn.Parameter(target.embed_tokens.weight.detach().clone(), requires_grad=False)
            self.lm_head = nn.Parameter(target.head_weight().detach().clone(), requires_grad=False)
            if markov_rank:
                self.markov_w1 = nn.Parameter(torch.randn(g.vocab, markov_rank) * 0.02)
                self.markov_w2 = nn.Parameter(torch.zeros(g.vocab, markov_rank))
            if conf_head:
                self.conf_proj = nn.Linear(H + markov_rank, 1)

    def names(self):
        d = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm, "norm.weight": self.norm}
        for i, l in enumerate(self.layers):
            d.update(l.names(f"layers.{i}."))
        if self.kind == "dspark":
            d["embed_tokens.weight"] = self.embed_tokens
            d["lm_head.weight"] = self.lm_head
            if self.markov_rank:
                d["markov_head.markov_w1.weight"] = self.markov_w1
                d["markov_head.markov_w2.weight"] = self.markov_w2
            if self.conf:
                d["confidence_head.proj.weight"] = self.conf_proj.weight
                d["confidence_head.proj.bias"] = self.conf_proj.bias
        return d

    def forward(self, feat, ids, starts, embed_w):
        """feat [N, T, k*H] target features of a sequence; ids [N, T]; starts [N, A] anchor positions.
        Returns normed block outputs [N, A, B, H]. Block a = [ids[start_a], MASK * (B-1)] at
        positions start_a..start_a+B-1, attending to context rows < start_a and to its own block."""
        g, B = self.g, self.block
        N, T, _ = feat.shape
        A = starts.shape[1]
        ctx = rms(self.fc(feat), self.hidden_norm, g.eps)
        blk = torch.full((N, A, B), self.mask_id, dtype=torch.long)
        blk[:, :, 0] = torch.gather(ids, 1, starts)
        x = F.embedding(blk, embed_w).view(N, A * B, g.hidden)
        pos = (starts[:, :, None] + torch.arange(B)).view(N, A * B)
        cos, sin = rope_cs(pos, g.head_dim, g.theta)
        ccos, csin = rope_cs(torch.arange(T)[None], g.head_dim, g.theta)
        # mask [N, 1, A*B, T + A*B]: context keys before the anchor, and the block's own rows
        ctx_ok = torch.arange(T)[None, None, :] < starts[:, :, None]          # [N, A, T]
        ctx_ok = ctx_ok[:, :, None, :].expand(N, A, B, T).reshape(N, A * B, T)
        own = torch.eye(A, dtype=torch.bool)[:, None, :, None].expand(A, B, A, B).reshape(A * B, A * B)
        mask = torch.cat([ctx_ok, own[None].expand(N, -1, -1)], -1)[:, None]
        for l in self.layers:
            ckv = l.kv(ctx, ccos, csin)
            x = l(x, cos, sin, ctx_kv=ckv, mask=mask)
        return rms(x, self.norm, g.eps).view(N, A, B, g.hidden)


def save_checkpoint(out_dir, tensors, config, dtype=torch.bfloat16):
    """model.safetensors (HF layout, {"format": "pt"} metadata) + config.json."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.detach().to(dtype).contiguous() for k, v in tensors.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def finish_log(out_dir, log, t0, nparam):
    """train_log.json beside a checkpoint (every step's loss and lr, every evaluation, seconds)."""
    import time

    log["seconds"] = time.time() - t0
    with open(os.path.join(out_dir, "train_log.json"), "w") as f:
        json.dump(log, f)
    print(f"wrote {out_dir} ({nparam / 1e6:.1f}M parameters, {log['seconds']:.0f} s)")


def load_into(module_names, path):
    """Copy a safetensors file into the parameters of a names() map (strict: same name set)."""
    from safetensors.torch import load_file

    st = load_file(path)
    if set(st) != set(module_names):
        raise SystemExit(f"{path}: tensor set differs: {sorted(set(st) ^ set(module_names))[:5]}")
    with torch.no_grad():
        for k, p in module_names.items():
            p.copy_(st[k].to(p.dtype))


def target_config(g, tie, bos, eos):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": g.hidden,
            "intermediate_size": g.inter, "num_hidden_layers": g.layers, "num_attention_heads": g.heads,
            "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim, "vocab_size": g.vocab,
            "max_position_embeddings": 2048, "rms_norm_eps": g.eps, "rope_theta": g.theta,
            "rope_scaling": None, "tie_word_embeddings": tie, "bos_token_id": bos, "eos_token_id": eos,
            "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
            "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": g.layers,
            "transformers_version": "4.51.0"}
