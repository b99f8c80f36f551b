"""Independent float64 numpy reference for speculative decoding with DFlash / DSpark drafters.

Written from the semantics summarised in tests/reference/SPEC-NOTES.md (own code; numpy + the
standard library only). Builds on ref_model.py (the Qwen3/Llama/Qwen2 target reference).

Provides
  * DraftConfig / Drafter: strict loading of a DFlash ("DFlashDraftModel", z-lab layout) or DSpark
    ("Qwen3DSparkModel", DeepSpec layout) drafter checkpoint, context rows (fc + hidden_norm,
    per-layer context K/V computed once per committed position), one non-causal draft block,
    DFlash drafts (slots 1..B-1, target lm_head) and DSpark drafts (shift: slots 0..B-1, own
    lm_head + vanilla Markov head, sequential greedy) with the confidence head.
  * spec_generate: the greedy speculative loop with graphswap's conventions (SPEC-NOTES.md §3):
    full drafter block every step, verify width min(W, confidence cut, remaining budget - 1),
    greedy acceptance, bonus, exact stop at max_tokens / stop tokens, per-step trace.
  * target_greedy: plain greedy decoding with the same stop rules (the lossless baseline).
  * drafter config builders and a random drafter checkpoint writer (exact layouts).
"""

import json
import os

import numpy as np

import ref_model as rm

DFLASH_ARCH = "DFlashDraftModel"
DSPARK_ARCH = "Qwen3DSparkModel"
DRAFT_ARCHS = {DFLASH_ARCH: "dflash", DSPARK_ARCH: "dspark"}


def default_target_layer_ids(num_target_layers, num_draft_layers):
    """z-lab rule used when dflash_config.target_layer_ids is absent (count = drafter depth).
    Python round() (half to even) as in the original."""
    n, m = int(num_target_layers), int(num_draft_layers)
    if m == 1:
        return [n // 2]
    start, end = 1, n - 3
    span = end - start
    return [int(round(start + (i * span) / (m - 1))) for i in range(m)]


def layer_prefix(l):
    return "layers.%d." % l


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------

class DraftConfig:
    def __init__(self, d):
        archs = d.get("architectures") or []
        if len(archs) != 1 or archs[0] not in DRAFT_ARCHS:
            raise rm.FormatError("not a DFlash/DSpark drafter: architectures %r" % (archs,))
        self.kind = DRAFT_ARCHS[archs[0]]
        rm.read_geometry(self, d)
        theta = d.get("rope_theta")
        if theta is None and isinstance(d.get("rope_parameters"), dict):
            theta = d["rope_parameters"].get("rope_theta")
        self.theta = float(theta if theta is not None else 10000.0)
        self.attention_bias = bool(d.get("attention_bias", False))
        self.torch_dtype = d.get("torch_dtype") or d.get("dtype")
        self.num_target_layers = d.get("num_target_layers")
        if d.get("hidden_act", "silu") != "silu":
            raise rm.FormatError("hidden_act %r not supported" % d.get("hidden_act"))
        for lt in d.get("layer_types") or []:
            if lt != "full_attention":
                raise rm.FormatError("layer_types %r not supported (full_attention only)" % lt)
        if bool(d.get("is_causal", False)):
            raise rm.FormatError("is_causal=true drafters are not supported")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise rm.FormatError("bad head geometry")
        if self.kind == "dflash":
            dc = d.get("dflash_config") or {}
            for k in ("input_embedding_scale", "output_multiplier"):
                v = dc.get(k, d.get(k))
                if v is not None and float(v) != 1.0:
                    raise rm.FormatError("%s=%r not supported" % (k, v))
            sc = dc.get("final_logit_softcapping", d.get("final_logit_softcapping"))
            if sc is not None and float(sc) > 0:
                raise rm.FormatError("final_logit_softcapping not supported")
            self.block_size = int(dc.get("block_size", d.get("block_size", 16)))
            mask = dc.get("mask_token_id", d.get("mask_token_id"))
            tl = dc.get("target_layer_ids", d.get("target_layer_ids"))
            if tl is None:
                if self.num_target_layers is None:
                    raise rm.FormatError("no target_layer_ids and no num_target_layers")
                tl = default_target_layer_ids(self.num_target_layers, self.layers)
            self.markov_rank = 0
            self.markov_type = None
            self.conf = False
            self.conf_markov = False
            self.width = self.block_size - 1          # drafts per block (slots 1..B-1)
        else:
            for f in ("block_size", "mask_token_id", "target_layer_ids", "markov_rank",
                      "enable_confidence_head"):
                if f not in d:
                    raise rm.FormatError("DSpark config lacks %s" % f)
            self.block_size = int(d["block_size"])
            mask = d["mask_token_id"]
            tl = d["target_layer_ids"]
            self.markov_rank = int(d["markov_rank"])
            if self.markov_rank < 0:
                raise rm.FormatError("markov_rank < 0")
            self.markov_type = None
            if self.markov_rank > 0:
                self.markov_type = str(d.get("markov_head_type", "vanilla")).lower()
                if self.markov_type != "vanilla":
                    raise rm.FormatError("markov_head_type %r not supported" % self.markov_type)
            self.conf = bool(d["enable_confidence_head"])
            self.conf_markov = bool(d.get("confidence_head_with_markov", False)) if self.conf else False
            if self.conf_markov and self.markov_rank == 0:
                raise rm.FormatError("confidence_head_with_markov needs markov_rank > 0")
            self.width = self.block_size              # drafts per block (shift: every slot)
        if mask is None:
            raise rm.FormatError("no mask_token_id")
        self.mask_token_id = int(mask)
        if not 0 <= self.mask_token_id < self.vocab:
            raise rm.FormatError("mask_token_id %d outside vocab %d" % (self.mask_token_id, self.vocab))
        self.target_layer_ids = [int(x) for x in tl]
        if not self.target_layer_ids:
            raise rm.FormatError("empty target_layer_ids")
        # DeepSpec validate_target_layer_ids (common.py:59-75): strictly increasing, {-1} U [0, L-1];
        # -1 = embedding output, L-1 = final-normed (target_feats)
        if self.num_target_layers is not None:
            Lt = int(self.num_target_layers)
            ids = self.target_layer_ids
            if any(j < -1 or j > Lt - 1 for j in ids) or any(a >= b for a, b in zip(ids, ids[1:])):
                raise rm.FormatError("target_layer_ids %r: strictly increasing ids in {-1} U [0, %d]" % (ids, Lt - 1))
        if self.block_size < (2 if self.kind == "dflash" else 1):
            raise rm.FormatError("block_size %d too small" % self.block_size)

    def expected_tensors(self):
        """{name: shape} required; plus a set of optional names (DSpark embed_tokens / lm_head)."""
        H, I, V, hd = self.hidden, self.inter, self.vocab, self.head_dim
        nq, nkv = self.heads * hd, self.kv_heads * hd
        k = len(self.target_layer_ids)
        e = {"fc.weight": (H, k * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
        for l in range(self.layers):
            p = layer_prefix(l)
            e[p + "input_layernorm.weight"] = (H,)
            e[p + "post_attention_layernorm.weight"] = (H,)
            e[p + "self_attn.q_proj.weight"] = (nq, H)
            e[p + "self_attn.k_proj.weight"] = (nkv, H)
            e[p + "self_attn.v_proj.weight"] = (nkv, H)
            e[p + "self_attn.o_proj.weight"] = (H, nq)
            if self.attention_bias:
                e[p + "self_attn.q_proj.bias"] = (nq,)
                e[p + "self_attn.k_proj.bias"] = (nkv,)
                e[p + "self_attn.v_proj.bias"] = (nkv,)
                e[p + "self_attn.o_proj.bias"] = (H,)
            e[p + "self_attn.q_norm.weight"] = (hd,)
            e[p + "self_attn.k_norm.weight"] = (hd,)
            e[p + "mlp.gate_proj.weight"] = (I, H)
            e[p + "mlp.up_proj.weight"] = (I, H)
            e[p + "mlp.down_proj.weight"] = (H, I)
        optional = {}
        if self.kind == "dspark":
            optional["embed_tokens.weight"] = (V, H)
            optional["lm_head.weight"] = (V, H)
            r = self.markov_rank
            if r > 0:
                e["markov_head.markov_w1.weight"] = (V, r)
                e["markov_head.markov_w2.weight"] = (V, r)
            if self.conf:
                e["confidence_head.proj.weight"] = (1, H + (r if self.conf_markov else 0))
                e["confidence_head.proj.bias"] = (1,)
        return e, optional


def load_draft_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return DraftConfig(json.load(f))


# ---------------------------------------------------------------------------------------------
# target helpers
# ---------------------------------------------------------------------------------------------

def target_feats(target, ids, hiddens, layer_ids):
    """Context features [T, k*H] for tokens `ids` from the target's per-layer residuals `hiddens`
    (list of [T, H] after each layer). -1 = embedding output; L-1 = final-normed (HF semantics)."""
    L = target.cfg.layers
    parts = []
    for j in layer_ids:
        if j == -1:
            parts.append(target.w["model.embed_tokens.weight"][np.asarray(ids, dtype=np.int64)])
        elif 0 <= j <= L - 2:
            parts.append(hiddens[j])
        elif j == L - 1:
            parts.append(rm.rms_norm(hiddens[j], target.w["model.norm.weight"], target.cfg.eps))
        else:
            raise rm.FormatError("target_layer_id %d outside [-1, %d]" % (j, L - 1))
    return np.concatenate(parts, axis=-1)


def crop_cache(cache, length):
    for l in range(len(cache.k)):
        cache.k[l] = cache.k[l][:, :length]
        cache.v[l] = cache.v[l][:, :length]


def top2_gap_rows(logits):
    s = np.sort(np.atleast_2d(logits), axis=-1)
    return s[:, -1] - s[:, -2]


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---------------------------------------------------------------------------------------------
# drafter
# ---------------------------------------------------------------------------------------------

class Proposal:
    __slots__ = ("drafts", "logits", "conf", "width")

    def __init__(self, drafts, logits, conf, width):
        self.drafts = drafts      # W draft ids (all slots)
        self.logits = logits      # [W, V] the logits each draft was the argmax of (Markov-corrected)
        self.conf = conf          # [W] sigmoid confidences, or None
        self.width = width        # confidence-cut width (<= W)


class Drafter:
    def __init__(self, model_dir, target, strict=True):
        self.dir = model_dir
        self.cfg = load_draft_config(model_dir)
        self.target = target
        cfg, tcfg = self.cfg, target.cfg
        if cfg.hidden != tcfg.hidden:
            raise rm.FormatError("drafter hidden_size %d != target %d" % (cfg.hidden, tcfg.hidden))
        if cfg.vocab != tcfg.vocab:
            raise rm.FormatError("drafter vocab_size %d != target %d" % (cfg.vocab, tcfg.vocab))
        for j in cfg.target_layer_ids:
            if not -1 <= j <= tcfg.layers - 1:
                raise rm.FormatError("target_layer_id %d outside [-1, %d]" % (j, tcfg.layers - 1))
        raw = rm.read_checkpoint_tensors(model_dir)
        expected, optional = cfg.expected_tensors()
        allowed = dict(expected)
        allowed.update(optional)
        missing = sorted(set(expected) - set(raw))
        extra = sorted(set(raw) - set(allowed))
        if missing:
            raise rm.FormatError("drafter: missing tensor(s): %s" % ", ".join(missing))
        if strict and extra:
            raise rm.FormatError("drafter: unexpected tensor(s): %s" % ", ".join(extra))
        want_dt = rm.TORCH_DTYPE_TO_ST.get(cfg.torch_dtype)
        self.w = {}
        for name, shape in allowed.items():
            if name not in raw:
                continue
            t = raw[name]
            if t.shape != tuple(shape):
                raise rm.FormatError("drafter tensor %s has shape %s, expected %s" % (name, t.shape, shape))
            if strict and want_dt is not None and t.dtype != want_dt:
                raise rm.FormatError("drafter tensor %s has dtype %s but torch_dtype is %s"
                                     % (name, t.dtype, cfg.torch_dtype))
            self.w[name] = t.to_f64()
        # embeddings / output head: DFlash always the target's; DSpark its own when present
        self.embed = self.w.get("embed_tokens.weight", target.w["model.embed_tokens.weight"])
        self.lm_head = self.w.get("lm_head.weight", target.lm_head) if cfg.kind == "dspark" else target.lm_head
        hd = cfg.head_dim
        self.inv_freq = cfg.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        self.reset()

    # -- pieces ----------------------------------------------------------------------------------
    def _lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y + b if b is not None else y

    def _rope(self, x, positions):
        ang = np.asarray(positions, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        cos = np.cos(np.concatenate([ang, ang], axis=-1))[None]
        sin = np.sin(np.concatenate([ang, ang], axis=-1))[None]
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def _kv(self, l, h, positions):
        """K (after k_norm + RoPE) and V, [nkv, T, hd], for normalized rows h [T, H] of layer l."""
        cfg = self.cfg
        T = h.shape[0]
        p = layer_prefix(l)
        k = self._lin(h, p + "self_attn.k_proj").reshape(T, cfg.kv_heads, cfg.head_dim).transpose(1, 0, 2)
        v = self._lin(h, p + "self_attn.v_proj").reshape(T, cfg.kv_heads, cfg.head_dim).transpose(1, 0, 2)
        k = rm.rms_norm(k, self.w[p + "self_attn.k_norm.weight"], cfg.eps)
        return self._rope(k, positions), v

    # -- context ---------------------------------------------------------------------------------
    def reset(self):
        cfg = self.cfg
        self.ctx_k = [np.zeros((cfg.kv_heads, 0, cfg.head_dim)) for _ in range(cfg.layers)]
        self.ctx_v = [np.zeros((cfg.kv_heads, 0, cfg.head_dim)) for _ in range(cfg.layers)]
        self.ctx_positions = []

    def ctx_len(self):
        return len(self.ctx_positions)

    def context_rows(self, feats):
        """c_t = hidden_norm(fc(feat_t)), [T, H]."""
        return rm.rms_norm(feats @ self.w["fc.weight"].T, self.w["hidden_norm.weight"], self.cfg.eps)

    def context_kv(self, feats, positions):
        """Per-layer (K, V) of context rows, computed from scratch."""
        c = self.context_rows(feats)
        return [self._kv(l, c, positions) for l in range(self.cfg.layers)]

    def add_context(self, feats, positions):
        """Appends context K/V for committed positions (must continue the cached positions)."""
        positions = [int(p) for p in positions]
        if positions != list(range(self.ctx_len(), self.ctx_len() + len(positions))):
            raise ValueError("context positions %r do not continue %d cached rows" % (positions[:3], self.ctx_len()))
        for l, (k, v) in enumerate(self.context_kv(feats, positions)):
            self.ctx_k[l] = np.concatenate([self.ctx_k[l], k], axis=1)
            self.ctx_v[l] = np.concatenate([self.ctx_v[l], v], axis=1)
        self.ctx_positions.extend(positions)

    # -- one block ---------------------------------------------------------------------------------
    def block_hidden(self, anchor, start):
        """Final-normed hidden states [B, H] of the block [anchor, MASK*(B-1)] at start..start+B-1,
        attending (non-causally) to all cached context rows and the whole block."""
        cfg = self.cfg
        if self.ctx_len() != start:
            raise ValueError("drafter context holds %d rows but the anchor is at %d" % (self.ctx_len(), start))
        B = cfg.block_size
        ids = np.array([anchor] + [cfg.mask_token_id] * (B - 1), dtype=np.int64)
        pos = np.arange(start, start + B)
        nh, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        group = nh // nkv
        x = self.embed[ids]
        for l in range(cfg.layers):
            p = layer_prefix(l)
            h = rm.rms_norm(x, self.w[p + "input_layernorm.weight"], cfg.eps)
            q = self._lin(h, p + "self_attn.q_proj").reshape(B, nh, hd).transpose(1, 0, 2)
            q = self._rope(rm.rms_norm(q, self.w[p + "self_attn.q_norm.weight"], cfg.eps), pos)
            kb, vb = self._kv(l, h, pos)
            k = np.concatenate([self.ctx_k[l], kb], axis=1)
            v = np.concatenate([self.ctx_v[l], vb], axis=1)
            kk = np.repeat(k, group, axis=0)
            vv = np.repeat(v, group, axis=0)
            s = np.einsum("htd,hsd->hts", q, kk) * hd ** -0.5          # no mask: non-causal
            s = s - s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr = pr / pr.sum(axis=-1, keepdims=True)
            att = np.einsum("hts,hsd->htd", pr, vv).transpose(1, 0, 2).reshape(B, nh * hd)
            x = x + self._lin(att, p + "self_attn.o_proj")
            h = rm.rms_norm(x, self.w[p + "post_attention_layernorm.weight"], cfg.eps)
            x = x + self._lin(rm.silu(self._lin(h, p + "mlp.gate_proj")) * self._lin(h, p + "mlp.up_proj"),
                              p + "mlp.down_proj")
        return rm.rms_norm(x, self.w["norm.weight"], cfg.eps)

    def propose(self, anchor, start, conf_threshold=0.0):
        """Greedy drafts of one block. DFlash: slots 1..B-1 through the target lm_head.
        DSpark: every slot (shift), own lm_head + Markov bias, left to right; confidence head."""
        cfg = self.cfg
        hid = self.block_hidden(anchor, start)
        if cfg.kind == "dflash":
            logits = hid[1:] @ self.lm_head.T
            drafts = [int(t) for t in np.argmax(logits, axis=-1)]
            return Proposal(drafts, logits, None, len(drafts))
        base = hid @ self.lm_head.T                                        # [B, V]
        drafts, rows, prevs = [], [], []
        prev = int(anchor)
        for kslot in range(cfg.block_size):
            row = base[kslot]
            if cfg.markov_rank > 0:
                row = row + self.w["markov_head.markov_w2.weight"] @ self.w["markov_head.markov_w1.weight"][prev]
            d = int(np.argmax(row))
            prevs.append(prev)
            rows.append(row)
            drafts.append(d)
            prev = d
        conf = None
        width = len(drafts)
        if cfg.conf:
            feats = hid
            if cfg.conf_markov:
                feats = np.concatenate([hid, self.w["markov_head.markov_w1.weight"][np.array(prevs)]], axis=-1)
            z = feats @ self.w["confidence_head.proj.weight"][0] + self.w["confidence_head.proj.bias"][0]
            conf = sigmoid(z)
            if conf_threshold > 0.0:
                below = np.nonzero(conf < conf_threshold)[0]
                if len(below):
                    width = int(below[0])
        return Proposal(drafts, np.array(rows), conf, width)


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------

def spec_generate(target, drafter, prompt, max_tokens, stop_ids=(), conf_threshold=0.0, num_spec_tokens=None):
    """Greedy speculative decoding (SPEC-NOTES.md section 3). Returns a dict:
      tokens, trace (list of step dicts), acceptance_lengths, finish_reason,
      draft_gaps / target_gaps (top-2 logit gaps of every argmax that decides the trace),
      conf_margins (|c - threshold| of every confidence that decided a cut, threshold > 0 only).
    Verify width k = min(W, confidence cut, num_spec_tokens, remaining - 1): the bonus always fits
    in the budget. A stop token among the accepted drafts ends the step there: accepted counts the
    drafts through the stop token and bonus is -1 (as DeepSpec's verify_draft_tokens)."""
    prompt = [int(t) for t in prompt]
    stop_ids = set(int(t) for t in stop_ids)
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    cfg = drafter.cfg
    cache = rm.KVCache(target.cfg)
    n = len(prompt)
    logits, hid = target.forward(prompt, cache, return_hidden=True)
    target_gaps = [float(top2_gap_rows(logits[-1])[0])]
    draft_gaps, conf_margins = [], []
    out = [int(np.argmax(logits[-1]))]
    stopped = out[0] in stop_ids
    drafter.reset()
    drafter.add_context(target_feats(target, prompt, hid, cfg.target_layer_ids), range(n))
    trace, acc_lens = [], []
    while not stopped and len(out) < max_tokens:
        anchor = out[-1]
        start = n + len(out) - 1
        remaining = max_tokens - len(out)
        assert cache.length() == start and drafter.ctx_len() == start
        prop = drafter.propose(anchor, start, conf_threshold)
        k = min(prop.width, remaining - 1)
        if num_spec_tokens is not None:
            k = min(k, int(num_spec_tokens))
        drafts = prop.drafts[:k]
        if k:
            draft_gaps.extend(float(g) for g in top2_gap_rows(prop.logits[:k]))
        if prop.conf is not None and conf_threshold > 0.0:
            upto = min(k + 1, len(prop.drafts))     # the confidences that decided the cut
            conf_margins.extend(float(abs(c - conf_threshold)) for c in prop.conf[:upto])
        vin = [anchor] + drafts
        vlog, vhid = target.forward(vin, cache, return_hidden=True)
        post = [int(t) for t in np.argmax(vlog, axis=-1)]
        acc = 0
        while acc < k and drafts[acc] == post[acc]:
            acc += 1
        bonus = post[acc]
        target_gaps.extend(float(g) for g in top2_gap_rows(vlog[:acc + 1]))
        hit = [i for i in range(acc) if drafts[i] in stop_ids]
        if hit:
            acc = hit[0] + 1
            bonus = -1
            new = drafts[:acc]
            stopped = True
        else:
            new = drafts[:acc] + [bonus]
            stopped = bonus in stop_ids
        assert len(new) <= remaining
        out.extend(new)
        trace.append({"step": len(trace), "start": start, "anchor": anchor, "drafts": drafts,
                      "accepted": acc, "bonus": bonus})
        acc_lens.append(len(new))
        crop_cache(cache, start + acc + 1)
        if not stopped and len(out) < max_tokens:
            rows = [r[:acc + 1] for r in vhid]
            drafter.add_context(target_feats(target, vin[:acc + 1], rows, cfg.target_layer_ids),
                                range(start, start + acc + 1))
    finish = "stop" if stopped else "length"
    return {"tokens": out, "trace": trace, "acceptance_lengths": acc_lens, "finish_reason": finish,
            "draft_gaps": draft_gaps, "target_gaps": target_gaps, "conf_margins": conf_margins}


def target_greedy(target, prompt, max_tokens, stop_ids=()):
    """Plain greedy decoding with a KV cache and the same stop rule. Returns (tokens, gaps)."""
    stop_ids = set(int(t) for t in stop_ids)
    cache = rm.KVCache(target.cfg)
    logits = target.forward([int(t) for t in prompt], cache)[-1]
    out, gaps = [], []
    while True:
        t = int(np.argmax(logits))
        gaps.append(float(top2_gap_rows(logits)[0]))
        out.append(t)
        if t in stop_ids or len(out) >= max_tokens:
            return out, gaps
        logits = target.forward([t], cache)[-1]


def tokens_from_trace(trace, max_tokens, stop_ids=(), first=None):
    """Rebuilds the output tokens from a trace (first = the prefill token when there are no steps)."""
    stop_ids = set(int(t) for t in stop_ids)
    if not trace:
        return [] if first is None else [first]
    out = [trace[0]["anchor"]]
    for st in trace:
        out.extend(list(st["drafts"][:st["accepted"]]) + ([st["bonus"]] if st["bonus"] >= 0 else []))
    out = out[:max_tokens]
    for i, t in enumerate(out):
        if t in stop_ids:
            return out[:i + 1]
    return out


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------

def make_drafter_config(kind, target_cfg_dict, layers=1, block_size=8, target_layer_ids=None,
                        mask_token_id=None, markov_rank=0, enable_conf=False, conf_markov=False,
                        dtype=None, heads=None, kv_heads=None, head_dim=None, inter=None,
                        write_target_layer_ids=True):
    """Config dict of a drafter for a target config dict (geometry copied from the target unless
    overridden), in the exact DFlash (z-lab) or DSpark (DeepSpec) layout."""
    t = target_cfg_dict
    L = int(t["num_hidden_layers"])
    V = int(t["vocab_size"])
    if target_layer_ids is None:
        target_layer_ids = default_target_layer_ids(L, layers) if L >= 5 else list(range(min(layers, L - 1) or 1))
    if mask_token_id is None:
        mask_token_id = V - 1
    dtype = dtype or t.get("torch_dtype", "bfloat16")
    geo = {
        "hidden_size": int(t["hidden_size"]),
        "intermediate_size": int(inter if inter is not None else t["intermediate_size"]),
        "num_hidden_layers": int(layers),
        "num_attention_heads": int(heads if heads is not None else t["num_attention_heads"]),
        "num_key_value_heads": int(kv_heads if kv_heads is not None else t.get("num_key_value_heads")
                                   or t["num_attention_heads"]),
        "head_dim": int(head_dim if head_dim is not None else t.get("head_dim")
                        or int(t["hidden_size"]) // int(t["num_attention_heads"])),
        "vocab_size": V,
        "rms_norm_eps": float(t["rms_norm_eps"]),
        "rope_theta": float(t.get("rope_theta", 10000.0)),
        "max_position_embeddings": int(t.get("max_position_embeddings", 4096)),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": dtype,
        "tie_word_embeddings": False,
        "num_target_layers": L,
        "block_size": int(block_size),
    }
    if kind == "dflash":
        d = {"architectures": [DFLASH_ARCH], "model_type": "qwen3"}
        d.update(geo)
        dc = {"mask_token_id": int(mask_token_id)}
        if write_target_layer_ids:
            dc["target_layer_ids"] = [int(x) for x in target_layer_ids]
        d["dflash_config"] = dc
        return d
    d = dict(t)                                    # DeepSpec: deepcopy of the target config
    d.update(geo)
    d["architectures"] = [DSPARK_ARCH]
    d["model_type"] = "qwen3"
    d["layer_types"] = ["full_attention"] * int(layers)
    d["mask_token_id"] = int(mask_token_id)
    d["target_layer_ids"] = [int(x) for x in target_layer_ids]
    d["num_anchors"] = 512
    d["enable_confidence_head"] = bool(enable_conf)
    if enable_conf:
        d["confidence_head_with_markov"] = bool(conf_markov)
    d["markov_rank"] = int(markov_rank)
    if markov_rank > 0:
        d["markov_head_type"] = "vanilla"
    return d


def random_drafter_weights(cfg, seed=0, std=0.3, target=None, own_head="copy", overrides=None,
                           layer_out_scale=1.0):
    """{name: float64 array} for a DraftConfig. own_head (DSpark only): "copy" (target's embed /
    lm_head, as DeepSpec does), "random", "perturb" (copy + noise) or "none" (omit them).
    overrides: {name: array} replacing generated tensors. layer_out_scale scales o_proj / down_proj."""
    rng = np.random.default_rng(seed)
    expected, optional = cfg.expected_tensors()
    names = dict(expected)
    if cfg.kind == "dspark" and own_head != "none":
        names.update(optional)
    w = {}
    for name, shape in names.items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.2 * rng.standard_normal(shape)
        elif name in ("embed_tokens.weight", "lm_head.weight"):
            src = None
            if target is not None and own_head in ("copy", "perturb"):
                src = target.w["model.embed_tokens.weight"] if name == "embed_tokens.weight" else target.lm_head
            if src is None:
                a = rng.standard_normal(shape) * (1.0 if name == "embed_tokens.weight" else 0.9 / np.sqrt(shape[1]) * 3)
            else:
                a = src.copy()
                if own_head == "perturb":
                    a = a + 0.3 * np.std(a) * rng.standard_normal(shape)
        elif name == "markov_head.markov_w1.weight":
            a = rng.standard_normal(shape)
        elif name == "markov_head.markov_w2.weight":
            a = 0.5 * rng.standard_normal(shape) / np.sqrt(shape[1])
        else:
            a = std * rng.standard_normal(shape) / np.sqrt(shape[-1]) * 3.0
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                a = a * layer_out_scale
        w[name] = a
    for name, a in (overrides or {}).items():
        if name not in w:
            raise KeyError("override for unknown tensor %s" % name)
        if tuple(np.shape(a)) != tuple(w[name].shape):
            raise ValueError("override %s has shape %s, expected %s" % (name, np.shape(a), w[name].shape))
        w[name] = np.asarray(a, dtype=np.float64)
    return w


def write_drafter(out_dir, cfg_dict, weights, shards=1, order_seed=None):
    """Writes config.json + weights (dtype from torch_dtype) in the drafter layout. Returns DraftConfig."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = DraftConfig(cfg_dict)
    st_dt = rm.TORCH_DTYPE_TO_ST[cfg.torch_dtype]
    names = sorted(weights)
    if order_seed is not None:
        np.random.default_rng(order_seed).shuffle(names)
    tensors = [rm.RawTensor(n, st_dt, weights[n].shape, rm.encode_array(st_dt, weights[n])) for n in names]
    rm.write_sharded(out_dir, tensors, shards)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    return cfg


def write_random_drafter(out_dir, kind, target_dir, seed=0, own_head="copy", overrides=None,
                         layer_out_scale=1.0, shards=1, **cfg_kw):
    """Random drafter checkpoint for the target in target_dir. Returns the DraftConfig."""
    with open(os.path.join(target_dir, "config.json")) as f:
        tdict = json.load(f)
    cfg_dict = make_drafter_config(kind, tdict, **cfg_kw)
    target = rm.RefModel(target_dir, strict=False) if (kind == "dspark" and own_head in ("copy", "perturb")) else None
    w = random_drafter_weights(DraftConfig(cfg_dict), seed=seed, target=target, own_head=own_head,
                               overrides=overrides, layer_out_scale=layer_out_scale)
    return write_drafter(out_dir, cfg_dict, w, shards=shards)


def markov_override(cfg, pairs, scale=8.0, seed=0, noise=0.0):
    """Vanilla Markov head weights that add `scale` to logit[nxt] after token prv, for the
    (prv -> nxt) pairs given (at most markov_rank distinct prv). Returns overrides dict."""
    r, V = cfg.markov_rank, cfg.vocab
    rng = np.random.default_rng(seed)
    w1 = noise * rng.standard_normal((V, r))
    w2 = noise * rng.standard_normal((V, r)) / np.sqrt(r)
    slot = {}
    for prv, nxt in pairs:
        if prv in slot:
            continue
        if len(slot) >= r:
            break
        s = len(slot)
        slot[prv] = s
        w1[prv, :] = 0.0
        w1[prv, s] = scale
        w2[:, s] = 0.0
        w2[nxt, s] = 1.0
    return {"markov_head.markov_w1.weight": w1, "markov_head.markov_w2.weight": w2}


def dflash_mask_for(target, norm_w, eps, want):
    """A mask_token_id M for which a DFlash drafter whose layers add nothing (zero o_proj /
    down_proj) proposes `want` at every slot: argmax target.lm_head @ (rms(embed[M]) * norm_w).
    Prefers M == want; returns None when no token works."""
    E = target.w["model.embed_tokens.weight"]
    outs = rm.rms_norm(E, norm_w, eps) @ target.lm_head.T          # [V(M), V]
    best = np.argmax(outs, axis=-1)
    if best[want] == want:
        return int(want)
    hits = np.nonzero(best == want)[0]
    return int(hits[0]) if len(hits) else None
