"""graphswap trainer-side client: push new weights into a running graphswap server.

Install: `pip install clients/python` (one module, no dependencies; offline:
`pip install --no-build-isolation clients/python`). The module needs only the standard library:
numpy and torch are imported lazily, only when such tensors are given. Tensors may be
  - PyTorch tensors (bfloat16, float16, float32; moved to the CPU),
  - numpy arrays (float32, float16),
  - Tensor objects, raw little-endian bytes with a dtype and shape: Tensor("BF16", [2, 3], data), or
    from Python floats: from_floats([0.5, 1.0, ...], [2, 3], "BF16") (round to nearest even).
An RL loop calls, after each optimizer step:

    from graphswap_client import GraphswapClient
    gs = GraphswapClient("http://127.0.0.1:8080", admin_key=None)
    gs.update_weights(model.state_dict().items(), version="step-%d" % step)   # begin, buckets, finish

update_weights() groups tensors into buckets of `bucket_bytes` (default 512 MiB, a safetensors body
per HTTP call), runs one session (begin -> buckets -> finish) and aborts it if anything fails, so the
server never serves a half-written model silently (it reports "inconsistent" until a complete update).
Names are the checkpoint's (Hugging Face) names; for model="all" prefix drafter tensors with "draft.".

Other calls: begin / send_bucket / finish / abort (the same session by hand), load_from_disk (a
checkpoint folder under the server's --weights-root), info, checksums and verify (compare the
server's SHA-256 of every stored tensor with another server's, e.g. a cold start on the same
checkpoint), and verify_state_dict (compare the server's checkpoint-name checksums with the trainer's
own tensors: tensor_sha256 / state_dict_checksums compute the same hash locally, SHA-256 of the
tensor's values in the checkpoint dtype, row-major, little endian).

GPU transports (the server must run --backend cuda; PyTorch with CUDA is needed here, imported only
when these are called; this module imports without torch):

    # CUDA IPC: trainer and server on the same GPU. One reusable device buffer of bucket_bytes is
    # shared once per session (cudaIpcMemHandle via torch's storage sharing); each bucket is packed
    # into it and the server copies device -> device.
    gs.update_weights_ipc(model.state_dict().items(), bucket_bytes=1 << 30, version="step-%d" % step)

    # NCCL (vLLM / SGLang shape): the trainer is rank 0 of a 2-rank communicator, the server rank 1.
    # torch.distributed is not needed: torch.cuda.nccl (the NCCL bindings PyTorch ships) creates the
    # unique id and the communicator; the server gets the id in init_info.nccl_unique_id_b64.
    nc = gs.nccl_init()                          # once (POST /init_weight_transfer_engine)
    gs.update_weights_nccl(nc, model.state_dict().items(), version="step-%d" % step)
    gs.nccl_destroy(nc)                          # POST /destroy_weights_update_group

Packing: IPC buckets place tensor i at the first multiple of 256 bytes at or after the end of
tensor i-1 (tensor 0 at byte 0), each in its own dtype (bfloat16, float16, float32), and send the
offsets. NCCL sends what vLLM's NCCLWeightTransferEngine.trainer_send_weights(packed=True) sends:
the tensors cut into chunks (a chunk takes tensors until its bytes exceed packed_buffer_size_bytes),
each chunk one ncclBroadcast (root 0, uint8) of its tensors back to back; SGLang's route takes one
broadcast per tensor (its default load_format).
"""
import hashlib
import http.client
import json
import struct
import sys
import urllib.parse

__all__ = ["GraphswapClient", "GraphswapError", "Tensor", "from_floats", "to_safetensors", "pack_plan",
           "vllm_chunks", "vllm_chunk_bytes", "tensor_sha256", "state_dict_checksums"]

ALIGN = 256  # byte alignment of each tensor in a GPU-transport bucket (the server's GPU_ALIGN)


class GraphswapError(RuntimeError):
    def __init__(self, status, body):
        self.status = status
        self.body = body
        try:
            msg = json.loads(body)["error"]["message"]
        except Exception:  # noqa: BLE001 - any non-JSON body
            msg = body[:500].decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        super().__init__("HTTP %d: %s" % (status, msg))


_WIDTH = {"BF16": 2, "F16": 2, "F32": 4}


class Tensor:
    """A tensor as raw bytes: dtype "BF16", "F16" or "F32", shape, row-major little-endian data."""

    def __init__(self, dtype, shape, data):
        if dtype not in _WIDTH:
            raise TypeError("unsupported dtype %r (BF16, F16 or F32)" % (dtype,))
        self.dtype, self.shape, self.data = dtype, [int(d) for d in shape], bytes(data)
        n = 1
        for d in self.shape:
            n *= d
        if n * _WIDTH[dtype] != len(self.data):
            raise ValueError("%d bytes for shape %r of %s (expected %d)" % (len(self.data), self.shape, dtype,
                                                                           n * _WIDTH[dtype]))
        self.nbytes = len(self.data)


def _bf16_bits(f32_bits):
    """bfloat16 bits of a float32 (its bits as an int): round to nearest even; NaN stays NaN."""
    if (f32_bits & 0x7F800000) == 0x7F800000 and (f32_bits & 0x007FFFFF):
        return (f32_bits >> 16) | 0x0040  # a quiet NaN
    return ((f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16) & 0xFFFF


def _floats_to_bytes(values, dtype):
    """Little-endian bytes of Python floats in dtype (BF16 / F16 round to nearest even)."""
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    # BF16: the float32 value first (as torch: a double rounds to float32, then to bfloat16)
    bits = struct.unpack("<%dI" % len(values), struct.pack("<%df" % len(values), *values))
    return struct.pack("<%dH" % len(values), *(_bf16_bits(b) for b in bits))


def _bytes_to_floats(data, dtype):
    if dtype == "F32":
        return list(struct.unpack("<%df" % (len(data) // 4), data))
    if dtype == "F16":
        return list(struct.unpack("<%de" % (len(data) // 2), data))
    h = struct.unpack("<%dH" % (len(data) // 2), data)
    return list(struct.unpack("<%df" % len(h), struct.pack("<%dI" % len(h), *(x << 16 for x in h))))


def from_floats(values, shape=None, dtype="BF16"):
    """A Tensor from a flat sequence of Python floats (no numpy needed); shape defaults to [len]."""
    values = [float(v) for v in values]
    return Tensor(dtype, [len(values)] if shape is None else shape, _floats_to_bytes(values, dtype))


def _torch_cpu_bytes(t):
    """Raw bytes of a contiguous CPU torch tensor without numpy (ctypes reads its memory)."""
    import ctypes

    n = t.numel() * t.element_size()
    if sys.byteorder != "little":
        raise RuntimeError("a big-endian host: convert the tensors to numpy first")
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def _tensor_bytes(t):
    """(dtype name, shape, raw little-endian bytes) of a Tensor, a numpy array or a torch tensor."""
    if isinstance(t, Tensor):
        return t.dtype, list(t.shape), t.data
    mod = type(t).__module__
    if mod.startswith("torch"):
        import torch  # only when torch tensors are given

        t = t.detach().to("cpu").contiguous()
        names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
        if t.dtype not in names:
            raise TypeError("unsupported torch dtype %s" % t.dtype)
        return names[t.dtype], list(t.shape), _torch_cpu_bytes(t)
    if isinstance(t, (bytes, bytearray, list, tuple)):
        raise TypeError("give raw bytes as Tensor(dtype, shape, data) and Python floats as from_floats(...)")
    import numpy as np

    a = np.ascontiguousarray(t)
    names = {np.dtype("float32"): "F32", np.dtype("float16"): "F16"}
    if a.dtype not in names:
        raise TypeError("unsupported numpy dtype %s (use float32 or float16)" % a.dtype)
    return names[a.dtype], list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def tensor_sha256(t, dtype):
    """The server's checkpoint-name checksum of one tensor (GET /v1/weights/checksums?names=checkpoint):
    SHA-256 of its values converted to `dtype` (the answer's "dtype", the checkpoint's torch_dtype:
    "BF16", "F16" or "F32"; round to nearest even), row-major, little endian. t: a torch tensor, a
    numpy array (float64 is taken as float32 first, as the server would receive it) or a Tensor."""
    if dtype not in _WIDTH:
        raise ValueError("unsupported hash dtype %r" % (dtype,))
    if isinstance(t, Tensor):
        raw = t.data if t.dtype == dtype else _floats_to_bytes(_bytes_to_floats(t.data, t.dtype), dtype)
        return hashlib.sha256(raw).hexdigest()
    if type(t).__module__.startswith("torch"):
        import torch

        tdt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
        return hashlib.sha256(_torch_cpu_bytes(t.detach().to("cpu").to(tdt).contiguous())).hexdigest()
    import numpy as np

    a = np.ascontiguousarray(t)
    if dtype == "F32" or dtype == "F16":
        want = np.dtype("<f4") if dtype == "F32" else np.dtype("<f2")
        if a.dtype != want:
            a = a.astype(np.float32).astype(want)  # numpy rounds to nearest even
        return hashlib.sha256(a.tobytes()).hexdigest()
    bits = np.ascontiguousarray(a.astype(np.float32)).view(np.uint32).astype(np.uint64)
    nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
    rne = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    out = np.where(nan, (bits >> 16) | 0x0040, rne).astype("<u2")
    return hashlib.sha256(out.tobytes()).hexdigest()


def _expert_slice(t, e, r0, r1):
    """Rows [r0, r1) of expert e of a stacked [E, R, C] tensor (torch, numpy or Tensor)."""
    if isinstance(t, Tensor):
        row = t.shape[2] * _WIDTH[t.dtype]
        base = e * t.shape[1] * row
        return Tensor(t.dtype, [r1 - r0, t.shape[2]], t.data[base + r0 * row:base + r1 * row])
    return t[e, r0:r1]


def split_fused_experts(name, t):
    """transformers 5's fused Qwen3-MoE expert tensors as the per-expert checkpoint names the server
    reports checksums by: `...mlp.experts.gate_up_proj` [E, 2I, H] -> each expert's `gate_proj.weight`
    (rows 0..I) and `up_proj.weight` (rows I..2I); `...mlp.experts.down_proj` [E, H, I] -> each
    expert's `down_proj.weight`. Any other tensor: [(name, t)]."""
    for fused in ("gate_up_proj", "down_proj"):
        if name.endswith(".mlp.experts." + fused) and len(getattr(t, "shape", ())) == 3:
            pre = name[: -len(fused)]
            E, R = int(t.shape[0]), int(t.shape[1])
            if fused == "down_proj":
                return [("%s%d.down_proj.weight" % (pre, e), _expert_slice(t, e, 0, R)) for e in range(E)]
            out = []
            for e in range(E):
                out.append(("%s%d.gate_proj.weight" % (pre, e), _expert_slice(t, e, 0, R // 2)))
                out.append(("%s%d.up_proj.weight" % (pre, e), _expert_slice(t, e, R // 2, R)))
            return out
    return [(name, t)]


def state_dict_checksums(named, dtype):
    """{name: tensor_sha256(t, dtype)} of a state_dict (a dict, or (name, tensor) pairs); fused
    Qwen3-MoE expert tensors are hashed per expert part, under the names the server reports
    (split_fused_experts)."""
    items = named.items() if hasattr(named, "items") else named
    return {n: tensor_sha256(x, dtype) for name, t in items for n, x in split_fused_experts(name, t)}


def to_safetensors(named):
    """Serialises [(name, tensor)] as safetensors bytes (header padded to 8 bytes)."""
    header, chunks, off = {}, [], 0
    for name, t in named:
        dt, shape, raw = _tensor_bytes(t)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)


class GraphswapClient:
    def __init__(self, base_url="http://127.0.0.1:8080", admin_key=None, timeout=600.0):
        u = urllib.parse.urlparse(base_url)
        if u.scheme != "http":
            raise ValueError("only http:// URLs are supported")
        self.host, self.port = u.hostname, u.port or 80
        self.admin_key = admin_key
        self.timeout = timeout

    # ---- plumbing -------------------------------------------------------------------------------
    def _call(self, method, path, body=None, content_type="application/json"):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            h = {}
            if body is not None:
                if not isinstance(body, (bytes, bytearray)):
                    body = json.dumps(body).encode()
                h["Content-Type"] = content_type
            if self.admin_key:
                h["Authorization"] = "Bearer " + self.admin_key
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            if r.status != 200:
                raise GraphswapError(r.status, data)
            return json.loads(data) if data else {}
        finally:
            c.close()

    # ---- one session by hand -------------------------------------------------------------------
    def begin(self, mode="full", model="target", pause="wait", version=None):
        body = {"mode": mode, "model": model, "pause": pause}
        if version is not None:
            body["version"] = str(version)
        return self._call("POST", "/v1/weights/begin", body)["session"]

    def send_bucket(self, named):
        """named: [(name, tensor)] -> one safetensors bucket."""
        return self._call("POST", "/v1/weights/bucket", to_safetensors(named), "application/octet-stream")

    def finish(self, version=None):
        return self._call("POST", "/v1/weights/finish", {} if version is None else {"version": str(version)})

    def abort(self):
        return self._call("POST", "/v1/weights/abort", {})

    # ---- memory release for a colocated trainer (vLLM sleep mode routes) ---------------------------
    def sleep(self, level=1):
        """POST /sleep?level=: level 1 keeps a host copy of the weights, level 2 discards them (a full
        update must follow the wake-up). Returns the state ({"is_sleeping", "sleeping_tags", ...})."""
        if level not in (1, 2):
            raise ValueError("level must be 1 or 2")
        return self._call("POST", "/sleep?level=%d" % level)

    def wake_up(self, tags=None):
        """POST /wake_up[?tags=...]: tags None = everything, else a subset of ("weights", "kv_cache")."""
        q = "&".join("tags=" + urllib.parse.quote(t) for t in (tags or ()))
        return self._call("POST", "/wake_up" + ("?" + q if q else ""))

    def is_sleeping(self):
        return bool(self._call("GET", "/is_sleeping").get("is_sleeping"))

    # ---- whole updates ---------------------------------------------------------------------------
    def update_weights(self, named, bucket_bytes=512 << 20, mode="full", model="target", pause="wait",
                       version=None):
        """Pushes every (name, tensor) in buckets of about bucket_bytes; returns GET /v1/weights."""
        self.begin(mode=mode, model=model, pause=pause, version=version)
        try:
            bucket, size = [], 0
            for name, t in named:
                nbytes = _nbytes(t)
                if bucket and size + nbytes > bucket_bytes:
                    self.send_bucket(bucket)
                    bucket, size = [], 0
                bucket.append((name, t))
                size += nbytes
            if bucket:
                self.send_bucket(bucket)
            self.finish(version)
        except BaseException:
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - the session may already be closed (422 closes it)
                pass
            raise
        return self.info()

    def load_from_disk(self, path, draft_path=None, mode="full", model="target", pause="wait", version=None):
        body = {"path": path, "mode": mode, "model": model, "pause": pause}
        if draft_path:
            body["draft_path"] = draft_path
        if version is not None:
            body["version"] = str(version)
        return self._call("POST", "/v1/weights/load", body)

    # ---- CUDA IPC (same GPU) -----------------------------------------------------------------------
    def update_weights_ipc(self, named, bucket_bytes=512 << 20, mode="full", model="target", pause="wait",
                           version=None, device=None):
        """One session over CUDA IPC: a reusable CUDA buffer of bucket_bytes is opened by the server
        once (POST /v1/weights/ipc/open), every bucket is packed into it and announced with
        POST /v1/weights/ipc/bucket (the server copies device -> device and returns when done, so the
        buffer is reused at once); finish unmaps it. Returns GET /v1/weights."""
        import torch

        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        buf = torch.empty(bucket_bytes, dtype=torch.uint8, device=dev)
        handle, offset = _ipc_handle(buf)
        self.begin(mode=mode, model=model, pause=pause, version=version)
        try:
            self._call("POST", "/v1/weights/ipc/open", {"handle_b64": handle, "bytes": bucket_bytes, "offset": offset})
            for entries, _total in pack_plan(named, bucket_bytes):
                _pack_into(buf, entries)
                torch.cuda.synchronize(dev)  # the server reads the buffer from another process
                names, dtypes, shapes, offsets = _torch_meta(entries)
                self._call("POST", "/v1/weights/ipc/bucket",
                           {"names": names, "dtypes": dtypes, "shapes": shapes, "offsets": offsets})
            self.finish(version)
        except BaseException:
            try:
                self.abort()
            except Exception:  # noqa: BLE001
                pass
            raise
        finally:
            del buf
        return self.info()

    # ---- NCCL (vLLM / SGLang routes) ---------------------------------------------------------------
    def nccl_init(self, world_size=2, rank_offset=1, staging_bytes=None, device=None, timeout_s=None):
        """Creates the communicator: this process is rank 0, the server rank_offset. The server call
        blocks until both sides have joined, so it runs on a thread while this side joins."""
        import base64

        import torch
        import torch.cuda.nccl as tnccl

        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        uid = tnccl.unique_id()
        info = {"master_address": self.host, "master_port": 0, "rank_offset": rank_offset,
                "world_size": world_size, "nccl_unique_id_b64": base64.b64encode(bytes(uid)).decode()}
        if staging_bytes:
            info["staging_bytes"] = int(staging_bytes)
        if timeout_s:
            info["timeout_s"] = int(timeout_s)
        call = _Call(self._call, "POST", "/init_weight_transfer_engine", {"init_info": info})
        with torch.cuda.device(dev):
            comm = tnccl.init_rank(world_size, uid, 0)
        r = call.join()
        return NcclGroup(comm, dev, world_size, int(r["staging_bytes"]))

    def nccl_send_sglang(self, group, named, version=None):
        """SGLang's one-shot /update_weights_from_distributed (a partial session of these tensors),
        one broadcast per tensor in order, as SGLang's trainers send them."""
        import torch
        import torch.cuda.nccl as tnccl

        names, dtypes, shapes, _ = _torch_meta([(n, t, 0) for n, t in named])
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": "graphswap", "flush_cache": True}
        if version is not None:
            body["weight_version"] = str(version)
        call = _Call(self._call, "POST", "/update_weights_from_distributed", body)
        with torch.cuda.device(group.device):
            stream = torch.cuda.current_stream(group.device)
            for _, t in named:
                tnccl.broadcast([t.contiguous().view(-1).view(torch.uint8)], root=0, streams=[stream],
                                comms=[group.comm])
        return call.join()

    def update_weights_nccl(self, group, named, bucket_bytes=None, mode="full", model="target", pause="wait",
                            version=None):
        """One vLLM-shaped session: POST /start_weight_update, one /update_weights whose tensors go
        as vLLM's packed chunks (vllm_chunks), POST /finish_weight_update. Returns GET /v1/weights."""
        import torch
        import torch.cuda.nccl as tnccl

        named = [(n, t) for n, t in named]
        chunk = vllm_chunk_bytes(named, min(bucket_bytes or group.staging_bytes, group.staging_bytes),
                                 group.staging_bytes)
        names, dtypes, shapes, _ = _torch_meta([(n, t, 0) for n, t in named])
        body = {"mode": mode, "model": model, "pause": pause}
        if version is not None:
            body["version"] = str(version)
        self._call("POST", "/start_weight_update", body)
        try:
            info = {"names": names, "dtype_names": dtypes, "shapes": shapes, "packed": True,
                    "packed_buffer_size_bytes": chunk}
            call = _Call(self._call, "POST", "/update_weights", {"update_info": info})
            with torch.cuda.device(group.device):
                stream = torch.cuda.current_stream(group.device)
                for part in vllm_chunks(named, chunk):
                    flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in part])
                    tnccl.broadcast([flat], root=0, streams=[stream], comms=[group.comm])
            call.join()
            self._call("POST", "/finish_weight_update", {} if version is None else {"weight_version": str(version)})
        except BaseException:
            try:
                self.abort()
            except Exception:  # noqa: BLE001
                pass
            raise
        return self.info()

    def nccl_destroy(self, group):
        self._call("POST", "/destroy_weights_update_group", {})
        group.comm = None

    # ---- audit -------------------------------------------------------------------------------------
    def info(self):
        return self._call("GET", "/v1/weights")

    def checksums(self, model="target", names="internal"):
        """{name: sha256}: names="internal" (runtime parameters, fused buffers whole, stored bytes) or
        "checkpoint" (checkpoint tensor names; see tensor_sha256 and checkpoint_checksums)."""
        return self._call("GET", "/v1/weights/checksums?model=%s&names=%s" % (model, names))["tensors"]

    def checkpoint_checksums(self, model="target"):
        """(dtype, {checkpoint name: sha256}) of the server's weights, hashed in dtype."""
        r = self._call("GET", "/v1/weights/checksums?model=%s&names=checkpoint" % model)
        return r["dtype"], r["tensors"]

    def verify_state_dict(self, named, model="target"):
        """Names of the trainer's tensors (a state_dict or (name, tensor) pairs, checkpoint names;
        for model="all" verify target and drafter separately) whose values differ from the server's,
        or that the server does not have; [] when every one matches."""
        dtype, theirs = self.checkpoint_checksums(model)
        mine = state_dict_checksums(named, dtype)
        return sorted(n for n in mine if theirs.get(n) != mine[n])

    def verify(self, other, model="target"):
        """Names whose stored bytes differ between this server and `other` (a GraphswapClient or a
        {name: sha256} dict); [] when identical."""
        mine = self.checksums(model)
        theirs = other.checksums(model) if isinstance(other, GraphswapClient) else other
        return sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))


def vllm_chunks(named, chunk_bytes):
    """vLLM's packed chunks (vllm/distributed/weight_transfer/packed_tensor.py pack_tensors): yields
    lists of (name, tensor), each taking tensors until its bytes exceed chunk_bytes."""
    part, total = [], 0
    for name, t in named:
        part.append((name, t))
        total += _nbytes(t)
        if total > chunk_bytes:
            yield part
            part, total = [], 0
    if part:
        yield part


def _chunk_need(part):
    """The server's staging need for one broadcast (weights_gpu.c frame_cost): its bytes rounded up
    to 256, plus room to realign each tensor that lands off its dtype's alignment."""
    at, move = 0, 0
    for _, t in part:
        nb, w = _nbytes(t), t.element_size()
        if at % w:
            move += (nb + ALIGN - 1) // ALIGN * ALIGN
        at += nb
    return (at + ALIGN - 1) // ALIGN * ALIGN + move


def vllm_chunk_bytes(named, want, staging_bytes):
    """The largest packed_buffer_size_bytes <= want whose every chunk fits the server's staging."""
    chunk = max(1, want)
    while True:
        need = max(_chunk_need(p) for p in vllm_chunks(named, chunk))
        if need <= staging_bytes:
            return chunk
        if chunk == 1:
            raise ValueError("a tensor needs %d bytes of NCCL staging, more than the server's %d: give nccl_init "
                             "a larger staging_bytes" % (need, staging_bytes))
        chunk //= 2


def pack_plan(named, bucket_bytes, align=ALIGN):
    """Splits [(name, tensor)] into buckets of at most bucket_bytes bytes laid out as the server
    expects: yields (entries, total) with entries = [(name, tensor, offset)], each offset the first
    multiple of `align` after the previous tensor, total = end of the last tensor."""
    entries, end = [], 0
    for name, t in named:
        nb = _nbytes(t)
        if nb > bucket_bytes:
            raise ValueError("tensor %s has %d bytes, more than a bucket (%d): raise bucket_bytes" % (name, nb, bucket_bytes))
        off = (end + align - 1) // align * align
        if entries and off + nb > bucket_bytes:
            yield entries, end
            entries, off = [], 0
        entries.append((name, t, off))
        end = off + nb
    if entries:
        yield entries, end


_TORCH_DT = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}


def _torch_meta(entries):
    names, dtypes, shapes, offsets = [], [], [], []
    for name, t, off in entries:
        dt = _TORCH_DT.get(str(t.dtype))
        if dt is None:
            raise TypeError("tensor %s: unsupported dtype %s (bfloat16, float16 or float32)" % (name, t.dtype))
        names.append(name)
        dtypes.append(dt)
        shapes.append(list(t.shape))
        offsets.append(off)
    return names, dtypes, shapes, offsets


def _pack_into(buf, entries):
    """Copies each tensor's bytes into the uint8 CUDA buffer at its offset (on the current stream)."""
    for _name, t, off in entries:
        src = t.detach().contiguous().reshape(-1)
        nb = src.numel() * src.element_size()
        if nb:
            buf[off:off + nb].copy_(src.view(buf.dtype) if src.device == buf.device else src.to(buf.device).view(buf.dtype),
                                    non_blocking=True)


class _Call:
    """An HTTP call on a thread (the server blocks in NCCL until this side takes part)."""

    def __init__(self, fn, *args):
        import threading

        self.result, self.error = None, None
        self._t = threading.Thread(target=self._run, args=(fn,) + args, daemon=True)
        self._t.start()

    def _run(self, fn, *args):
        try:
            self.result = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised by join()
            self.error = e

    def join(self):
        self._t.join()
        if self.error is not None:
            raise self.error
        return self.result


class NcclGroup:
    """The trainer's side of the weight-transfer communicator (rank 0 of world_size)."""

    def __init__(self, comm, device, world_size, staging_bytes):
        self.comm = comm
        self.device = device
        self.world_size = world_size
        self.staging_bytes = staging_bytes


def _ipc_handle(buf):
    """(base64 cudaIpcMemHandle of buf's allocation, byte offset of buf in it)."""
    import base64

    st = buf.untyped_storage()
    share = st._share_cuda_()  # (device, handle, size, offset_bytes, ref_counter..., event...)
    handle, offset = share[1], int(share[3])
    return base64.b64encode(bytes(handle)).decode(), offset + buf.storage_offset() * buf.element_size()


def _nbytes(t):
    if isinstance(t, Tensor) or hasattr(t, "nbytes"):
        return int(t.nbytes)
    return int(t.numel() * t.element_size())
