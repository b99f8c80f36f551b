"""graphswap fleet helper: one weight update pushed to many graphswap replicas, checked, and the
replicas that did not take it taken out of the router.

RL trainers roll out on many servers behind a router (sglang-router / sgl-model-gateway, or
vllm-router); graphswap is not a router. GraphswapFleet drives every replica in parallel (threads,
at most max_workers at once) with one version string, then checks every replica's version and its
checkpoint-name checksums (GraphswapClient.checkpoint_checksums): they must agree with each other
and, when the trainer pushed tensors, with the trainer's own (state_dict_checksums). A replica that
fails any step (an HTTP error, a timeout, a refused connection, a version or checksums unlike the
others' / the trainer's) is removed from the router and from `urls`, and reported: it is never left
serving other weights behind the router.

    from graphswap_fleet import GraphswapFleet
    fleet = GraphswapFleet(["http://10.0.0.1:8080", "http://10.0.0.2:8080"], admin_key=KEY,
                           router_url="http://10.0.0.9:30000", router_kind="sglang")
    fleet.pause("keep")                       # POST /pause?mode=keep on every replica
    r = fleet.update_weights(model.state_dict().items(), version="step-%d" % step, pause="keep")
    fleet.resume()                            # POST /resume
    r.ok, r.failed, r.removed                 # [url], {url: reason}, [url]

How an update runs: the tensors are cut into buckets of about bucket_bytes (as
GraphswapClient.update_weights cuts them) and each bucket is serialised once; every replica opens
its own session (begin), each bucket goes to every live replica at once (the next bucket is
serialised meanwhile, so at most two buckets are held), then every replica finishes. A replica whose
call fails is aborted (best effort) and dropped from the later buckets; the others go on. Afterwards
GET /v1/weights (state "ready", the version) and the checkpoint checksums of every replica are read
and compared. With the trainer's tensors the reference is their checksums (for the names pushed; a
partial update checks only those, a model="all" update checks "draft."-prefixed names against the
drafter); without them (load_from_disk, verify() without named) it is what the largest group of
replicas shares (version and every checksum), when that group is larger than every other: with a tie
for the largest (two replicas that disagree, say) every replica fails, as nothing says which one
holds the intended weights.

Router removal (router_url given; the router must know each replica by the URL given in `urls`):
  sglang: DELETE /workers/{url, percent-encoded}: sgl-model-gateway, sgl-project/sglang 6e97cb58
          sgl-model-gateway/src/server.rs (delete_worker: 202 "accepted", removal queued). Its
          successor (lightseekorg/smg 73da68ca model_gateway/src/server.rs, worker/service.rs
          parse_worker_id) keys workers by a UUID and answers 400 to a URL: then GET /workers gives
          the worker's "id" for its "url" and DELETE /workers/{id} removes it. A 404 / 405 to the
          DELETE means an older router: POST /remove_worker?url={url}: sgl-router, sgl-project/sglang
          8dac1b72 sgl-router/src/server.rs (remove_worker: 200 "Successfully removed worker: ...").
  vllm:   DELETE /workers/{url}, and POST /remove_worker?url={url} when that answers 404 / 405 / 400:
          vllm-project/router e17f94e3 src/server.rs (delete_worker and remove_worker; both 200).
NCCL (GPU replicas; torch on the trainer): group = fleet.nccl_init() makes one communicator of the
trainer (rank 0) and every replica (rank 1 + i, world 1 + N); fleet.update_weights_nccl(group,
named, version) broadcasts each of vLLM's packed chunks once to all replicas, then checks as above.
A replica that fails mid-broadcast breaks the group for all: every session is aborted, the failed
replica removed, and the group must be made again.

router_key is sent as "Authorization: Bearer ..." (both routers' admin auth). A failed removal is
added to the replica's reason in `failed` (the replica is still dropped from `urls`); it never raises.

When every replica fails, update_weights / load_from_disk raise FleetError (a GraphswapError) after
reporting; its .result holds the FleetResult. pause() and resume() remove a replica that fails them
and raise FleetError only when all fail. versions() and verify() only read: they remove nothing.

CLI: python -m graphswap_fleet --urls U1,U2 [--admin-key K] [--router-url R --router-kind sglang|vllm]
     {versions, verify [--model M], pause [--mode M], resume, load-from-disk PATH --version V [...]}
prints JSON; exit status 0 when every replica is fine, 1 when some failed, 2 when all did.
Standard library only (plus graphswap_client; numpy / torch only when such tensors are given).
"""
import argparse
import concurrent.futures
import hashlib
import http.client
import json
import os
import socket
import sys
import threading
import urllib.parse

from graphswap_client import (GraphswapClient, GraphswapError, _Call, _nbytes, _torch_meta, state_dict_checksums,
                              to_safetensors, vllm_chunk_bytes, vllm_chunks)

__all__ = ["GraphswapFleet", "FleetResult", "FleetError", "FleetNcclGroup"]

ROUTER_TIMEOUT = 30.0  # seconds for one router call
ABORT_TIMEOUT = 30.0   # seconds for the best-effort abort of a failed replica's session


class FleetResult:
    """What one fan-out did: version stamped, replicas that took it, those that did not (and why),
    those taken out of the router (with no router_url: out of the fleet), a subset of failed."""

    def __init__(self, version, ok=None, failed=None, removed=None):
        self.version = version
        self.ok = list(ok or [])
        self.failed = dict(failed or {})
        self.removed = list(removed or [])

    def to_dict(self):
        return {"version": self.version, "ok": list(self.ok), "failed": dict(self.failed),
                "removed": list(self.removed)}

    def __repr__(self):
        return "FleetResult(version=%r, ok=%r, failed=%r, removed=%r)" % (self.version, self.ok, self.failed,
                                                                          self.removed)


class FleetError(GraphswapError):
    """Every replica failed; .result is the FleetResult (already reported and removed)."""

    def __init__(self, message, result):
        RuntimeError.__init__(self, message)  # not GraphswapError's "HTTP %d: ..." formatting
        self.status = None
        self.body = message
        self.result = result


class FleetNcclGroup:
    """The trainer's side of one fleet NCCL group: rank 0 of world 1 + N; ranks {url: rank};
    staging_bytes the smallest of the replicas' (every chunk must fit each); broken after a failed update."""

    def __init__(self, comm, device, world_size, staging_bytes, ranks):
        self.comm = comm
        self.device = device
        self.world_size = world_size
        self.staging_bytes = staging_bytes
        self.ranks = dict(ranks)
        self.broken = False


def _init_on(nccl, dev, world, uid):
    import torch

    with torch.cuda.device(dev):
        return nccl.init_rank(world, uid, 0)


def _norm(url):
    u = str(url).strip()
    while u.endswith("/"):
        u = u[:-1]
    return u


def _why(e):
    """One line saying why a replica call failed."""
    if isinstance(e, GraphswapError):
        return str(e)
    if isinstance(e, socket.timeout) or type(e).__name__ == "TimeoutError":
        return "timeout (%s)" % (e or "no answer in time")
    if isinstance(e, ConnectionRefusedError):
        return "unreachable: connection refused"
    if isinstance(e, (OSError, http.client.HTTPException)):
        return "unreachable: %s: %s" % (type(e).__name__, e)
    return "%s: %s" % (type(e).__name__, e)


def _fingerprint(d):
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


class GraphswapFleet:
    def __init__(self, urls, admin_key=None, timeout=600.0, router_url=None, router_kind="sglang",
                 router_key=None, max_workers=None):
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        seen, self.urls = set(), []
        for u in urls:
            u = _norm(u)
            if u and u not in seen:
                seen.add(u)
                self.urls.append(u)
        if not self.urls:
            raise ValueError("no replica URLs")
        if router_kind not in ("sglang", "vllm"):
            raise ValueError('router_kind must be "sglang" or "vllm"')
        if router_url is not None:
            ru = urllib.parse.urlparse(router_url)
            if ru.scheme != "http" or not ru.hostname:
                raise ValueError("router_url must be an http:// URL")
        self.admin_key = admin_key
        self.timeout = timeout
        self.router_url = _norm(router_url) if router_url else None
        self.router_kind = router_kind
        self.router_key = router_key
        self.max_workers = max_workers
        self._clients = {u: GraphswapClient(u, admin_key=admin_key, timeout=timeout) for u in self.urls}
        self._lock = threading.Lock()
        self.removals = []       # (url, reason, router outcome) of every removal, oldest first
        self.last_result = None  # the FleetResult of the last fan-out (pause and resume included)

    # ---- plumbing -------------------------------------------------------------------------------
    def client(self, url):
        """The GraphswapClient of one replica (also after it was removed)."""
        url = _norm(url)
        c = self._clients.get(url)
        if c is None:
            c = self._clients[url] = GraphswapClient(url, admin_key=self.admin_key, timeout=self.timeout)
        return c

    def _pool(self, n):
        return concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(n, self.max_workers or n)))

    def _each(self, fn, urls):
        """{url: (value, None) | (None, reason)}: fn(url) on every url in parallel."""
        out = {}
        if not urls:
            return out
        with self._pool(len(urls)) as pool:
            futs = {pool.submit(fn, u): u for u in urls}
            for f in concurrent.futures.as_completed(futs):
                u = futs[f]
                try:
                    out[u] = (f.result(), None)
                except Exception as e:  # noqa: BLE001 - any failure of one replica is reported
                    out[u] = (None, _why(e))
        return out

    def _finish(self, version, targets, failed, what):
        """Removes the failed replicas (in parallel), builds the FleetResult, raises if all failed."""
        removed = []
        if failed:
            got = self._each(lambda u: self._remove(u, failed[u]), sorted(failed))
            for u in sorted(failed):
                ok_removed, note = got[u][0] if got[u][1] is None else (False, got[u][1])
                if ok_removed:
                    removed.append(u)
                else:
                    failed[u] = "%s; not removed from the router: %s" % (failed[u], note)
        ok = [u for u in targets if u not in failed]
        res = FleetResult(version, ok, failed, removed)
        self.last_result = res
        if targets and not ok:
            raise FleetError("%s failed on every replica: %s" % (what, "; ".join(
                "%s: %s" % (u, failed[u]) for u in sorted(failed))), res)
        return res

    # ---- the router ------------------------------------------------------------------------------
    def _router_call(self, method, path):
        u = urllib.parse.urlparse(self.router_url)
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=min(self.timeout, ROUTER_TIMEOUT))
        try:
            h = {"Content-Length": "0"} if method in ("POST", "PUT") else {}
            if self.router_key:
                h["Authorization"] = "Bearer " + self.router_key
            c.request(method, (u.path or "") + path, headers=h)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def _router_remove(self, url):
        """(True, what was done) when the router no longer routes to url, else (False, why). Routes:
        see the module docstring (sglang 6e97cb58 / 8dac1b72, smg 73da68ca, vllm-project/router e17f94e3)."""
        q = urllib.parse.quote(url, safe="")
        tried = []

        def call(method, path):
            st, body = self._router_call(method, path)
            tried.append("%s %s: %d" % (method, path, st))
            return st, body

        try:
            st, body = call("DELETE", "/workers/" + q)
            if 200 <= st < 300:
                return True, tried[-1]
            if st == 400 and self.router_kind == "sglang":
                # smg (sgl-model-gateway's successor) keys workers by UUID: look the id up by URL
                st2, body2 = call("GET", "/workers")
                if st2 == 200:
                    try:
                        ws = json.loads(body2).get("workers")
                    except (ValueError, AttributeError):
                        ws = None
                    if isinstance(ws, list):
                        ids = [w["id"] for w in ws if isinstance(w, dict) and w.get("id") and
                               _norm(w.get("url") or "") == url]
                        if not ids:
                            return True, "; ".join(tried) + " (not registered in the router)"
                        for wid in ids:
                            st3, body = call("DELETE", "/workers/" + urllib.parse.quote(str(wid), safe=""))
                            if not 200 <= st3 < 300:
                                return False, "; ".join(tried) + " " + body[:200].decode("utf-8", "replace")
                        return True, "; ".join(tried)
            if st in (400, 404, 405):
                # an older router: the legacy route
                st, body = call("POST", "/remove_worker?url=" + q)
                if 200 <= st < 300:
                    return True, "; ".join(tried)
            return False, "; ".join(tried) + " " + body[:200].decode("utf-8", "replace")
        except Exception as e:  # noqa: BLE001 - a removal failure is reported, never raised
            return False, "; ".join(tried + ["router %s: %s" % (self.router_url, _why(e))])

    def _remove(self, url, reason):
        """(removed, note): drops url from urls; with a router, takes it out of the router."""
        url = _norm(url)
        with self._lock:
            if url in self.urls:
                self.urls.remove(url)
        if self.router_url is None:
            ok, note = True, "no router"
        else:
            ok, note = self._router_remove(url)
        with self._lock:
            self.removals.append((url, reason, note))
        return ok, note

    def remove(self, url, reason):
        """Drops url from urls and from the router; True when the router no longer routes to it (or
        no router_url was given). Never raises: a router failure is recorded in .removals."""
        return self._remove(url, reason)[0]

    # ---- pause / resume ----------------------------------------------------------------------------
    def _fanout_simple(self, what, fn):
        targets = list(self.urls)
        got = self._each(fn, targets)
        failed = {u: "%s: %s" % (what, got[u][1]) for u in targets if got[u][1] is not None}
        return self._finish(None, targets, failed, what)

    def pause(self, mode="keep"):
        """POST /pause?mode=MODE on every replica (vLLM's modes: keep, wait, abort)."""
        q = urllib.parse.quote(str(mode), safe="")
        self._fanout_simple("pause", lambda u: self.client(u)._call("POST", "/pause?mode=" + q))

    def resume(self):
        """POST /resume on every replica."""
        self._fanout_simple("resume", lambda u: self.client(u)._call("POST", "/resume"))

    # ---- updates -------------------------------------------------------------------------------------
    def update_weights(self, named, version, bucket_bytes=512 << 20, mode="full", model="target",
                       pause="wait"):
        """Pushes every (name, tensor) to every replica (one session each, buckets in parallel),
        stamps `version` on all, checks versions and checksums; returns a FleetResult."""
        if version is None or str(version) == "":
            raise ValueError("a fleet update needs a version (one string stamped on every replica)")
        version = str(version)
        named = list(named.items() if hasattr(named, "items") else named)
        targets = list(self.urls)
        failed = {}
        live = list(targets)

        def abort_all(urls):
            # best effort and short: the session may be closed already (a 422 closes it), or the replica dead
            def one(u):
                GraphswapClient(u, admin_key=self.admin_key, timeout=min(self.timeout, ABORT_TIMEOUT)).abort()
            self._each(one, urls)

        def step(what, got, opened=True):
            """Drops the replicas whose call failed from live (aborting their sessions when opened)."""
            bad = [u for u in live if got.get(u, (None, None))[1] is not None]
            for u in bad:
                failed[u] = "%s: %s" % (what, got[u][1])
                live.remove(u)
            if opened and bad:
                abort_all(bad)

        buckets, cur, size = [], [], 0
        for name, t in named:
            nb = _nbytes(t)
            if cur and size + nb > bucket_bytes:
                buckets.append(cur)
                cur, size = [], 0
            cur.append((name, t))
            size += nb
        if cur:
            buckets.append(cur)
        step("begin", self._each(lambda u: self.client(u).begin(mode=mode, model=model, pause=pause, version=version),
                                 list(live)), opened=False)
        try:
            if live and buckets:
                # one serialisation per bucket; bucket k+1 is serialised while bucket k is being sent
                with self._pool(len(live)) as pool:
                    body = to_safetensors(buckets[0])
                    for k in range(len(buckets)):
                        if not live:
                            break
                        futs = {u: pool.submit(self.client(u)._call, "POST", "/v1/weights/bucket", body,
                                               "application/octet-stream") for u in live}
                        nxt = to_safetensors(buckets[k + 1]) if k + 1 < len(buckets) else None
                        got = {}
                        for u, f in futs.items():
                            try:
                                got[u] = (f.result(), None)
                            except Exception as e:  # noqa: BLE001 - one replica's failure
                                got[u] = (None, _why(e))
                        step("bucket %d of %d" % (k + 1, len(buckets)), got)
                        body = nxt
            step("finish", self._each(lambda u: self.client(u).finish(version), list(live)))
        except BaseException:
            abort_all(list(live))  # e.g. a tensor that cannot be serialised, or KeyboardInterrupt
            raise
        self._check(live, version, model, named, failed)
        return self._finish(version, targets, failed, "update_weights %s" % version)

    def load_from_disk(self, path, version, draft_path=None, mode="full", model="target", pause="wait"):
        """Every replica loads the checkpoint folder `path` (under its --weights-root) with `version`;
        then versions and checksums are checked (the largest agreeing group is the reference)."""
        if version is None or str(version) == "":
            raise ValueError("a fleet update needs a version (one string stamped on every replica)")
        version = str(version)
        targets = list(self.urls)
        got = self._each(lambda u: self.client(u).load_from_disk(path, draft_path=draft_path, mode=mode, model=model,
                                                                 pause=pause, version=version), targets)
        failed = {u: "load: %s" % got[u][1] for u in targets if got[u][1] is not None}
        live = [u for u in targets if u not in failed]
        self._check(live, version, model, None, failed)
        return self._finish(version, targets, failed, "load_from_disk %s" % version)

    # ---- NCCL: one group of the trainer and every replica (GPU) ----------------------------------------
    def nccl_init(self, staging_bytes=None, device=None, timeout_s=None, grace_s=2.0, nccl=None):
        """One NCCL communicator of world 1 + N: this process rank 0, replica i (in urls order) rank
        1 + i, one ncclUniqueId for all (vLLM's /init_weight_transfer_engine with
        nccl_unique_id_b64, each replica's call on a thread: it blocks until every rank joined).
        Every replica must take part, or NCCL would wait for the missing rank for ever: the calls
        start first, and a replica that refuses within grace_s (a CPU build: 501; unreachable; a bad
        body) makes this raise FleetError before this side joins (the others' calls end at their
        timeout_s). Nothing is removed: no weights changed. Returns a FleetNcclGroup.
        nccl: torch.cuda.nccl's unique_id / init_rank (the default; a test gives its own)."""
        import base64
        import time

        dev = device
        if nccl is None:  # lazily: only NCCL fleets need torch
            import torch
            import torch.cuda.nccl as nccl  # noqa: PLW0621
            if dev is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        targets = list(self.urls)
        world = 1 + len(targets)
        uid = nccl.unique_id()
        calls = {}
        for i, u in enumerate(targets):
            info = {"master_address": "", "master_port": 0, "rank_offset": 1 + i, "world_size": world,
                    "nccl_unique_id_b64": base64.b64encode(bytes(uid)).decode()}
            if staging_bytes:
                info["staging_bytes"] = int(staging_bytes)
            if timeout_s:
                info["timeout_s"] = int(timeout_s)
            calls[u] = _Call(self.client(u)._call, "POST", "/init_weight_transfer_engine", {"init_info": info})
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not any(c.error is not None for c in calls.values()):
            time.sleep(0.02)
        early = {u: "nccl init: %s" % _why(c.error) for u, c in calls.items() if c.error is not None}
        if early:
            res = FleetResult(None, [], early, [])
            self.last_result = res
            raise FleetError("nccl_init: %d of %d replicas refused, the group was not made: %s" % (
                len(early), len(targets), "; ".join("%s: %s" % kv for kv in sorted(early.items()))), res)
        comm = nccl.init_rank(world, uid, 0) if dev is None else _init_on(nccl, dev, world, uid)
        failed, staging = {}, {}
        for u, c in calls.items():
            try:
                staging[u] = int(c.join()["staging_bytes"])
            except Exception as e:  # noqa: BLE001 - after the join a failure breaks the group
                failed[u] = "nccl init: %s" % _why(e)
        if failed:
            res = FleetResult(None, [u for u in targets if u not in failed], failed, [])
            self.last_result = res
            raise FleetError("nccl_init: the group was made but %d replicas failed: make it again" % len(failed), res)
        self.last_result = FleetResult(None, targets, {}, [])
        return FleetNcclGroup(comm, dev, world, min(staging.values()), {u: 1 + i for i, u in enumerate(targets)})

    def update_weights_nccl(self, group, named, version, bucket_bytes=None, mode="full", model="target",
                            pause="wait", nccl=None):
        """One broadcast of every tensor to every replica of group: /start_weight_update on each, one
        /update_weights (vLLM's packed chunks) on each while this side broadcasts each chunk once as
        rank 0, /finish_weight_update on each; then the versions and checksums are checked as in
        update_weights. A replica that fails before the broadcast leaves the others waiting in NCCL:
        every session is then aborted, the group marked broken (make it again, without the failed
        replicas) and the failed ones removed."""
        import torch

        if nccl is None:
            import torch.cuda.nccl as nccl  # noqa: PLW0621
        if group.broken:
            raise ValueError("this NCCL group is broken (a replica failed during an update): make a new one")
        if version is None or str(version) == "":
            raise ValueError("a fleet update needs a version (one string stamped on every replica)")
        version = str(version)
        named = [(n, t) for n, t in (named.items() if hasattr(named, "items") else named)]
        targets = [u for u in group.ranks if u in self.urls]
        if len(targets) != len(group.ranks):
            raise ValueError("a replica of this NCCL group left the fleet: make a new group")
        chunk = vllm_chunk_bytes(named, min(bucket_bytes or group.staging_bytes, group.staging_bytes),
                                 group.staging_bytes)
        names, dtypes, shapes, _ = _torch_meta([(n, t, 0) for n, t in named])
        failed = {}

        def broken(what, got):
            for u in targets:
                if got[u][1] is not None:
                    failed[u] = "%s: %s" % (what, got[u][1])
            group.broken = True
            self._each(lambda u: GraphswapClient(u, admin_key=self.admin_key,
                                                 timeout=min(self.timeout, ABORT_TIMEOUT)).abort(), targets)
            return self._finish(version, targets, failed, "update_weights_nccl %s" % version)

        body = {"mode": mode, "model": model, "pause": pause, "version": version}
        got = self._each(lambda u: self.client(u)._call("POST", "/start_weight_update", body), targets)
        if any(e is not None for _v, e in got.values()):
            return broken("start_weight_update", got)
        info = {"names": names, "dtype_names": dtypes, "shapes": shapes, "packed": True,
                "packed_buffer_size_bytes": chunk}
        calls = {u: _Call(self.client(u)._call, "POST", "/update_weights", {"update_info": info}) for u in targets}
        with torch.cuda.device(group.device):
            stream = torch.cuda.current_stream(group.device)
            for part in vllm_chunks(named, chunk):
                flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in part])
                nccl.broadcast([flat], root=0, streams=[stream], comms=[group.comm])
        got = {}
        for u, c in calls.items():
            try:
                got[u] = (c.join(), None)
            except Exception as e:  # noqa: BLE001
                got[u] = (None, _why(e))
        if any(e is not None for _v, e in got.values()):
            return broken("update_weights", got)
        got = self._each(lambda u: self.client(u)._call("POST", "/finish_weight_update", {"weight_version": version}),
                         targets)
        for u in targets:
            if got[u][1] is not None:
                failed[u] = "finish: %s" % got[u][1]
        live = [u for u in targets if u not in failed]
        self._check(live, version, model, named, failed)
        return self._finish(version, targets, failed, "update_weights_nccl %s" % version)

    # ---- checks ----------------------------------------------------------------------------------------
    def _snapshot(self, urls, model):
        """{url: ((info, {model: (dtype, tensors)}), None) | (None, reason)}."""
        models = ("target", "draft") if model == "all" else (model,)

        def one(u):
            c = self.client(u)
            return c.info(), {m: c.checkpoint_checksums(m) for m in models}

        return self._each(one, urls)

    def _compare(self, snap, version, model, named):
        """{url: reason} of the replicas whose version / state / checksums are off ("" when fine)."""
        out, good = {}, {}
        for u, (val, err) in snap.items():
            if err is not None:
                out[u] = "check: %s" % err
                continue
            info, sums = val
            if info.get("state") != "ready":
                out[u] = "state %r (%s)" % (info.get("state"), info.get("reason"))
            elif version is not None and str(info.get("version")) != version:
                out[u] = "version %r, expected %r" % (info.get("version"), version)
            else:
                good[u] = (str(info.get("version")), sums)
        # the trainer's tensors, when given, are the reference
        if named is not None:
            if model == "all":  # drafter tensors are named "draft.<name>"
                parts = {"target": [(n, t) for n, t in named if not n.startswith("draft.")],
                         "draft": [(n[len("draft."):], t) for n, t in named if n.startswith("draft.")]}
            else:
                parts = {model: named}
            mine = {}
            for u, (_v, sums) in sorted(good.items()):
                bad = []
                for m, (dtype, theirs) in sums.items():
                    if (m, dtype) not in mine:
                        mine[(m, dtype)] = state_dict_checksums(parts.get(m, []), dtype)
                    for n, h in mine[(m, dtype)].items():
                        got = theirs.get(n)
                        if got is None and n == "lm_head.weight":  # tied: one matrix, named by the embedding
                            got = theirs.get("model.embed_tokens.weight")
                        if got != h:
                            bad.append("draft." + n if model == "all" and m == "draft" else n)
                if bad:
                    out[u] = "checksums: %d tensors differ from the trainer's, e.g. %s" % (len(bad), sorted(bad)[:3])
            good = {u: v for u, v in good.items() if u not in out}
        # and every replica must agree with the others (version and every checksum)
        groups = {}
        for u, (v, sums) in good.items():
            groups.setdefault(_fingerprint({"version": v, "sums": {m: t for m, (_d, t) in sums.items()}}), []).append(u)
        if len(groups) > 1:
            sizes = sorted((len(g) for g in groups.values()), reverse=True)
            ref = None
            if sizes[0] > sizes[1]:
                ref = max(groups.values(), key=len)
            refu = ref[0] if ref else None
            for g in groups.values():
                if g is ref:
                    continue
                for u in g:
                    if refu is None:
                        out[u] = "checksums: no majority among the replicas (%d groups of %s)" % (len(groups), sizes)
                        continue
                    v, sums = good[u]
                    rv, rsums = good[refu]
                    diff = sorted(n for m in set(sums) | set(rsums)
                                  for n in set(sums.get(m, ("", {}))[1]) | set(rsums.get(m, ("", {}))[1])
                                  if sums.get(m, ("", {}))[1].get(n) != rsums.get(m, ("", {}))[1].get(n))
                    if v != rv:
                        out[u] = "version %r, the majority %r" % (v, rv)
                    else:
                        out[u] = "checksums: %d tensors differ from the majority (%d of %d replicas), e.g. %s" % (
                            len(diff), len(ref), len(snap), diff[:3])
        for u in snap:
            out.setdefault(u, "")
        return out

    def _check(self, live, version, model, named, failed):
        if not live:
            return
        cmp = self._compare(self._snapshot(live, model), version, model, named)
        for u, why in cmp.items():
            if why:
                failed[u] = why

    # ---- audit (read only: nothing is removed) ---------------------------------------------------------
    def versions(self):
        """{url: weight version} of every replica in urls (None where it does not answer)."""
        got = self._each(lambda u: self.client(u).info().get("version"), list(self.urls))
        return {u: (None if err else (None if v is None else str(v))) for u, (v, err) in got.items()}

    def verify(self, model="target", named=None):
        """{url: "" when equal, else why}: every replica's state, version and checkpoint checksums
        against the others' (the largest agreeing group) and, with named (the trainer's tensors: a state_dict
        or (name, tensor) pairs), against those. Removes nothing: see remove()."""
        if named is not None:
            named = list(named.items() if hasattr(named, "items") else named)
        urls = list(self.urls)
        return self._compare(self._snapshot(urls, model), None, model, named)


# ---- CLI -------------------------------------------------------------------------------------------------
def _parser():
    p = argparse.ArgumentParser(prog="python -m graphswap_fleet",
                                description="Drive a fleet of graphswap replicas: versions, verify, pause, resume, "
                                            "load-from-disk (one version on every replica; a failing replica is "
                                            "removed from the router). Prints JSON.")
    p.add_argument("--urls", required=True, help="comma-separated replica URLs (http://host:port)")
    p.add_argument("--admin-key", default=os.environ.get("GRAPHSWAP_ADMIN_KEY"),
                   help="the replicas' --admin-key (default: $GRAPHSWAP_ADMIN_KEY)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP call (default 600)")
    p.add_argument("--router-url", help="sglang-router / vllm-router to remove failed replicas from")
    p.add_argument("--router-kind", choices=("sglang", "vllm"), default="sglang")
    p.add_argument("--router-key", default=os.environ.get("GRAPHSWAP_ROUTER_KEY"),
                   help="the router's admin / API key (default: $GRAPHSWAP_ROUTER_KEY)")
    p.add_argument("--max-workers", type=int, help="at most this many replicas at once")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("versions", help="print {url: weight version}")
    v = sub.add_parser("verify", help='print {url: "" | why}: checksums and versions against the majority')
    v.add_argument("--model", choices=("target", "draft", "all"), default="target")
    pa = sub.add_parser("pause", help="POST /pause?mode= on every replica")
    pa.add_argument("--mode", default="keep", choices=("keep", "wait", "abort"))
    sub.add_parser("resume", help="POST /resume on every replica")
    ld = sub.add_parser("load-from-disk", help="every replica loads PATH (under its --weights-root) as VERSION")
    ld.add_argument("path")
    ld.add_argument("--version", required=True)
    ld.add_argument("--draft-path")
    ld.add_argument("--mode", choices=("full", "partial"), default="full")
    ld.add_argument("--model", choices=("target", "draft", "all"), default="target")
    ld.add_argument("--pause", choices=("wait", "abort", "keep", "recompute"), default="wait")
    return p


def main(argv=None):
    a = _parser().parse_args(argv)
    fleet = GraphswapFleet(a.urls, admin_key=a.admin_key, timeout=a.timeout, router_url=a.router_url,
                           router_kind=a.router_kind, router_key=a.router_key, max_workers=a.max_workers)
    n = len(fleet.urls)
    try:
        if a.cmd == "versions":
            out = fleet.versions()
            bad = sum(1 for v in out.values() if v is None)
        elif a.cmd == "verify":
            out = fleet.verify(model=a.model)
            bad = sum(1 for v in out.values() if v)
        else:
            if a.cmd == "pause":
                fleet.pause(a.mode)
            elif a.cmd == "resume":
                fleet.resume()
            else:
                fleet.load_from_disk(a.path, a.version, draft_path=a.draft_path, mode=a.mode, model=a.model,
                                     pause=a.pause)
            out = fleet.last_result.to_dict()
            bad = len(out["failed"])
    except FleetError as e:
        out = e.result.to_dict()
        bad = n
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0 if bad == 0 else (2 if bad >= n else 1)


if __name__ == "__main__":
    sys.exit(main())
