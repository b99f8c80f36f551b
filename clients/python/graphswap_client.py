"""graphswap trainer-side client: push new weights into a running graphswap server.

Standard library only; tensors may be numpy arrays (float32 / float16) or PyTorch tensors (bfloat16,
float16, float32; moved to the CPU). An RL loop calls, after each optimizer step:

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
checkpoint).

Not here yet: the CUDA-IPC and NCCL transports (they need the server's CUDA backend).
"""
import http.client
import json
import struct
import urllib.parse

__all__ = ["GraphswapClient", "GraphswapError", "to_safetensors"]


class GraphswapError(RuntimeError):
    def __init__(self, status, body):
        self.status = status
        self.body = body
        try:
            msg = json.loads(body)["error"]["message"]
        except Exception:  # noqa: BLE001 - any non-JSON body
            msg = body[:500].decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        super().__init__("HTTP %d: %s" % (status, msg))


def _tensor_bytes(t):
    """(dtype name, shape, raw little-endian bytes) of a numpy array or a torch tensor."""
    mod = type(t).__module__
    if mod.startswith("torch"):
        import torch  # only when torch tensors are given

        t = t.detach().to("cpu").contiguous()
        names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
        if t.dtype not in names:
            raise TypeError("unsupported torch dtype %s" % t.dtype)
        raw = t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()
        return names[t.dtype], list(t.shape), raw
    import numpy as np

    a = np.ascontiguousarray(t)
    names = {np.dtype("float32"): "F32", np.dtype("float16"): "F16"}
    if a.dtype not in names:
        raise TypeError("unsupported numpy dtype %s (use float32 or float16)" % a.dtype)
    return names[a.dtype], list(a.shape), a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


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

    # ---- audit -------------------------------------------------------------------------------------
    def info(self):
        return self._call("GET", "/v1/weights")

    def checksums(self, model="target"):
        return self._call("GET", "/v1/weights/checksums?model=" + model)["tensors"]

    def verify(self, other, model="target"):
        """Names whose stored bytes differ between this server and `other` (a GraphswapClient or a
        {name: sha256} dict); [] when identical."""
        mine = self.checksums(model)
        theirs = other.checksums(model) if isinstance(other, GraphswapClient) else other
        return sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))


def _nbytes(t):
    if hasattr(t, "nbytes"):
        return int(t.nbytes)
    return int(t.numel() * t.element_size())
