#!/usr/bin/env python3
"""graphswap vs llama.cpp: CPU decode and prefill speed on the same Qwen3 / Qwen3-MoE checkpoint.

    bench/llamacpp/setup.sh                       # once: the venv with llama-cpp-python, gguf, numpy
    /tmp/llvenv/bin/python bench/llamacpp/compare.py --graphswap build/graphswap --out results/
    /tmp/llvenv/bin/python bench/llamacpp/compare.py --arch qwen3_moe ...   # Qwen3MoeForCausalLM

Makes (or reuses) an F32 and a BF16 random-init Qwen3 (or, --arch qwen3_moe, Qwen3-MoE)
checkpoint with `graphswap mkmodel`, converts each to GGUF with hf_to_gguf.py, checks that both
engines generate the same greedy tokens and that their logprobs agree (one check per --dtypes
entry), then measures each figure several times, alternating the engines, and prints min /
median / max per engine, the ratio of medians graphswap / llama.cpp, and decode batch 1 as a
share of the read bandwidth over the bytes a token reads (active parameters). See README.md.

llama.cpp runs through llama-cpp-python's low-level ctypes API in a child process of this script
(one per measurement, like graphswap's CLI), so the two engines never share a process or run
at the same time.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CONVERTER = HERE / "hf_to_gguf.py"

P_DECODE = 16  # prompt tokens per sequence before decode (as graphswap bench decode)
MKMODEL_GEOMETRY = ["--arch", "qwen3", "--hidden", "768", "--layers", "12", "--heads", "12",
                    "--kv-heads", "4", "--head-dim", "64", "--intermediate", "2048",
                    "--vocab", "32000", "--no-tie", "--seed", "1"]
# --arch qwen3_moe: the same attention / embeddings, every layer a MoE FFN (mkmodel's
# --intermediate then only fills config.json's intermediate_size, which no layer uses)
MOE_DEFAULTS = {"experts": 32, "experts_per_tok": 4, "moe_intermediate": 256}


def mkmodel_geometry(a) -> list[str]:
    """graphswap mkmodel arguments (without --out / --dtype) for --arch and the MoE options."""
    if a.arch == "qwen3":
        return list(MKMODEL_GEOMETRY)
    g = list(MKMODEL_GEOMETRY)
    g[g.index("--arch") + 1] = "qwen3_moe"
    g += ["--experts", str(a.experts), "--experts-per-tok", str(a.experts_per_tok),
          "--moe-intermediate", str(a.moe_intermediate)]
    if a.moe_fused:
        g.append("--moe-fused")
    return g


def checkpoint_stem(a) -> str:
    """Workdir name of the random checkpoints: dense ones keep their old names (qwen3-f32, ...)."""
    if a.arch == "qwen3":
        return "qwen3"
    return (f"qwen3moe-e{a.experts}k{a.experts_per_tok}i{a.moe_intermediate}"
            + ("-fused" if a.moe_fused else ""))
RESULT_TAG = "@@RESULT "


def die(msg: str, code: int = 1):
    print(f"compare.py: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


# =============================================================== llama.cpp worker (child process)


class Llama:
    """A llama.cpp model + context through llama-cpp-python's ctypes bindings."""

    def __init__(self, gguf: str, threads: int, n_ctx: int, n_batch: int, n_ubatch: int,
                 n_seq_max: int, kv_type: str, flash_attn: str, verbose: bool):
        import ctypes
        import numpy as np
        import llama_cpp as L
        self.L, self.np, self.ct = L, np, ctypes
        if not verbose:
            self._log_cb = L.llama_log_callback(lambda level, text, user: None)
            L.llama_log_set(self._log_cb, ctypes.c_void_p())
        L.llama_backend_init()

        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        fields = {f[0] for f in type(mp)._fields_}
        if "use_mmap" in fields:  # read the weights into memory, as graphswap does
            mp.use_mmap = False
        if "load_mode" in fields:
            mp.load_mode = getattr(L, "LLAMA_LOAD_MODE_NONE", 0)
        load = getattr(L, "llama_model_load_from_file", None) or L.llama_load_model_from_file
        self.model = load(gguf.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")

        cp = L.llama_context_default_params()
        cfields = {f[0] for f in type(cp)._fields_}
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_seq_max = n_seq_max
        cp.n_threads = threads
        cp.n_threads_batch = threads
        kv = {"f16": 1, "f32": 0, "bf16": 30}[kv_type]  # GGML_TYPE_*
        cp.type_k = kv
        cp.type_v = kv
        if "flash_attn_type" in cfields:
            cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[flash_attn]
        elif "flash_attn" in cfields:
            cp.flash_attn = flash_attn == "on"
        if "no_perf" in cfields:
            cp.no_perf = True
        cp.embeddings = False
        init = getattr(L, "llama_init_from_model", None) or L.llama_new_context_with_model
        self.ctx = init(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context "
                               f"(n_ctx {n_ctx}, n_batch {n_batch}, n_seq_max {n_seq_max})")
        if hasattr(L, "llama_model_get_vocab") and hasattr(L, "llama_vocab_n_tokens"):
            self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        else:
            self.n_vocab = L.llama_n_vocab(self.model)
        self.cap = max(n_batch, n_seq_max)
        self.batch = L.llama_batch_init(self.cap, 0, 1)

    def clear(self):
        L = self.L
        if hasattr(L, "llama_memory_clear") and hasattr(L, "llama_get_memory"):
            L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        elif hasattr(L, "llama_kv_self_clear"):
            L.llama_kv_self_clear(self.ctx)
        else:
            L.llama_kv_cache_clear(self.ctx)

    def fill(self, toks, poss, seqs, outs):
        b = self.batch
        n = len(toks)
        if n > self.cap:
            raise RuntimeError(f"batch of {n} > capacity {self.cap}")
        for i in range(n):
            b.token[i] = toks[i]
            b.pos[i] = poss[i]
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seqs[i]
            b.logits[i] = 1 if outs[i] else 0
        b.n_tokens = n
        return sum(1 for o in outs if o)

    def decode(self, n_out):
        rc = self.L.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        ptr = self.L.llama_get_logits(self.ctx)
        return self.np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))

    def close(self):
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        (getattr(L, "llama_model_free", None) or L.llama_free_model)(self.model)


def llama_info() -> dict:
    import ctypes
    import llama_cpp as L
    info = {"llama_cpp_python": getattr(L, "__version__", None)}
    try:
        info["system_info"] = L.llama_print_system_info().decode().strip()
    except Exception:  # noqa: BLE001
        pass
    libdir = Path(L.__file__).resolve().parent / "lib"
    for lib in ("libggml-base.so", "libggml.so", "libllama.so"):
        p = libdir / lib
        if not p.exists():
            continue
        try:
            h = ctypes.CDLL(str(p))
        except OSError:
            continue
        for fn in ("ggml_version", "ggml_commit"):
            if fn not in info and hasattr(h, fn):
                f = getattr(h, fn)
                f.restype = ctypes.c_char_p
                f.argtypes = []
                v = f()
                info[fn] = v.decode() if v else None
    return info


def worker_decode(s: dict) -> dict:
    B, N = s["batch"], s["tokens"]
    lm = Llama(s["gguf"], s["threads"], n_ctx=B * (P_DECODE + N + 8), n_batch=max(512, B * P_DECODE),
               n_ubatch=max(512, B * P_DECODE), n_seq_max=B, kv_type=s["kv_type"],
               flash_attn=s["flash_attn"], verbose=s["verbose"])
    V = lm.n_vocab
    # the prompts graphswap bench decode uses: one batch with every sequence's 16 tokens
    toks, poss, seqs, outs = [], [], [], []
    for b in range(B):
        for i in range(P_DECODE):
            toks.append((b * 7919 + i * 104729) % V)
            poss.append(i)
            seqs.append(b)
            outs.append(i == P_DECODE - 1)
    n_out = lm.fill(toks, poss, seqs, outs)
    nxt = lm.decode(n_out).argmax(axis=1)

    def step(pos):
        nonlocal nxt
        lm.fill([int(t) for t in nxt], [pos] * B, list(range(B)), [True] * B)
        nxt = lm.decode(B).argmax(axis=1)  # greedy, logits for every sequence

    step(P_DECODE)  # warm-up step, untimed (graphswap: prefill + one decode step untimed)
    timed = N - 2
    t0 = time.perf_counter()
    for k in range(timed):
        step(P_DECODE + 1 + k)
    dt = time.perf_counter() - t0
    lm.close()
    return {"tok_s": B * timed / dt, "step_ms": 1e3 * dt / timed, "n_vocab": V}


def worker_prefill(s: dict) -> dict:
    Lp, reps = s["length"], s["reps"]
    lm = Llama(s["gguf"], s["threads"], n_ctx=Lp + 8, n_batch=Lp, n_ubatch=Lp, n_seq_max=1,
               kv_type=s["kv_type"], flash_attn=s["flash_attn"], verbose=s["verbose"])
    V = lm.n_vocab
    prompt = [(i * 104729 + 17) % V for i in range(Lp)]  # as graphswap bench prefill

    def once():
        lm.clear()
        n_out = lm.fill(prompt, list(range(Lp)), [0] * Lp, [i == Lp - 1 for i in range(Lp)])
        t0 = time.perf_counter()
        lm.decode(n_out).argmax(axis=1)  # logits of the last position only, one sampled token
        return time.perf_counter() - t0

    once()  # warm-up
    ts = sorted(once() for _ in range(reps))
    lm.close()
    med = statistics.median(ts)
    return {"tok_s": Lp / med, "ms": 1e3 * med, "min_ms": 1e3 * ts[0], "max_ms": 1e3 * ts[-1]}


def worker_check(s: dict) -> dict:
    """Teacher-forced on graphswap's tokens: llama.cpp's argmax and logprobs at each step."""
    prompt, gs_tokens, gs_top = s["prompt"], s["gs_tokens"], s["gs_top"]
    n = len(gs_tokens)
    lm = Llama(s["gguf"], s["threads"], n_ctx=len(prompt) + n + 8, n_batch=max(512, len(prompt)),
               n_ubatch=max(512, len(prompt)), n_seq_max=1, kv_type=s["kv_type"],
               flash_attn=s["flash_attn"], verbose=s["verbose"])
    np = lm.np
    n_out = lm.fill(prompt, list(range(len(prompt))), [0] * len(prompt),
                    [i == len(prompt) - 1 for i in range(len(prompt))])
    logits = lm.decode(n_out)[0].astype(np.float64)
    steps = []
    for i in range(n):
        lp = logits - logits.max()
        lp = lp - np.log(np.exp(lp).sum())
        order = np.argsort(-lp)
        top1, top2 = int(order[0]), int(order[1])
        g = int(gs_tokens[i])
        diffs = [abs(float(lp[int(t)]) - float(l)) for t, l in (gs_top[i] if i < len(gs_top) else [])]
        steps.append({"llama_argmax": top1, "graphswap": g,
                      "llama_gap_top1_top2": float(lp[top1] - lp[top2]),
                      "llama_lp_of_graphswap_token": float(lp[g]),
                      "llama_lp_top1": float(lp[top1]),
                      "max_abs_dlogprob_topk": max(diffs) if diffs else None})
        if i + 1 < n:
            lm.fill([g], [len(prompt) + i], [0], [True])
            logits = lm.decode(1)[0].astype(np.float64)
    lm.close()
    return {"steps": steps, "n_vocab": lm.n_vocab}


def worker_main() -> int:
    spec = json.loads(sys.stdin.read())
    kind = spec["kind"]
    try:
        if kind == "info":
            res = llama_info()
        elif kind == "decode":
            res = worker_decode(spec)
        elif kind == "prefill":
            res = worker_prefill(spec)
        elif kind == "check":
            res = worker_check(spec)
        else:
            raise ValueError(f"unknown worker kind {kind}")
    except Exception as e:  # noqa: BLE001
        print(RESULT_TAG + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(RESULT_TAG + json.dumps(res), flush=True)
    return 0


# =============================================================== driver side


def run_llama(spec: dict, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker"]
    try:
        p = subprocess.run(cmd, input=json.dumps(spec), stdout=subprocess.PIPE,
                           stderr=None if spec.get("verbose") else subprocess.PIPE, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        die(f"llama.cpp worker ({spec['kind']}) ran past {timeout:.0f}s")
    res = None
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
    if res is None or "error" in res or p.returncode != 0:
        why = res.get("error") if res else f"exit status {p.returncode}, no result"
        tail = "\n".join((p.stderr or "").splitlines()[-25:])
        die(f"llama.cpp {spec['kind']} on {spec.get('gguf')} failed: {why}\n--- worker stderr (tail) ---\n{tail}")
    return res


def run_cmd(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        die(f"cannot run {cmd[0]}: not found")
    except subprocess.TimeoutExpired:
        die(f"`{' '.join(cmd)}` ran past {timeout:.0f}s")


# ---- graphswap output parsers (also used by the self-test)

DECODE_ROW = re.compile(r"^\s*(\d+)\s+(plan|eager)\s+([0-9]+(?:\.[0-9]+)?)\s+([0-9]+(?:\.[0-9]+)?)\b",
                        re.MULTILINE)
READ_BW = re.compile(r"read bandwidth:\s*([0-9]+(?:\.[0-9]+)?)\s*GB/s")
MEMCPY_BW = re.compile(r"memcpy bandwidth:\s*([0-9]+(?:\.[0-9]+)?)\s*GB/s")
PREFILL_HEADER = re.compile(r"^\s*len\b", re.MULTILINE)
PREFILL_ROW = re.compile(r"^\s*(\d+)\s+([0-9]+(?:\.[0-9]+)?)(?:\s|$)")


def parse_gs_decode(text: str, batch: int, mode: str = "plan") -> dict | None:
    """tok/s (and step ms) of the row `batch mode tok/s step-ms ...`; None when absent."""
    for m in DECODE_ROW.finditer(text):
        if int(m.group(1)) == batch and m.group(2) == mode:
            r = {"tok_s": float(m.group(3)), "step_ms": float(m.group(4))}
            # the read / memcpy bandwidth bench decode measures in the same process, same threads
            for key, rx in (("read_bw_gbs", READ_BW), ("memcpy_bw_gbs", MEMCPY_BW)):
                bw = rx.search(text)
                if bw:
                    r[key] = float(bw.group(1))
            return r
    return None


def parse_gs_prefill(text: str, length: int) -> dict | None:
    """tok/s of the row `len tok/s ...` under the header line starting with `len`."""
    h = PREFILL_HEADER.search(text)
    if not h:
        return None
    for line in text[h.end():].splitlines():
        m = PREFILL_ROW.match(line)
        if m and int(m.group(1)) == length:
            return {"tok_s": float(m.group(2))}
    return None


def gs_fail(what: str, cmd: list[str], p: subprocess.CompletedProcess):
    out = ((p.stdout or "") + (p.stderr or "")).strip().splitlines()
    die(f"graphswap {what}: no result (exit status {p.returncode}) from\n  {' '.join(cmd)}\n"
        "--- output (tail) ---\n" + "\n".join(out[-25:]))


class Graphswap:
    def __init__(self, binary: str, threads: int, timeout: float):
        self.bin, self.threads, self.timeout = binary, threads, timeout
        self.new_flags = True  # --batches / --modes

    def decode(self, model: str, batch: int, tokens: int, extra: tuple = ()) -> dict:
        base = [self.bin, "bench", "decode", "--model", model, "--threads", str(self.threads),
                "--tokens", str(tokens)] + list(extra)
        cmd = base + (["--batches", str(batch), "--modes", "plan"] if self.new_flags else [])
        p = run_cmd(cmd, self.timeout)
        if p.returncode != 0 and self.new_flags and re.search(r"--batches|--modes|unknown|usage",
                                                              (p.stdout or "") + (p.stderr or "")):
            log("compare.py: this graphswap has no --batches/--modes; running every batch and mode")
            self.new_flags = False
            cmd = base
            p = run_cmd(cmd, self.timeout)
        r = parse_gs_decode(p.stdout or "", batch, "plan") if p.returncode == 0 else None
        if r is None:
            gs_fail(f"decode batch {batch} (row `{batch} plan ...`)", cmd, p)
        return r

    def prefill(self, model: str, length: int, reps: int, extra: tuple = ()) -> dict:
        cmd = [self.bin, "bench", "prefill", "--model", model, "--threads", str(self.threads),
               "--lengths", str(length), "--reps", str(reps)] + list(extra)
        p = run_cmd(cmd, self.timeout)
        r = parse_gs_prefill(p.stdout or "", length) if p.returncode == 0 else None
        if r is None:
            gs_fail(f"prefill length {length} (row `{length} tok/s ...` under a `len` header)", cmd, p)
        return r

    def generate(self, model: str, prompt: list[int], n: int, logprobs: int, extra: tuple = ()) -> dict:
        cmd = [self.bin, "generate", "--model", model, "--threads", str(self.threads),
               "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(n),
               "--ignore-eos", "--logprobs", str(logprobs)] + list(extra)
        p = run_cmd(cmd, self.timeout)
        for line in reversed((p.stdout or "").splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    break
        gs_fail("generate", cmd, p)


# ---- checkpoints


# "bf16x": the BF16 checkpoint and GGUF, graphswap run with --bf16-activations (activations rounded
# to bf16 in each matmul, vdpbf16ps where the CPU has AVX512_BF16: what llama.cpp does for BF16)
# "bf16amx": the same, graphswap with --bf16-activations=amx (TDPBF16PS's order: natively where the
# CPU has AMX, an exact emulation elsewhere, so time it only on an AMX machine)
# "fp8": graphswap on a block-FP8 checkpoint (Qwen3-FP8 layout, W8A16), llama.cpp on the Q8_0 GGUF
# hf_to_gguf.py writes from the same checkpoint (dequantized f32(code) * scale, then Q8_0)
# "fp8lm": graphswap's online FP8 of every matrix, lm_head included (--quantization fp8
# --quantize-lm-head) on the F32 checkpoint, llama.cpp on the Q8_0 GGUF of its dequantized twin
# (mkmodel --fp8-dequantized --fp8-lm-head: the same codes and scales, as f32): one byte per weight
# of every matrix in both engines, like for like with Q8_0 (the "fp8" rows keep lm_head bf16)
GS_FLAGS = {"f32": (), "bf16": (), "bf16x": ("--bf16-activations",), "bf16amx": ("--bf16-activations=amx",),
            "fp8": (), "fp8lm": ("--quantization", "fp8", "--quantize-lm-head"),
            "fp8x": ("--bf16-activations",),
            "fp8lmx": ("--quantization", "fp8", "--quantize-lm-head", "--bf16-activations")}
# bf16x check tolerances in nats (see CHECKS below and README.md: the engines' bf16 rounding differs)
BF16X_MAX_TOL = 0.5
BF16X_MEDIAN_TOL = 0.05
BF16X_TIE_TOL = 0.05
# fp8 check tolerances in nats against llama.cpp's Q8_0 GGUF. llama.cpp's Q8_0 matmul is W8A8: the
# weights are Q8_0 (d = amax / 127 per 32, so a per-element RMS error of d / sqrt(12), ~0.5% of a
# block's RMS for Gaussian-like rows whose amax over 32 is ~2.1 sigma) and each matmul's activations
# are quantized to Q8_0 too (vec_dot_type Q8_0), about as much again; bf16x's activation rounding is
# ~2^-8 / sqrt(12) ~ 0.11%, and gives ~0.01 nats on the dense model, so Q8_0 should land ~6x higher,
# ~0.06 nats. Measured on the dense model (12 layers, 16 positions, max over graphswap's top-20 per
# position): graphswap FP8 / Q8_0 of the same weights median 0.090, max 0.123; graphswap bf16 /
# Q8_0 of the bf16 weights (Q8_0 alone, no FP8 grid) median 0.085, max 0.113 -- so this is Q8_0's
# own rounding, not an FP8 effect. Wrong weights, graphswap FP8 / Q8_0 of the bf16 weights FP8 was
# quantized from (off by e4m3's rounding, ~4x Q8_0's): median 0.32, max 0.43. So the median bound sits
# between the two (1.7x the Q8_0 noise, half the wrong-weights figure), the max bound at 2.5x the
# observed max and still under the wrong-weights max; a tie is a top-1 / top-2 gap within ~2x the
# per-token noise (the two tokens' errors can have opposite signs). The exactness of the weights
# themselves is the fp8f32 check's job (tolerance 1e-3; measured 2.5e-6); a Q8_0 layout or rounding
# bug (d / qs swapped, blocks out of order) is off by nats.
Q8_MAX_TOL = 0.3
Q8_MEDIAN_TOL = 0.15
Q8_TIE_TOL = 0.2
FILE_DTYPE = {"f32": "f32", "bf16": "bf16", "bf16x": "bf16", "bf16amx": "bf16", "fp8": "fp8", "fp8lm": "fp8lm",
              "fp8x": "fp8", "fp8lmx": "fp8lm"}
# the fp8 checkpoint: the bf16 model's geometry and seed, projections block-FP8 (mkmodel --fp8)
FP8_BLOCK = "128,128"
MKMODEL_DTYPE = {"f32": ["--dtype", "f32"], "bf16": ["--dtype", "bf16"],
                 "fp8": ["--dtype", "bf16", "--fp8", FP8_BLOCK], "fp8lm": ["--dtype", "f32"]}
GGUF_OUTTYPE = {"f32": "f32", "bf16": "bf16", "fp8": "q8_0", "fp8lm": "q8_0"}
# the checkpoint llama.cpp's GGUF is made from when it is not graphswap's own: fp8lm's twin
GGUF_TWIN = {"fp8lm": ["--dtype", "f32", "--fp8", FP8_BLOCK, "--fp8-dequantized", "--fp8-lm-head"]}


def ensure_checkpoints(a) -> dict[str, dict]:
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    out = {}
    for dt in dict.fromkeys(FILE_DTYPE[d] for d in a.dtypes):
        given = getattr(a, f"checkpoint_{dt}", None)
        if given:
            ck = Path(given)
            if not (ck / "config.json").is_file():
                die(f"--checkpoint-{dt} {ck}: no config.json")
        else:
            ck = make_checkpoint(a, work, f"{checkpoint_stem(a)}-{dt}", MKMODEL_DTYPE[dt], dt)
        src = ck  # the checkpoint the GGUF is made from
        if dt in GGUF_TWIN:
            src = make_checkpoint(a, work, f"{ck.name}-twin", GGUF_TWIN[dt], dt + " twin")
        suffix = "-q8_0" if GGUF_OUTTYPE[dt] == "q8_0" else ""
        gguf = work / f"{src.name}-{dt}{suffix}.gguf" if given else work / f"{src.name}{suffix}.gguf"
        convert_gguf(a, src, gguf, GGUF_OUTTYPE[dt])
        out[dt] = {"checkpoint": str(ck), "gguf": str(gguf)}
        if dt in ("fp8", "fp8lm") and (a.check or not a.no_check):
            # the fp8f32 / fp8lmf32 check (below): the dequantized FP8 weights (fp8lm: its twin's, the
            # same values) as an F32 GGUF (exact)
            g32 = work / (f"{src.name}-{dt}-asf32.gguf" if given else f"{src.name}-asf32.gguf")
            convert_gguf(a, src, g32, "f32")
            out[dt]["gguf_as_f32"] = str(g32)
        if dt == "bf16" and "bf16" in a.dtypes and (a.check or not a.no_check):
            # the bf16 check (below): the same bf16 weights widened exactly to an F32 GGUF
            g32 = gguf.with_name(gguf.stem + "-asf32.gguf")
            convert_gguf(a, ck, g32, "f32")
            out[dt]["gguf_as_f32"] = str(g32)
    for d in a.dtypes:
        out[d] = out[FILE_DTYPE[d]]
    return out


def make_checkpoint(a, work: Path, name: str, dtype_args: list[str], what: str) -> Path:
    """work/name made by graphswap mkmodel (--arch's geometry + dtype_args), unless its stamp shows
    the same arguments already made it."""
    ck = work / name
    args = mkmodel_geometry(a) + dtype_args
    stamp = work / f"{name}.mkmodel.json"
    ok = (ck / "config.json").is_file() and stamp.is_file() and \
        json.loads(stamp.read_text()) == args and \
        any(ck.glob("*.safetensors"))
    if not ok:
        log(f"compare.py: making checkpoint {ck} (graphswap mkmodel, {what})")
        shutil.rmtree(ck, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        cmd = [a.graphswap, "mkmodel", "--out", str(ck)] + args
        p = run_cmd(cmd, a.timeout)
        if p.returncode != 0:
            die(f"`{' '.join(cmd)}` failed:\n{p.stdout}\n{p.stderr}")
        stamp.write_text(json.dumps(args))
    return ck


def convert_gguf(a, ck: Path, gguf: Path, outtype: str):
    """hf_to_gguf.py CK GGUF --outtype OUTTYPE unless GGUF is newer than the checkpoint and the converter."""
    newest_src = max(f.stat().st_mtime for f in list(ck.glob("*.safetensors")) +
                     [ck / "config.json", CONVERTER])
    if not gguf.is_file() or gguf.stat().st_mtime < newest_src:
        log(f"compare.py: converting {ck} -> {gguf} ({outtype})")
        cmd = [sys.executable, str(CONVERTER), str(ck), str(gguf), "--outtype", outtype, "-q"]
        p = run_cmd(cmd, a.timeout)
        if p.returncode != 0:
            die(f"conversion failed:\n{p.stdout}\n{p.stderr}")


# ---- what a checkpoint is, and the bytes one batch-1 decode step reads


CONFIG_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings",
               "torch_dtype", "dtype", "rope_theta", "rms_norm_eps", "num_experts", "num_experts_per_tok",
               "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")
EXPERT_TENSOR = re.compile(r"\.mlp\.experts\.")  # per-expert (experts.E.*) and fused (experts.*_proj)


def st_tensors(ck: Path) -> dict[str, dict]:
    """name -> {dtype, shape, bytes} from the safetensors headers of a checkpoint folder."""
    out = {}
    for f in sorted(Path(ck).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            h = json.loads(fh.read(n))
        h.pop("__metadata__", None)
        for name, t in h.items():
            b, e = t["data_offsets"]
            out[name] = {"dtype": t["dtype"], "shape": t["shape"], "bytes": e - b}
    return out


def active_bytes(tensors: dict[str, tuple[list, int]], embed: str, lm_head: str | None,
                 is_expert, k: int, n_expert: int) -> dict:
    """Weight bytes one batch-1 decode token reads: every tensor in full (attention, router, norms,
    dense MLPs, lm_head) except the embedding table (one row; in full when it is the tied lm_head)
    and the experts (k of n_expert: the top-k the router picks). tensors: name -> (shape, bytes)."""
    total = active = 0
    p_total = p_active = 0.0
    for name, (shape, nbytes) in tensors.items():
        elems = 1
        for d in shape:
            elems *= int(d)
        total += nbytes
        p_total += elems
        if name == embed and lm_head is not None:
            rows = int(shape[0]) if name != "token_embd.weight" else int(shape[-1])
            frac = 1.0 / rows
        elif is_expert(name) and n_expert:
            frac = k / n_expert
        else:
            frac = 1.0
        active += nbytes * frac
        p_active += elems * frac
    return {"bytes_total": total, "bytes_active_per_token": active, "params_total": p_total,
            "params_active_per_token": p_active}


def online_fp8_bytes(name: str, shape: list, nbytes: int, lm_head: bool) -> int:
    """What graphswap stores for a checkpoint tensor under --quantization fp8 (--quantize-lm-head):
    a projection (lm_head too) as one byte per weight plus an f32 scale per FP8_BLOCK block; any
    other tensor as the checkpoint has it."""
    if len(shape) == 2 and (re.search(r"_proj\.weight$", name) or (lm_head and name == "lm_head.weight")):
        b0, b1 = (int(v) for v in FP8_BLOCK.split(","))
        r, c = int(shape[0]), int(shape[1])
        return r * c + -(-r // b0) * -(-c // b1) * 4
    return nbytes


def model_summary(ck: str, gguf_path: str | None, gs_flags=()) -> dict:
    """config.json's architecture keys, and the active-parameter bytes per batch-1 decode token of
    the checkpoint (what graphswap reads; under --quantization fp8 what it stores) and of the GGUF
    (what llama.cpp reads: the router is F32 there, norms F32)."""
    cfg = json.loads((Path(ck) / "config.json").read_text())
    out = {"config": {k: cfg[k] for k in CONFIG_KEYS if k in cfg}}
    k = int(cfg.get("num_experts_per_tok") or 0)
    E = int(cfg.get("num_experts") or 0)
    tied = bool(cfg.get("tie_word_embeddings", False))
    st = st_tensors(Path(ck))
    if "--quantization" in gs_flags:
        lm = "--quantize-lm-head" in gs_flags
        for n, t in st.items():
            t["bytes"] = online_fp8_bytes(n, t["shape"], t["bytes"], lm)
    out["graphswap"] = active_bytes({n: (t["shape"], t["bytes"]) for n, t in st.items()
                                     if not n.endswith("rotary_emb.inv_freq")},
                                    "model.embed_tokens.weight", None if tied else "lm_head.weight",
                                    lambda n: bool(EXPERT_TENSOR.search(n)), k, E)
    if gguf_path:
        import gguf as G
        r = G.GGUFReader(gguf_path)
        # GGUFReader shapes are ggml ne (reversed); token_embd ne = [H, V]
        tens = {t.name: ([int(x) for x in t.shape], int(t.n_bytes)) for t in r.tensors}
        out["llama.cpp"] = active_bytes(tens, "token_embd.weight",
                                        None if "output.weight" not in tens else "output.weight",
                                        lambda n: n.endswith("_exps.weight"), k, E)
    return out


# ---- correctness check

# what each --dtypes entry checks: (description, which GGUF of the checkpoint, tolerance options:
# the max / the median over positions of |d logprob|, ties). f32 and bf16 compute in f32 in both
# engines (the bf16 weights widened exactly to an F32 GGUF for llama.cpp): the tight tolerance on
# the max. bf16x is the BF16 GGUF that is timed, where both engines round activations to bf16 in
# each matmul but not identically (llama.cpp also keeps the router F32): ~0.01 nats on the dense
# model; on MoE the rounding flips a near-tie expert choice now and then (router margins down to
# 1e-5 in probability), which moves a position by up to ~0.3 nats, so bf16x bounds the median
# (typical agreement) tightly and the max loosely. A wrong converter (gate / up swapped) is off by
# ~1.5 nats at every position.
CHECKS = {
    "f32": ("F32 checkpoint / F32 GGUF, f32 activations", "gguf", "logprob_tol", None, "tie_tol"),
    "bf16": ("BF16 checkpoint, graphswap f32 activations / the same weights as an F32 GGUF",
             "gguf_as_f32", "logprob_tol", None, "tie_tol"),
    "bf16x": ("BF16 checkpoint, graphswap --bf16-activations / the BF16 GGUF (llama.cpp's bf16 matmuls)",
              "gguf", "bf16x_max_tol", "bf16x_median_tol", "bf16x_tie_tol"),
    "bf16amx": ("BF16 checkpoint, graphswap --bf16-activations=amx / the BF16 GGUF (llama.cpp's bf16 matmuls)",
                "gguf", "bf16x_max_tol", "bf16x_median_tol", "bf16x_tie_tol"),
    "fp8f32": ("block-FP8 checkpoint (W8A16) / its dequantized weights as an F32 GGUF",
               "gguf_as_f32", "logprob_tol", None, "tie_tol"),
    "fp8": ("block-FP8 checkpoint (W8A16) / Q8_0 of its dequantized weights (the GGUF that is timed)",
            "gguf", "q8_max_tol", "q8_median_tol", "q8_tie_tol"),
    "fp8lmf32": ("F32 checkpoint, graphswap --quantization fp8 --quantize-lm-head / its dequantized twin as "
                 "an F32 GGUF", "gguf_as_f32", "logprob_tol", None, "tie_tol"),
    "fp8lm": ("F32 checkpoint, graphswap --quantization fp8 --quantize-lm-head / Q8_0 of its dequantized "
              "twin (the GGUF that is timed)", "gguf", "q8_max_tol", "q8_median_tol", "q8_tie_tol"),
    "fp8x": ("block-FP8 checkpoint, graphswap --bf16-activations / Q8_0 of its dequantized weights",
             "gguf", "q8_max_tol", "q8_median_tol", "q8_tie_tol"),
    "fp8lmx": ("F32 checkpoint, graphswap --quantization fp8 --quantize-lm-head --bf16-activations / Q8_0 of "
               "its dequantized twin", "gguf", "q8_max_tol", "q8_median_tol", "q8_tie_tol"),
}
# --dtypes entry -> the checks it runs: fp8 first checks that llama.cpp gets exactly graphswap's
# weights (fp8f32), then that the Q8_0 GGUF is within Q8_0's rounding of them (fp8)
CHECK_RUNS = {"fp8": ("fp8f32", "fp8"), "fp8lm": ("fp8lmf32", "fp8lm")}


def correctness_checks(a, gs: "Graphswap", models: dict) -> dict:
    """One check per --dtypes entry (each at most once); ok when all pass."""
    res = {}
    for dt in a.dtypes:
        for name in CHECK_RUNS.get(dt, (dt,)):
            res[name] = correctness_check(a, gs, models, dt, name)
    return {"ok": all(r["ok"] for r in res.values()), "by_dtype": res}


def correctness_check(a, gs: "Graphswap", models: dict, dt: str, name: str | None = None) -> dict:
    """The check CHECKS[name] (default: the --dtypes entry dt's own) on dt's checkpoint."""
    name = name or dt
    what, gguf_key, tol_attr, med_attr, tie_attr = CHECKS[name]
    m = models[dt]
    tol, tie_tol = getattr(a, tol_attr), getattr(a, tie_attr)
    med_tol = getattr(a, med_attr) if med_attr else None
    n = 16
    prompt = [(i * 7919 + 11) % 1000 + 1 for i in range(24)]  # fixed ids, well inside any vocab
    g = gs.generate(m["checkpoint"], prompt, n, logprobs=20, extra=GS_FLAGS[dt])
    gs_tokens = g.get("token_ids") or []
    if len(gs_tokens) != n:
        die(f"graphswap generate returned {len(gs_tokens)} tokens, expected {n}: {json.dumps(g)[:300]}")
    res = run_llama({"kind": "check", "gguf": m[gguf_key], "threads": a.threads, "prompt": prompt,
                     "gs_tokens": gs_tokens, "gs_top": g.get("top_logprobs") or [],
                     "kv_type": "f32", "flash_attn": "off", "verbose": a.verbose},
                    a.timeout)
    steps = res["steps"]
    # llama.cpp is teacher-forced on graphswap's tokens, so every position compares the same prefix
    mismatches = [i for i, s in enumerate(steps) if s["llama_argmax"] != s["graphswap"]]
    first_mismatch = mismatches[0] if mismatches else None
    tie = all(steps[i]["llama_lp_top1"] - steps[i]["llama_lp_of_graphswap_token"] <= tie_tol
              for i in mismatches)
    dl = [s["max_abs_dlogprob_topk"] for s in steps if s["max_abs_dlogprob_topk"] is not None]
    max_dlp = max(dl) if dl else None
    med_dlp = statistics.median(dl) if dl else None
    llama_tokens = [s["llama_argmax"] for s in steps]
    ok_tokens = not mismatches or tie
    ok_lp = max_dlp is not None and max_dlp <= tol and (med_tol is None or med_dlp <= med_tol)
    out = {"dtype": dt, "check": name, "what": what, "checkpoint": m["checkpoint"], "gguf": m[gguf_key],
           "graphswap_flags": list(GS_FLAGS[dt]), "prompt_ids": prompt, "graphswap_tokens": gs_tokens,
           "llama_tokens_teacher_forced": llama_tokens, "first_mismatch": first_mismatch,
           "mismatches": mismatches, "mismatch_is_near_tie": tie if mismatches else None,
           "max_abs_dlogprob_top20": max_dlp, "median_abs_dlogprob_top20": med_dlp,
           "logprob_tol": tol, "median_tol": med_tol, "tie_tol": tie_tol,
           "min_top1_top2_gap": min(s["llama_gap_top1_top2"] for s in steps),
           "tokens_match": first_mismatch is None, "ok": ok_tokens and ok_lp,
           "llama_config": "KV cache f32, flash attention off", "steps": steps}
    print(f"correctness check {name} ({what}; greedy, {n} tokens after a {len(prompt)}-token prompt; "
          "llama.cpp with an f32 KV cache and flash attention off):")
    print(f"  graphswap  : {gs_tokens}")
    print(f"  llama.cpp  : {llama_tokens}")
    if not mismatches:
        print(f"  tokens     : all {n} match")
    else:
        print(f"  tokens     : argmax differs at position(s) {mismatches}"
              + (f" (near-ties in llama.cpp's logits, within {tie_tol:g})" if tie else
                 f" (not all near-ties within {tie_tol:g})"))
    print(f"  logprobs   : |graphswap - llama.cpp| over graphswap's top-20 at each position: max "
          f"{max_dlp:.3g} nats (tolerance {tol:g}), median {med_dlp:.3g}"
          + (f" (tolerance {med_tol:g})" if med_tol is not None else "")
          + f"; smallest top-1/top-2 gap {out['min_top1_top2_gap']:.3g}" if max_dlp is not None else
          "  logprobs   : graphswap reported no top_logprobs")
    print(f"  result     : {'MATCH' if out['ok'] else 'MISMATCH'}")
    sys.stdout.flush()
    return out


# ---- machine info


def l3_bytes() -> int | None:
    """The last-level cache cpu0 sees (sysfs index3, e.g. 307200K), or None."""
    try:
        v = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return None
    m = re.fullmatch(r"(\d+)([KMG]?)", v)
    if not m:
        return None
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def machine_info(a) -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", lscpu, re.MULTILINE)
        info["cpu_model"] = m.group(1).strip() if m else None
    except FileNotFoundError:
        info["cpu_model"] = None
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
        info["cpu_flags"] = {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")}
    except OSError:
        info["cpu_flags"] = None
    info["nproc"] = os.cpu_count()
    info["l3_bytes"] = l3_bytes()
    try:
        info["mem_total_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    g = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    info["graphswap_commit"] = g.stdout.strip() or None
    d = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True)
    info["graphswap_tree_dirty"] = bool(d.stdout.strip())
    info["graphswap_binary"] = str(Path(a.graphswap).resolve())
    info["llama"] = run_llama({"kind": "info"}, a.timeout)
    return info


# ---- decode batch 1 against the read bandwidth, over the active parameters


def active_bandwidth(figs, raw, detail, summaries, l3: int | None = None) -> dict:
    """Per dtype with a decode batch-1 figure: bytes a token reads (model_summary) x median tok/s,
    as a share of the read bandwidth graphswap's bench decode measured in its own runs (median over
    every graphswap decode measurement of this compare.py run: same machine, same threads)."""
    bws = [d["read_bw_gbs"] for f in figs if f["kind"] == "decode"
           for d in detail[f["id"]]["graphswap"] if d.get("read_bw_gbs")]
    if not bws:
        return {}
    bw = statistics.median(bws)
    out = {}
    for f in figs:
        if f["kind"] != "decode" or f["batch"] != 1:
            continue
        sm = summaries[FILE_DTYPE[f["dtype"]]]
        row = {"read_bw_gbs": {"median": bw, "min": min(bws), "max": max(bws), "n": len(bws)},
               "l3_bytes": l3}
        for eng, key in (("graphswap", "graphswap"), ("llama.cpp", "llama.cpp")):
            vals = raw[f["id"]][eng]
            if not vals or key not in sm:
                continue
            tok_s = statistics.median(vals)
            b = sm[key]["bytes_active_per_token"]
            row[eng] = {"tok_s": tok_s, "bytes_per_token": b, "gb_s": tok_s * b / 1e9,
                        "fraction_of_read_bw": tok_s * b / 1e9 / bw,
                        "params_active_per_token": sm[key]["params_active_per_token"],
                        "params_total": sm[key]["params_total"]}
        out[f["dtype"]] = row
    return out


BW_HEAD = ["decode batch 1", "active MB/token", "tok/s (median)", "GB/s", "of read bw"]


def bw_rows(ab: dict) -> list[list[str]]:
    rows = []
    for dt, r in ab.items():
        for eng in ("graphswap", "llama.cpp"):
            if eng in r:
                e = r[eng]
                rows.append([f"{eng} {dt}", f"{e['bytes_per_token'] / 1e6:.1f}", f"{e['tok_s']:.1f}",
                             f"{e['gb_s']:.2f}", f"{100 * e['fraction_of_read_bw']:.1f}%"])
    return rows


def bw_note(ab: dict) -> str:
    bw = next(iter(ab.values()))["read_bw_gbs"]
    p = next((r["graphswap"] for r in ab.values() if "graphswap" in r), None)
    act = (f"; active parameters per token {p['params_active_per_token'] / 1e6:.1f}M of "
           f"{p['params_total'] / 1e6:.1f}M" if p else "")
    l3 = next(iter(ab.values())).get("l3_bytes")
    fits = sorted({dt for dt, r in ab.items() for e in ("graphswap", "llama.cpp")
                   if e in r and l3 and r[e]["bytes_per_token"] <= l3})
    over = any(r[e]["fraction_of_read_bw"] > 1 for r in ab.values() for e in ("graphswap", "llama.cpp")
               if e in r)
    cache = ""
    if l3 and (fits or over):
        cache = (f" This CPU has a {l3 / 2**20:.0f} MiB L3"
                 + (f" (the active bytes of {', '.join(fits)} fit in it)" if fits else "")
                 + ": consecutive tokens find part of the weights (for MoE: attention, lm_head and the "
                   "experts used again) in the cache, so the share of the DRAM read bandwidth can pass 100%.")
    return (f"read bandwidth {bw['median']:.2f} GB/s: median of the {bw['n']} graphswap bench decode runs "
            f"above (each measures it before decoding: a read of 512 MiB, all threads; "
            f"min {bw['min']:.2f}, max {bw['max']:.2f}){act}. "
            "Active bytes per token: attention, norms, router, the top-k experts (k/E of the expert "
            "tensors), lm_head, one embedding row; KV cache and activations not counted. llama.cpp's "
            "bytes are its GGUF's (router F32)." + cache)


def text_bw_table(ab: dict) -> str:
    rows = bw_rows(ab)
    w = [max(len(BW_HEAD[i]), *(len(r[i]) for r in rows)) for i in range(len(BW_HEAD))]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))
             for r in [BW_HEAD, ["-" * x for x in w]] + rows]
    return "\n".join(lines + [bw_note(ab)])


# ---- the table


def figures(a) -> list[dict]:
    out = []
    for dt in a.dtypes:
        for b in a.batches:
            out.append({"id": f"decode-b{b}-{dt}", "kind": "decode", "batch": b, "dtype": dt,
                        "label": f"decode batch {b}" + (" (total)" if b > 1 else ""), "unit": "tok/s"})
        for L in a.prefill:
            out.append({"id": f"prefill-{L}-{dt}", "kind": "prefill", "length": L, "dtype": dt,
                        "label": f"prefill {L}-token prompt", "unit": "tok/s"})
    return out


def summarize(vals: list[float]) -> dict | None:
    if not vals:
        return None
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "n": len(vals)}


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def table_rows(figs, raw) -> list[list[str]]:
    rows = []
    for f in figs:
        r = raw[f["id"]]
        sl, sg = summarize(r["llama.cpp"]), summarize(r["graphswap"])
        ratio = (sg["median"] / sl["median"]) if sl and sg and sl["median"] > 0 else None
        rows.append([f["label"], f["dtype"],
                     fmt(sl and sl["min"]), fmt(sl and sl["median"]), fmt(sl and sl["max"]),
                     fmt(sg and sg["min"]), fmt(sg and sg["median"]), fmt(sg and sg["max"]),
                     f"{ratio:.2f}x" if ratio else "-"])
    return rows


HEAD = ["figure (tok/s)", "dtype", "llama.cpp min", "median", "max", "graphswap min", "median", "max",
        "graphswap/llama.cpp"]


def text_table(rows) -> str:
    w = [max(len(HEAD[i]), *(len(r[i]) for r in rows)) for i in range(len(HEAD))]
    def line(r):
        return "  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r))
    return "\n".join([line(HEAD), line(["-" * x for x in w])] + [line(r) for r in rows])


def md_table(rows) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|" + "|".join(["---", "---"] + ["---:"] * 7) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def model_line(c: dict) -> str:
    """- model: ... for results.md, from the mkmodel arguments or the checkpoint's config.json."""
    sm = next(iter(c["model_summary"].values()))
    cf, gsb = sm["config"], sm["graphswap"]
    moe = (f"; {cf['num_experts']} experts, top-{cf['num_experts_per_tok']}, expert FFN "
           f"{cf['moe_intermediate_size']}, norm_topk_prob {cf.get('norm_topk_prob')}"
           if cf.get("num_experts") else "")
    size = (f"{gsb['params_total'] / 1e6:.1f}M parameters, {gsb['params_active_per_token'] / 1e6:.1f}M "
            "read per decode token")
    if c.get("mkmodel"):
        return f"- model: random-init {cf['architectures'][0]} ({' '.join(c['mkmodel'])}; {size}{moe})"
    cks = ", ".join(sorted({m["checkpoint"] for m in c["models"].values()}))
    return f"- model: {(cf.get('architectures') or ['?'])[0]} from {cks} ({size}{moe})"


def write_outputs(a, doc: dict, rows, final: bool):
    if not a.out:
        return
    od = Path(a.out)
    od.mkdir(parents=True, exist_ok=True)
    (od / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    if not final:
        return
    mi = doc["machine"]
    ll = mi.get("llama", {})
    c = doc["config"]
    flags = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in (mi.get("cpu_flags") or {}).items())
    md = [f"# graphswap vs llama.cpp (CPU)", "",
          f"- CPU: {mi.get('cpu_model')} ({mi.get('nproc')} logical CPUs; {flags})",
          f"- graphswap: commit {mi.get('graphswap_commit')}"
          + (" (working tree modified)" if mi.get("graphswap_tree_dirty") else ""),
          f"- llama.cpp: llama-cpp-python {ll.get('llama_cpp_python')}, ggml {ll.get('ggml_version')} "
          f"(commit {ll.get('ggml_commit')})",
          f"- llama.cpp CPU features: {ll.get('system_info')}",
          f"- threads {c['threads']} for both; {c['reps']} repetition(s) per figure, engines alternated; "
          f"decode {c['tokens']} tokens per sequence after a {P_DECODE}-token prompt "
          f"(first two untimed); prefill: median of {c['prefill_reps']} run(s) after a warm-up, per repetition",
          f"- llama.cpp: KV cache {c['kv_type']}, flash attention {c['flash_attn']}, no mmap; "
          "graphswap: captured plans, KV cache f32",
          model_line(c)]
    if "bf16x" in c["dtypes"]:
        md.append("- dtype bf16x: the bf16 checkpoint and GGUF again, graphswap with --bf16-activations "
                  "(activations rounded to bf16 inside each matmul, as llama.cpp's bf16 path does; the bf16 "
                  "rows keep graphswap's f32 activations)")
    if "bf16amx" in c["dtypes"]:
        md.append("- dtype bf16amx: the same, graphswap with --bf16-activations=amx (activations rounded to "
                  "bf16, summed in Intel AMX's TDPBF16PS order; native only where the CPU has AMX)")
    if "fp8" in c["dtypes"]:
        md.append(f"- dtype fp8: graphswap on a block-FP8 checkpoint ({' '.join(MKMODEL_DTYPE['fp8'])}: every "
                  "projection F8_E4M3 with an f32 scale per 128x128 block, embeddings / lm_head / norms bf16; "
                  "W8A16, f32 activations), llama.cpp on the Q8_0 GGUF of the same weights (hf_to_gguf.py "
                  "--outtype q8_0: f32(code) x scale, then Q8_0 for every matrix, token_embd and output "
                  "included, norms F32, as llama.cpp's own converter does)")
    if "fp8lm" in c["dtypes"]:
        md.append("- dtype fp8lm: graphswap on the F32 checkpoint with --quantization fp8 --quantize-lm-head "
                  "(every projection and lm_head block-FP8, 128x128 blocks, quantized at load; embeddings and "
                  "norms f32, one embedding row read per token; W8A16, f32 activations), llama.cpp on the Q8_0 "
                  "GGUF of its dequantized twin (mkmodel --fp8-dequantized --fp8-lm-head: the same codes and "
                  "scales), so both read one byte per weight of every matrix")
    for d in ("fp8x", "fp8lmx"):
        if d in c["dtypes"]:
            md.append(f"- dtype {d}: {d[:-1]} with --bf16-activations (each FP8 weight dequantized and rounded to "
                      "bf16 in registers, activations rounded to bf16, products summed in pairs: vdpbf16ps on "
                      "AVX512_BF16, an exact emulation elsewhere)")
    md.append("")
    chk = doc.get("check")
    if chk:
        for dt, r in chk["by_dtype"].items():
            lp = r.get("max_abs_dlogprob_top20")
            md.append(f"- correctness {dt} ({r['what']}; greedy, 16 tokens): "
                      f"{'match' if r['ok'] else 'MISMATCH'}"
                      + ("" if r["tokens_match"] else f" (argmax differs at {r['mismatches']}: "
                         "near-ties)")
                      + (f"; |d logprob| over top-20: max {lp:.3g} (tolerance {r['logprob_tol']:g}), "
                         f"median {r['median_abs_dlogprob_top20']:.3g}"
                         + (f" (tolerance {r['median_tol']:g})" if r.get("median_tol") is not None else "")
                         if lp is not None else ""))
        md.append("")
    md.append(md_table(rows))
    md.append("")
    md.append("tok/s: decode = tokens generated per second summed over the batch; prefill = prompt "
              "tokens per second. Ratio = median graphswap / median llama.cpp (> 1: graphswap faster).")
    ab = doc.get("active_bandwidth")
    if ab:
        md += ["", "| " + " | ".join(BW_HEAD) + " |", "|---|" + "---:|" * (len(BW_HEAD) - 1)]
        md += ["| " + " | ".join(r) + " |" for r in bw_rows(ab)]
        md += ["", bw_note(ab)]
    (od / "results.md").write_text("\n".join(md) + "\n")


# ---- self-test of the parsers


def selftest() -> int:
    dec = """model: /tmp/m  params: 124.7M  weight bytes per decode step: 400.4 MB  threads: 2
memcpy bandwidth: 19.57 GB/s   read bandwidth: 32.43 GB/s
floor at batch 1: 97.75 tok/s (memcpy)   161.97 tok/s (read)
batch  mode         tok/s    step ms GB/s weights     vs floor   vs read
1      plan         56.29      17.76        22.54       115.5%     63.2%
1      eager        50.00      20.00        20.00       100.0%     50.0%
4      plan        204.60      19.55        20.48       104.9%     57.4%
16     plan        604     26.5 x
"""
    assert parse_gs_decode(dec, 1) == {"tok_s": 56.29, "step_ms": 17.76, "read_bw_gbs": 32.43,
                                       "memcpy_bw_gbs": 19.57}
    assert parse_gs_decode(dec, 1, "eager")["tok_s"] == 50.0
    assert parse_gs_decode(dec, 4)["tok_s"] == 204.6
    assert parse_gs_decode(dec, 16)["tok_s"] == 604.0
    assert parse_gs_decode(dec, 32) is None
    assert "read_bw_gbs" not in parse_gs_decode(dec.split("\n", 3)[3], 4)  # no bandwidth lines
    pre = """FMA peak: 230.5 GFLOP/s (2 threads)
len         tok/s         ms     min ms     max ms    GFLOP/s   % peak
128        1000.0      128.0
512        1234.5      414.74      414.74      414.74      109.4    47.4%
"""
    assert parse_gs_prefill(pre, 512) == {"tok_s": 1234.5}
    assert parse_gs_prefill(pre, 128) == {"tok_s": 1000.0}
    assert parse_gs_prefill(pre, 2048) is None
    assert parse_gs_prefill(dec, 1) is None  # no `len` header
    print("parser self-test: ok")
    return 0


# ---- main


def csv_ints(s: str) -> list[int]:
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")
    if any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError("values must be positive")
    return v


def main() -> int:
    if "--_worker" in sys.argv[1:]:
        return worker_main()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphswap", default=str(REPO / "build" / "graphswap"), help="graphswap binary")
    ap.add_argument("--workdir", default="/tmp/gs-llamacpp", help="checkpoints and GGUF files")
    ap.add_argument("--out", help="folder for results.md and results.json")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines (default 2)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per figure (default 3)")
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per sequence (default 64, >= 4)")
    ap.add_argument("--batches", type=csv_ints, default=[1, 4, 16, 32], help="decode batches (default 1,4,16,32)")
    ap.add_argument("--prefill", type=csv_ints, default=[512], help="prefill lengths (default 512)")
    ap.add_argument("--prefill-reps", type=int, default=3,
                    help="timed prefills per repetition, median taken, after a warm-up (default 3)")
    ap.add_argument("--dtypes", default="f32,bf16,bf16x",
                    help="f32, bf16, bf16x (the BF16 checkpoint, graphswap with --bf16-activations), "
                         "bf16amx (the same with --bf16-activations=amx), fp8 (a block-FP8 checkpoint "
                         "against llama.cpp's Q8_0 of the same weights), fp8lm (online FP8 of every "
                         "matrix, lm_head included, against Q8_0 of the same weights), fp8x / fp8lmx (the "
                         "two with --bf16-activations: FP8 weights to bf16 in registers, vdpbf16ps where the CPU "
                         "has AVX512_BF16, as SGLang's CPU backend runs FP8); default the first three")
    ap.add_argument("--arch", choices=["qwen3", "qwen3_moe"], default="qwen3",
                    help="random checkpoints to make: dense Qwen3 (default) or Qwen3-MoE (same attention "
                         "and embeddings, every FFN a MoE: --experts, --experts-per-tok, --moe-intermediate)")
    ap.add_argument("--experts", type=int, default=MOE_DEFAULTS["experts"],
                    help=f"qwen3_moe: experts per layer (default {MOE_DEFAULTS['experts']})")
    ap.add_argument("--experts-per-tok", type=int, default=MOE_DEFAULTS["experts_per_tok"],
                    help=f"qwen3_moe: top-k (default {MOE_DEFAULTS['experts_per_tok']})")
    ap.add_argument("--moe-intermediate", type=int, default=MOE_DEFAULTS["moe_intermediate"],
                    help=f"qwen3_moe: expert FFN width (default {MOE_DEFAULTS['moe_intermediate']})")
    ap.add_argument("--moe-fused", action="store_true",
                    help="qwen3_moe: checkpoints in transformers 5's fused expert layout "
                         "(experts.gate_up_proj / down_proj; the same weights, separate checkpoint names)")
    ap.add_argument("--checkpoint-f32", help="use this F32 checkpoint instead of making one")
    ap.add_argument("--checkpoint-bf16", help="use this BF16 checkpoint instead of making one")
    ap.add_argument("--checkpoint-fp8", help="use this block-FP8 checkpoint (quantization_config fp8) "
                                             "instead of making one")
    ap.add_argument("--kv-type", choices=["f16", "f32", "bf16"], default="f16",
                    help="llama.cpp KV cache type for the timings (default f16, llama.cpp's default)")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp flash attention (default auto, llama.cpp's default)")
    ap.add_argument("--check", action="store_true", help="run only the correctness check")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check before timing")
    ap.add_argument("--logprob-tol", type=float, default=1e-3,
                    help="max |d logprob| in nats for the check (default 0.001)")
    ap.add_argument("--tie-tol", type=float, default=1e-3,
                    help="a token mismatch whose llama.cpp logprob gap is below this counts as a tie")
    ap.add_argument("--bf16x-max-tol", type=float, default=BF16X_MAX_TOL,
                    help=f"bf16x check: max |d logprob| over the positions (default {BF16X_MAX_TOL:g})")
    ap.add_argument("--bf16x-median-tol", type=float, default=BF16X_MEDIAN_TOL,
                    help=f"bf16x check: median over the positions (default {BF16X_MEDIAN_TOL:g})")
    ap.add_argument("--bf16x-tie-tol", type=float, default=BF16X_TIE_TOL,
                    help=f"bf16x check: tie tolerance (default {BF16X_TIE_TOL:g})")
    ap.add_argument("--q8-max-tol", type=float, default=Q8_MAX_TOL,
                    help=f"fp8 check (Q8_0 GGUF): max |d logprob| over the positions (default {Q8_MAX_TOL:g})")
    ap.add_argument("--q8-median-tol", type=float, default=Q8_MEDIAN_TOL,
                    help=f"fp8 check (Q8_0 GGUF): median over the positions (default {Q8_MEDIAN_TOL:g})")
    ap.add_argument("--q8-tie-tol", type=float, default=Q8_TIE_TOL,
                    help=f"fp8 check (Q8_0 GGUF): tie tolerance (default {Q8_TIE_TOL:g})")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess (default 1800)")
    ap.add_argument("--verbose", action="store_true", help="let llama.cpp log to stderr")
    ap.add_argument("--selftest", action="store_true", help="test the graphswap output parsers and exit")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    if not a.dtypes or any(d not in GS_FLAGS for d in a.dtypes):
        die("--dtypes takes a list of f32, bf16, bf16x, bf16amx, fp8, fp8lm, fp8x, fp8lmx")
    if ("fp8lm" in a.dtypes or "fp8lmx" in a.dtypes) and a.arch != "qwen3":
        die("--dtypes fp8lm makes dense checkpoints only (use --arch qwen3)")
    if "fp8" in a.dtypes and a.arch != "qwen3" and not a.checkpoint_fp8:
        die("--dtypes fp8 makes dense checkpoints only (graphswap mkmodel --fp8 quantizes dense targets); "
            "use --arch qwen3 or --checkpoint-fp8 DIR")
    if a.tokens < 4:
        die("--tokens must be >= 4 (two untimed steps)")
    if a.reps < 1 or a.prefill_reps < 1 or a.threads < 1:
        die("--reps, --prefill-reps and --threads must be >= 1")
    a.dtypes = list(dict.fromkeys(a.dtypes))
    if a.arch == "qwen3_moe" and not (a.experts >= 1 and 1 <= a.experts_per_tok <= a.experts
                                      and a.moe_intermediate >= 1):
        die("--experts, --experts-per-tok (1..experts) and --moe-intermediate must be positive")
    if a.arch == "qwen3" and (a.moe_fused or [a.experts, a.experts_per_tok, a.moe_intermediate] !=
                              list(MOE_DEFAULTS.values())):
        die("--experts / --experts-per-tok / --moe-intermediate / --moe-fused need --arch qwen3_moe")
    if not (Path(a.graphswap).is_file() and os.access(a.graphswap, os.X_OK)):
        die(f"graphswap binary {a.graphswap} not found (build it, or pass --graphswap PATH)")
    try:
        import llama_cpp  # noqa: F401
        import gguf  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        die(f"{e}: run this with the bench venv's python (bench/llamacpp/setup.sh, then "
            "/tmp/llvenv/bin/python bench/llamacpp/compare.py ...)")

    gs = Graphswap(a.graphswap, a.threads, a.timeout)
    models = ensure_checkpoints(a)
    summaries = {dt: model_summary(models[dt]["checkpoint"], models[dt]["gguf"], GS_FLAGS.get(dt, ()))
                 for dt in dict.fromkeys(FILE_DTYPE[d] for d in a.dtypes)}
    doc = {"config": {"threads": a.threads, "reps": a.reps, "tokens": a.tokens, "batches": a.batches,
                      "prefill": a.prefill, "prefill_reps": a.prefill_reps, "dtypes": a.dtypes,
                      "kv_type": a.kv_type, "flash_attn": a.flash_attn, "models": models,
                      "arch": a.arch,
                      "mkmodel": None if (a.checkpoint_f32 or a.checkpoint_bf16 or a.checkpoint_fp8)
                      else mkmodel_geometry(a),
                      "mkmodel_dtype": {d: MKMODEL_DTYPE[FILE_DTYPE[d]] for d in a.dtypes},
                      "model_summary": summaries,
                      "decode_prompt_tokens": P_DECODE,
                      "graphswap_commands": {
                          "decode": f"{a.graphswap} bench decode --model CKPT --threads {a.threads} "
                                    f"--tokens {a.tokens} --batches B --modes plan",
                          "prefill": f"{a.graphswap} bench prefill --model CKPT --threads {a.threads} "
                                     f"--lengths L --reps {a.prefill_reps}"}},
           "machine": machine_info(a)}

    if a.check or not a.no_check:
        chk = correctness_checks(a, gs, models)
        doc["check"] = chk
        if a.check or not chk["ok"]:
            write_outputs(a, doc, [], final=False)
            if not chk["ok"]:
                bad = [d for d, r in chk["by_dtype"].items() if not r["ok"]]
                die(f"correctness check failed ({', '.join(bad)}): graphswap and llama.cpp disagree "
                    "(converter or engine bug); see the lines above", code=2)
            return 0

    figs = figures(a)
    raw = {f["id"]: {"llama.cpp": [], "graphswap": []} for f in figs}
    detail = {f["id"]: {"llama.cpp": [], "graphswap": []} for f in figs}
    doc["figures"] = figs
    doc["raw"] = raw  # tok/s per repetition, in run order
    doc["detail"] = detail  # everything each measurement returned (step ms, prefill ms, ...)
    t_start = time.time()
    for rep in range(a.reps):
        order = ["llama.cpp", "graphswap"] if rep % 2 == 0 else ["graphswap", "llama.cpp"]
        for f in figs:
            m = models[f["dtype"]]
            got = {}
            for eng in order:
                if f["kind"] == "decode":
                    if eng == "llama.cpp":
                        r = run_llama({"kind": "decode", "gguf": m["gguf"], "threads": a.threads,
                                       "batch": f["batch"], "tokens": a.tokens, "kv_type": a.kv_type,
                                       "flash_attn": a.flash_attn, "verbose": a.verbose}, a.timeout)
                    else:
                        r = gs.decode(m["checkpoint"], f["batch"], a.tokens, GS_FLAGS[f["dtype"]])
                else:
                    if eng == "llama.cpp":
                        r = run_llama({"kind": "prefill", "gguf": m["gguf"], "threads": a.threads,
                                       "length": f["length"], "reps": a.prefill_reps,
                                       "kv_type": a.kv_type, "flash_attn": a.flash_attn,
                                       "verbose": a.verbose}, a.timeout)
                    else:
                        r = gs.prefill(m["checkpoint"], f["length"], a.prefill_reps, GS_FLAGS[f["dtype"]])
                raw[f["id"]][eng].append(r["tok_s"])
                detail[f["id"]][eng].append(dict(r, rep=rep))
                got[eng] = r["tok_s"]
            log(f"[rep {rep + 1}/{a.reps}] {f['label']:28s} {f['dtype']:4s}  llama.cpp {got['llama.cpp']:9.1f}"
                f"  graphswap {got['graphswap']:9.1f} tok/s  ({time.time() - t_start:.0f}s)")
        write_outputs(a, doc, table_rows(figs, raw), final=False)

    rows = table_rows(figs, raw)
    doc["active_bandwidth"] = active_bandwidth(figs, raw, detail, summaries, doc["machine"].get("l3_bytes"))
    doc["summary"] = {f["id"]: {"llama.cpp": summarize(raw[f["id"]]["llama.cpp"]),
                                "graphswap": summarize(raw[f["id"]]["graphswap"])} for f in figs}
    mi = doc["machine"]
    print()
    print(f"graphswap vs llama.cpp, {a.threads} threads, {a.reps} reps; CPU {mi.get('cpu_model')}; "
          f"graphswap {str(mi.get('graphswap_commit'))[:12]}; llama-cpp-python "
          f"{mi['llama'].get('llama_cpp_python')} (ggml {mi['llama'].get('ggml_version')} "
          f"{mi['llama'].get('ggml_commit')})")
    print(text_table(rows))
    print("decode: tokens/s summed over the batch; prefill: prompt tokens/s; ratio: median graphswap / "
          "median llama.cpp")
    if doc["active_bandwidth"]:
        print()
        print(text_bw_table(doc["active_bandwidth"]))
    write_outputs(a, doc, rows, final=True)
    if a.out:
        print(f"wrote {Path(a.out) / 'results.md'} and {Path(a.out) / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
