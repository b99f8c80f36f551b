#!/usr/bin/env python3
"""The fleet helper (clients/python/graphswap_fleet.py) against three live replicas and fake routers.

Three `graphswap serve` replicas of one small model (A, B, C; each with its own --weights-root), and
fake routers in this process (http.server threads) that record every call and answer as the real
ones do: sgl-model-gateway (DELETE /workers/{url}: 202), the older sgl-router (only POST
/remove_worker?url=), smg (workers keyed by UUID: 400 to a URL, GET /workers gives the id) and
vllm-router (both routes, 200).
- pause("keep") / resume() reach every replica (GET /is_paused);
- (a) a fan-out update of numpy float32 and Python-float tensors, while paused: every replica at the
  one version, its checkpoint checksums equal to state_dict_checksums of the pushed tensors, verify()
  all "", greedy tokens equal across replicas;
- (b) load_from_disk of a second checkpoint on every replica (checksums = the checkpoint's);
- (d) load_from_disk of a path that is another checkpoint under C's --weights-root: C's checksums
  disagree with the majority, C is reported, removed from the router (the exact route recorded) and
  dropped from urls; A and B took it;
- a replica stopped mid-update (killed while a later bucket is serialised) is reported at a bucket,
  removed; the others took the update;
- (c) a replica killed before an update: "begin: unreachable", removed; the other updated;
- every replica failing: FleetError (a GraphswapError) after reporting; an older router answers 404
  to DELETE /workers/... and POST /remove_worker?url= is used; a dead router: reported, not raised;
  pause() of a dead replica removes it;
- remove() through smg (UUID lookup) and vllm-router; the router key is sent as a Bearer token;
- nccl_init: ranks, world, one id, the trainer joining only when every replica can (fake GPU replicas,
  a fake torch.cuda.nccl); a CPU replica's 501 refused before the trainer joins;
- the CLI: --help, versions, verify, load-from-disk.
"""
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
import uuid

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
CLIENT_DIR = os.path.abspath(os.path.join(HERE, "..", "..", "clients", "python"))
sys.path.insert(0, CLIENT_DIR)
import numpy as np  # noqa: E402

import graphswap_client as gc  # noqa: E402
import graphswap_fleet as gf  # noqa: E402
import ref_model  # noqa: E402
import test_http_basic as H  # noqa: E402

SERVE_ARGS = ["--threads", "1", "--http-threads", "16", "--kv-cache-mb", "16", "--max-seqs", "4"]


class FakeRouter:
    """An http.server thread answering as one router kind; .calls records (method, path, auth)."""

    def __init__(self, style, workers=()):
        self.style = style
        self.calls = []
        self.ids = {str(uuid.uuid4()): w for w in workers}  # smg: worker id -> url
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, status, body, ctype="application/json"):
                raw = body if isinstance(body, bytes) else (json.dumps(body).encode() if ctype == "application/json"
                                                             else body.encode())
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def handle_any(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                me.calls.append((method, self.path, self.headers.get("Authorization")))
                u = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(u.query)
                seg = urllib.parse.unquote(u.path[len("/workers/"):]) if u.path.startswith("/workers/") else None
                st = me.style
                if method == "DELETE" and seg is not None and st == "gateway":
                    # sgl-project/sglang 6e97cb58 sgl-model-gateway/src/server.rs delete_worker
                    return self.answer(202, {"status": "accepted", "worker_id": seg,
                                             "message": "Worker removal queued for background processing"})
                if method == "DELETE" and seg is not None and st == "vllm":
                    # vllm-project/router e17f94e3 src/server.rs delete_worker (single router mode)
                    return self.answer(200, {"success": True, "message": "Worker %s removed successfully" % seg,
                                             "worker": None})
                if method == "DELETE" and seg is not None and st == "smg":
                    # lightseekorg/smg 73da68ca worker/service.rs: parse_worker_id (UUID), else 400
                    try:
                        uuid.UUID(seg)
                    except ValueError:
                        return self.answer(400, {"error": "Invalid worker ID '%s'" % seg, "code": "BAD_REQUEST"})
                    if seg not in me.ids:
                        return self.answer(404, {"error": "Worker %s not found" % seg, "code": "WORKER_NOT_FOUND"})
                    url = me.ids.pop(seg)
                    return self.answer(202, {"worker_id": seg, "url": url, "status": "accepted"})
                if method == "GET" and u.path == "/workers" and st == "smg":
                    ws = [{"id": i, "url": w, "model_id": "m", "is_healthy": True} for i, w in me.ids.items()]
                    return self.answer(200, {"workers": ws, "total": len(ws)})
                if method == "POST" and u.path == "/remove_worker" and st in ("legacy", "vllm"):
                    # sgl-project/sglang 8dac1b72 sgl-router/src/server.rs remove_worker
                    if "url" not in q:
                        return self.answer(400, b"", "text/plain")
                    return self.answer(200, "Successfully removed worker: %s" % q["url"][0], "text/plain")
                return self.answer(404, b"", "text/plain")  # both routers' sink_handler

            def do_GET(self):
                self.handle_any("GET")

            def do_POST(self):
                self.handle_any("POST")

            def do_DELETE(self):
                self.handle_any("DELETE")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeNccl:
    """torch.cuda.nccl's unique_id / init_rank, recorded (the CPU has no NCCL)."""

    __name__ = "fake_nccl"

    def __init__(self):
        self.inits = []

    def unique_id(self):
        return bytes(range(128))

    def init_rank(self, world, uid, rank):
        self.inits.append((world, bytes(uid), rank))
        return "comm"


class FakeGpuReplica:
    """A replica's /init_weight_transfer_engine as the CUDA build answers it once every rank joined
    (server/weights/weights_gpu.c: {"status", "staging_bytes", "world_size", ...}); .bodies records
    each init_info. Answers only after the trainer's init_rank (nccl.inits) has happened."""

    def __init__(self, nccl, staging):
        self.bodies = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                me.bodies.append((self.path, body))
                for _ in range(500):  # the server's ncclCommInitRank returns once rank 0 joined
                    if nccl.inits:
                        break
                    threading.Event().wait(0.01)
                raw = json.dumps({"status": "ok", "staging_bytes": staging,
                                  "world_size": body["init_info"]["world_size"]}).encode()
                self.send_response(200 if nccl.inits else 504)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_nccl_group(C, cpu_url):
    """nccl_init: ranks 1..N in urls order, world 1 + N, one id for all, the trainer joins as rank 0
    only when no replica refused; a CPU replica's 501 raises FleetError before the trainer joins."""
    import base64
    nc = FakeNccl()
    reps = [FakeGpuReplica(nc, st) for st in (64 << 20, 16 << 20, 32 << 20)]
    try:
        f = gf.GraphswapFleet([r.url for r in reps], timeout=30)
        g = f.nccl_init(timeout_s=60, nccl=nc)
        C.check(isinstance(g, gf.FleetNcclGroup) and g.world_size == 4 and g.staging_bytes == 16 << 20 and
                g.ranks == {r.url: i + 1 for i, r in enumerate(reps)} and not g.broken, "group: %r" % vars(g))
        C.check(nc.inits == [(4, bytes(range(128)), 0)], "the trainer's init_rank: %r" % nc.inits)
        infos = [b[1]["init_info"] for r in reps for b in r.bodies]
        C.check([r.bodies[0][0] for r in reps] == ["/init_weight_transfer_engine"] * 3 and
                [i["rank_offset"] for i in infos] == [1, 2, 3] and all(i["world_size"] == 4 for i in infos) and
                all(base64.b64decode(i["nccl_unique_id_b64"]) == bytes(range(128)) for i in infos) and
                all(i["timeout_s"] == 60 for i in infos), "init bodies: %r" % infos)
    finally:
        for r in reps:
            r.close()
    # a CPU replica among them: 501 within the grace, the trainer never joins, nothing removed
    nc = FakeNccl()
    rep = FakeGpuReplica(nc, 1 << 20)
    try:
        f = gf.GraphswapFleet([rep.url, cpu_url], timeout=30)
        try:
            f.nccl_init(timeout_s=5, nccl=nc)
            C.fail("nccl_init with a CPU replica did not raise")
        except gf.FleetError as e:
            C.check(list(e.result.failed) == [cpu_url] and "501" in e.result.failed[cpu_url] and
                    e.result.removed == [] and f.urls == [rep.url, cpu_url], "CPU replica: %r" % e.result)
        C.check(nc.inits == [], "the trainer joined a group that cannot form: %r" % nc.inits)
    finally:
        rep.close()


def url_of(srv):
    return "http://127.0.0.1:%d" % srv.port


def tensors_f32(model_dir):
    raw = ref_model.read_checkpoint_tensors(model_dir)
    return [(n, t.to_f64().astype(np.float32)) for n, t in sorted(raw.items())]


def raw_state_dict(model_dir):
    return {n: gc.Tensor(t.dtype, t.shape, t.data) for n, t in sorted(ref_model.read_checkpoint_tensors(model_dir).items())}


def greedy(srv, ids):
    r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
                                        "return_token_ids": True})
    return r.json["choices"][0]["token_ids"] if r.status == 200 else r.status


def is_paused(srv):
    r = H.get(srv, "/is_paused")
    return r.json.get("is_paused") if r.status == 200 else r.status


class KillOnRead(gc.Tensor):
    """A tensor whose bytes, when first read (serialised for its bucket), kill a replica: the replica
    stops in the middle of the fleet's update."""

    def __init__(self, base, victim):
        self._fired = True
        gc.Tensor.__init__(self, base.dtype, base.shape, base.data)
        self._victim, self._fired = victim, False

    @property
    def data(self):
        if not self._fired:
            self._fired = True
            self._victim.kill()
        return self._data

    @data.setter
    def data(self, v):
        self._data = v


def check_trainer_sums(C, what, srv, named):
    cl = gc.GraphswapClient(url_of(srv))
    dtype, theirs = cl.checkpoint_checksums()
    mine = gc.state_dict_checksums(named, dtype)
    bad = sorted(n for n in mine if theirs.get(n) != mine[n])
    C.check(bad == [] and len(mine) > 10, "%s: replica %d differs from the pushed tensors in %s" % (what, srv.port, bad[:3]))


def run_cli(args, timeout=120):
    p = subprocess.run([sys.executable, "-m", "graphswap_fleet"] + args, cwd=CLIENT_DIR, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def main():
    C = H.Checker("client_fleet")
    binary = H.gs_bin(C)
    tmp = H.scratch("client_fleet")
    T0 = H.mkmodel(C, binary, os.path.join(tmp, "T0"), extra=["--seed", "1", "--no-tie"])
    T1 = H.mkmodel(C, binary, os.path.join(tmp, "T1"), extra=["--seed", "2", "--no-tie"])
    T2 = H.mkmodel(C, binary, os.path.join(tmp, "T2"), extra=["--seed", "3", "--no-tie"])
    # the replicas' weight roots: step2 is T2 everywhere; step3 is T1, but T0 under C's root
    roots = {}
    for r, step3 in (("rootA", T1), ("rootC", T0)):
        roots[r] = os.path.join(tmp, r)
        shutil.copytree(T2, os.path.join(roots[r], "step2"))
        shutil.copytree(step3, os.path.join(roots[r], "step3"))
    gateway, legacy = FakeRouter("gateway"), FakeRouter("legacy")
    try:
        A = H.Server(C, binary, T0, SERVE_ARGS + ["--weights-root", roots["rootA"]])
        B = H.Server(C, binary, T0, SERVE_ARGS + ["--weights-root", roots["rootA"]])
        Cs = H.Server(C, binary, T0, SERVE_ARGS + ["--weights-root", roots["rootC"]])
        a, b, c = url_of(A), url_of(B), url_of(Cs)
        fleet = gf.GraphswapFleet([a, b + "/", c], timeout=60, router_url=gateway.url, router_kind="sglang",
                                  router_key="rk-1")
        C.check(fleet.urls == [a, b, c], "urls: %r" % fleet.urls)
        C.check(fleet.versions() == {a: "0", b: "0", c: "0"}, "versions at start: %r" % fleet.versions())

        # (e) pause / resume reach every replica
        fleet.pause("keep")
        C.check([is_paused(s) for s in (A, B, Cs)] == [True] * 3, "pause: %r" % [is_paused(s) for s in (A, B, Cs)])

        # (a) a fan-out update while paused: numpy float32 and Python-float (BF16) tensors
        named = []
        for i, (n, arr) in enumerate(tensors_f32(T1)):
            named.append((n, gc.from_floats(arr.ravel().tolist(), list(arr.shape), "BF16") if i % 3 == 0 else arr))
        res = fleet.update_weights(named, "step-1", bucket_bytes=64 << 10, pause="keep")
        C.check(isinstance(res, gf.FleetResult) and res.version == "step-1" and res.ok == [a, b, c] and
                res.failed == {} and res.removed == [], "update step-1: %r" % res)
        C.check(fleet.versions() == {a: "step-1", b: "step-1", c: "step-1"}, "versions: %r" % fleet.versions())
        for s in (A, B, Cs):
            check_trainer_sums(C, "step-1", s, named)
            info = gc.GraphswapClient(url_of(s)).info()
            C.check(info["last_update"]["buckets"] > 2, "expected several buckets: %r" % info["last_update"])
        C.check(fleet.verify() == {a: "", b: "", c: ""}, "verify: %r" % fleet.verify())
        C.check(fleet.verify(named=dict(named)) == {a: "", b: "", c: ""}, "verify(named): %r" % fleet.verify(named=named))
        wrong = list(named)
        wrong[0] = (wrong[0][0], np.zeros(tuple(wrong[0][1].shape), np.float32))
        v = fleet.verify(named=wrong)
        C.check(all(re.search(r"differ from the trainer's.*%s" % re.escape(wrong[0][0]), v[u]) for u in (a, b, c)),
                "verify against other tensors: %r" % v)
        C.check([is_paused(s) for s in (A, B, Cs)] == [True] * 3, "the update ended the fleet's pause")
        fleet.resume()
        C.check([is_paused(s) for s in (A, B, Cs)] == [False] * 3, "resume: %r" % [is_paused(s) for s in (A, B, Cs)])
        outs = [[greedy(s, ids) for ids in ([1, 2, 3], [40, 50, 60, 70])] for s in (A, B, Cs)]
        C.check(isinstance(outs[0][0], list) and outs[0] == outs[1] == outs[2], "greedy tokens differ: %r" % outs)
        C.check(gateway.calls == [], "router called without a failure: %r" % gateway.calls)

        # (b) load_from_disk of a second checkpoint on every replica
        res = fleet.load_from_disk("step2", "step-2")
        C.check(res.ok == [a, b, c] and res.failed == {} and res.removed == [], "load step-2: %r" % res)
        raw2 = raw_state_dict(T2)
        for s in (A, B, Cs):
            check_trainer_sums(C, "step-2", s, raw2)
        C.check(fleet.versions() == {a: "step-2", b: "step-2", c: "step-2"}, "versions: %r" % fleet.versions())

        # (d) C loads other weights under the same path: its checksums disagree, it is removed
        res = fleet.load_from_disk("step3", "step-3")
        C.check(res.ok == [a, b] and list(res.failed) == [c] and res.removed == [c], "load step-3: %r" % res)
        C.check("differ from the majority" in res.failed.get(c, ""), "reason: %r" % res.failed)
        C.check(fleet.urls == [a, b], "urls after C's removal: %r" % fleet.urls)
        want = ("DELETE", "/workers/" + urllib.parse.quote(c, safe=""), "Bearer rk-1")
        C.check(gateway.calls == [want], "router calls: %r (want %r)" % (gateway.calls, want))
        for s in (A, B):
            check_trainer_sums(C, "step-3", s, raw_state_dict(T1))
        C.check(gc.GraphswapClient(c).info()["version"] == "step-3", "C's own version")
        C.check(fleet.removals and fleet.removals[-1][0] == c, "removals: %r" % fleet.removals)
        Cs.stop()

        # a replica stopped in the middle of an update (killed while a later bucket is serialised)
        D = H.Server(C, binary, T0, SERVE_ARGS)
        d = url_of(D)
        fleet2 = gf.GraphswapFleet([a, b, d], timeout=60, router_url=gateway.url, router_kind="sglang",
                                   max_workers=2)
        named4 = [(n, arr) for n, arr in tensors_f32(T0)]
        k = len(named4) // 2
        base = gc.Tensor("F32", list(named4[k][1].shape), named4[k][1].astype("<f4").tobytes())
        named4[k] = (named4[k][0], KillOnRead(base, D))
        del gateway.calls[:]
        res = fleet2.update_weights(named4, "step-4", bucket_bytes=32 << 10)
        C.check(res.ok == [a, b] and list(res.failed) == [d] and res.removed == [d], "mid-run stop: %r" % res)
        C.check(re.match(r"bucket \d+ of \d+: (unreachable|timeout)", res.failed.get(d, "")) is not None,
                "mid-run reason: %r" % res.failed)
        C.check(fleet2.urls == [a, b], "urls: %r" % fleet2.urls)
        C.check(gateway.calls == [("DELETE", "/workers/" + urllib.parse.quote(d, safe=""), None)],
                "router calls: %r" % gateway.calls)
        for s in (A, B):
            check_trainer_sums(C, "step-4", s, named4)
        C.check(fleet2.versions() == {a: "step-4", b: "step-4"}, "versions: %r" % fleet2.versions())

        # (c) a replica killed before an update
        B.kill()
        del gateway.calls[:]
        res = fleet2.update_weights(tensors_f32(T1), "step-5", bucket_bytes=64 << 10)
        C.check(res.ok == [a] and list(res.failed) == [b] and res.removed == [b], "killed replica: %r" % res)
        C.check(res.failed.get(b, "").startswith("begin: unreachable"), "reason: %r" % res.failed)
        C.check(fleet2.urls == [a] and fleet2.versions() == {a: "step-5"}, "after: %r %r" % (fleet2.urls, fleet2.versions()))
        C.check(gateway.calls == [("DELETE", "/workers/" + urllib.parse.quote(b, safe=""), None)],
                "router calls: %r" % gateway.calls)
        check_trainer_sums(C, "step-5", A, tensors_f32(T1))

        # every replica failing: FleetError after reporting; an older sgl-router (404 to DELETE /workers)
        dead = gf.GraphswapFleet([b], timeout=30, router_url=legacy.url, router_kind="sglang")
        try:
            dead.update_weights(tensors_f32(T1), "step-6")
            C.fail("an update with every replica down did not raise")
        except gc.GraphswapError as e:
            C.check(isinstance(e, gf.FleetError) and e.result.ok == [] and list(e.result.failed) == [b] and
                    e.result.removed == [b], "FleetError: %r %r" % (e, getattr(e, "result", None)))
        q = urllib.parse.quote(b, safe="")
        C.check(legacy.calls == [("DELETE", "/workers/" + q, None), ("POST", "/remove_worker?url=" + q, None)],
                "legacy router calls: %r" % legacy.calls)
        C.check(dead.urls == [], "urls: %r" % dead.urls)
        # pause of a dead replica removes it
        del legacy.calls[:]
        dead = gf.GraphswapFleet([a, b], timeout=30, router_url=legacy.url, router_kind="sglang")
        dead.pause("keep")
        C.check(dead.urls == [a] and list(dead.last_result.failed) == [b] and dead.last_result.removed == [b] and
                dead.last_result.failed[b].startswith("pause: "), "pause with a dead replica: %r" % dead.last_result)
        C.check(is_paused(A) is True, "A not paused")
        dead.resume()
        C.check(is_paused(A) is False, "A not resumed")
        C.check(len(legacy.calls) == 2 and legacy.calls[1][1] == "/remove_worker?url=" + q, "calls: %r" % legacy.calls)
        # a dead router: reported in failed, never raised; removed stays empty
        nowhere = gf.GraphswapFleet([b], timeout=30, router_url="http://127.0.0.1:9", router_kind="vllm")
        try:
            nowhere.update_weights(tensors_f32(T1), "step-7")
            C.fail("no FleetError")
        except gf.FleetError as e:
            C.check(e.result.removed == [] and "not removed from the router" in e.result.failed.get(b, ""),
                    "dead router: %r" % e.result)
        C.check(nowhere.urls == [], "a replica whose router removal failed is still driven")
        # remove() through smg (UUID-keyed) and vllm-router
        smg = FakeRouter("smg", workers=[a, "http://10.0.0.7:8000"])
        vll = FakeRouter("vllm")
        try:
            f = gf.GraphswapFleet([a], router_url=smg.url, router_kind="sglang", router_key="k2")
            C.check(f.remove(a, "test") is True and f.urls == [], "smg remove: %r" % (smg.calls,))
            C.check([m for m, _p, _a in smg.calls] == ["DELETE", "GET", "DELETE"] and
                    smg.calls[2][1] != smg.calls[0][1] and a not in smg.ids.values() and
                    all(x[2] == "Bearer k2" for x in smg.calls), "smg calls: %r" % smg.calls)
            f = gf.GraphswapFleet([a], router_url=vll.url, router_kind="vllm")
            C.check(f.remove(a, "test") is True, "vllm remove")
            C.check(vll.calls == [("DELETE", "/workers/" + urllib.parse.quote(a, safe=""), None)], "vllm calls: %r" % vll.calls)
        finally:
            smg.close()
            vll.close()

        test_nccl_group(C, a)

        # the CLI
        rc, out, err = run_cli(["--help"])
        C.check(rc == 0 and "load-from-disk" in out and "versions" in out, "--help: %d %s %s" % (rc, out, err))
        rc, out, err = run_cli(["--urls", a, "versions"])
        C.check(rc == 0 and json.loads(out) == {a: "step-5"}, "cli versions: %d %s %s" % (rc, out, err))
        rc, out, err = run_cli(["--urls", a, "load-from-disk", "step2", "--version", "cli-1"])
        C.check(rc == 0 and json.loads(out) == {"version": "cli-1", "ok": [a], "failed": {}, "removed": []},
                "cli load-from-disk: %d %s %s" % (rc, out, err))
        rc, out, err = run_cli(["--urls", "%s,%s" % (a, b), "verify"])
        v = json.loads(out) if out.strip().startswith("{") else {}
        C.check(rc == 1 and v.get(a) == "" and v.get(b, "").startswith("check: unreachable"),
                "cli verify: %d %s %s" % (rc, out, err))
        H.sanitizer_clean(C, A)
    finally:
        gateway.close()
        legacy.close()
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
