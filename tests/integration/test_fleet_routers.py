#!/usr/bin/env python3
"""A fleet of three `graphswap serve` replicas behind the real routers, sglang-router and vllm-router
(from PyPI, in a test-only venv cached in GS_TEST_TMP/../venv-routers; where they cannot be installed
the test is SKIPPED, exit 77, with the reason), each router in turn:

  - client threads send /generate (token-id prompts) and /v1/completions (text prompts; sglang-router
    takes only string prompts there) through the router the whole time, greedy, 8 tokens, and one
    more client long /generate requests (400 tokens);
  - the trainer (this thread) makes 20 fan-out updates with GraphswapFleet
    (clients/python/graphswap_fleet.py): tensor updates (update_weights, two checkpoints' tensors
    alternately) and disk loads (load_from_disk, two other checkpoints alternately);
  - before update 7 one replica is killed (SIGKILL) while it runs a request (its /metrics
    num_requests_running >= 1): the routers retry the requests in flight there on another worker; the fan-out finds it unreachable, reports it and removes it from the router;
  - after update 10 it is restarted (a new port) with `--weights-from` a live replica, polled until
    GET /health?ready=1 is 200, checked (version and checkpoint checksums equal the live ones), and
    only then registered with the router (sglang-router: POST /workers {"url"}; vllm-router: POST
    /add_worker?url=) and added to the fleet; the router then sends it traffic;
  - every request is answered 200 (no 4xx, no 5xx, no dropped connection); each answer's
    weight_version (meta_info.weight_version of /generate, the top-level weight_version of
    /v1/completions) is one that was live while the request was in flight (version k: from the start
    of fan-out k to the end of fan-out k+1), and its text is the greedy text of that version's
    checkpoint (`graphswap generate`, computed beforehand);
  - at the end every replica in the router is healthy, the router's workers are the fleet's, and
    fleet.verify() against the last pushed tensors is "" for each: all replicas equal.
Where the binary's `serve --help` has no --weights-from yet, the restarted replica starts from the
base checkpoint and gets the live weights from the trainer (a full update) before it registers; the
test says so in a NOTE line.

The routers are started as deploy/ configures them: --policy round_robin (here; cache_aware there),
--health-check-interval-secs 1 and --health-check-endpoint /health (200 also while a replica takes an
update, so a fan-out does not take every replica out at once; /health?ready=1 is 503 then). Facts on
the two routers, from their sources (and checked here on sglang-router 0.3.2 and vllm-router 0.1.17):
  - sglang-router (sgl-model-gateway, sgl-project/sglang): workers are added at run time with POST
    /workers {"url"} (202, queued) and removed with DELETE /workers/{worker_id}, the id a UUID listed
    by GET /workers (docs/advanced_features/sgl_model_gateway.md at 0f4513c2; 0.3.2 answers 400 to a
    URL in the path); registration probes GET /health (hard-coded,
    sgl-model-gateway/src/core/steps/worker/local/detect_connection.rs at 5a486ae5), the periodic check
    GET {url}{--health-check-endpoint} (a query string kept), default /health, 3 failures / 2 successes
    (sgl-model-gateway/src/core/worker.rs at 2893b00e, test_health_config_default); failed requests
    are retried on 408, 429, 500, 502, 503, 504 (the same doc).
  - vllm-router (vllm-project/router): POST /add_worker?url= and POST /remove_worker?url=, also POST
    /workers {"url"} and DELETE /workers/{url} (src/server.rs at e17f94e3; add_worker answers once the
    worker is healthy); health checks GET {url}{endpoint}, default /health, 3 / 2 (src/core/worker.rs
    at a286cd7e, HealthConfig::default).
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import http.client
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
SRC = os.environ.get("GS_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "clients", "python"))
import test_http_basic as H  # noqa: E402

# the versions this test was written against (sglang-router 0.3.2 = sgl-model-gateway; vllm-router 0.1.17)
ROUTER_PKGS = ["sglang-router==0.3.2", "vllm-router==0.1.17"]
N_REPLICAS = 3
N_UPDATES = 20
KILL_BEFORE = 7    # replica 1 is killed just before this update
JOIN_AFTER = 10    # and joins again (restarted) after this one
N_CLIENTS = 3
MAX_TOKENS = 8
LONG_TOKENS = 400  # one more client sends long /generate requests: some are in flight at the kill
SERVED = "gs-fleet"
ID_PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42, 17, 9, 250, 3]]
TEXT_PROMPTS = ["The fleet", "A replica joins", "Weights move"]
READY_TIMEOUT = 60
REPLICA_ARGS = ["--served-model-name", SERVED, "--threads", "1", "--max-model-len", "512", "--kv-cache-mb", "16",
                "--max-seqs", "16"]


# ---------------------------------------------------------------------------------------------------
# set-up
# ---------------------------------------------------------------------------------------------------

def venv_python():
    base = os.environ.get("GS_TEST_TMP") or "/tmp/gs-fleet-routers"
    venv = os.path.join(os.path.dirname(os.path.abspath(base)), "venv-routers")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        p = subprocess.run(["/usr/bin/python3", "-m", "venv", venv], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print("SKIP: cannot make a venv for the routers: %s" % p.stderr.strip()[-300:])
            sys.exit(77)
    probe = "import sglang_router, vllm_router, importlib.metadata as m; " \
            "print(m.version('sglang-router'), m.version('vllm-router'))"
    p = subprocess.run([py, "-c", probe], capture_output=True, text=True)
    if p.returncode != 0 or p.stdout.split() != [s.split("==")[1] for s in ROUTER_PKGS]:
        p = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + ROUTER_PKGS,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            print("SKIP: %s cannot be installed from PyPI here: %s" % (" and ".join(ROUTER_PKGS),
                                                                     p.stderr.strip()[-400:]))
            sys.exit(77)
    return py, os.path.join(venv, "bin")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_st(path):
    """[(name, Tensor)] of one safetensors file, in file order (standard library only)."""
    from graphswap_client import Tensor
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = []
    for name, e in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                          key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = e["data_offsets"]
        out.append((name, Tensor(e["dtype"], e["shape"], raw[base + a:base + b])))
    return out


def references(C, binary, ckpt_dir, tmp):
    """{("ids", i) | ("text", i): greedy text} of one checkpoint (`graphswap generate`)."""
    ref = {}
    batch = os.path.join(tmp, "batch-%s.jsonl" % os.path.basename(ckpt_dir))
    with open(batch, "w") as f:
        for ids in ID_PROMPTS:
            f.write(json.dumps({"prompt_ids": ids, "max_tokens": MAX_TOKENS, "temperature": 0,
                                "ignore_eos": True}) + "\n")
        f.write(json.dumps({"prompt_ids": ID_PROMPTS[0], "max_tokens": LONG_TOKENS, "temperature": 0,
                            "ignore_eos": True}) + "\n")
    p = subprocess.run([binary, "generate", "--model", ckpt_dir, "--batch-file", batch, "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if not C.check(p.returncode == 0 and len(lines) == len(ID_PROMPTS) + 1, "generate --batch-file %s: %s"
                   % (ckpt_dir, p.stderr[-500:])):
        sys.exit(C.finish())
    for i, o in enumerate(lines[:-1]):
        ref[("ids", i)] = o["text"]
    ref[("long", 0)] = lines[-1]["text"]
    for i, text in enumerate(TEXT_PROMPTS):
        p = subprocess.run([binary, "generate", "--model", ckpt_dir, "--prompt", text, "--max-tokens",
                            str(MAX_TOKENS), "--ignore-eos", "--threads", "1"], capture_output=True, text=True,
                           timeout=120)
        o = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        if not C.check(p.returncode == 0 and o, "generate --prompt %r on %s: %s" % (text, ckpt_dir, p.stderr[-500:])):
            sys.exit(C.finish())
        ref[("text", i)] = o[0]["text"]
    return ref


def http_json(method, url, body=None, timeout=30):
    """(status, parsed JSON or None, raw) of one request on a fresh connection."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json"} if data is not None else {}
        if method == "POST" and data is None:
            h["Content-Length"] = "0"
        c.request(method, u.path + (("?" + u.query) if u.query else ""), body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        try:
            js = json.loads(raw) if raw else None
        except ValueError:
            js = None
        return r.status, js, raw
    finally:
        c.close()


def wait_until(what, fn, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            v = fn()
        except (OSError, http.client.HTTPException):
            v = None
        if v:
            return v
        time.sleep(0.1)
    return None


# ---------------------------------------------------------------------------------------------------
# the routers
# ---------------------------------------------------------------------------------------------------

class Router:
    """One router process (kind "sglang" or "vllm") in front of the given worker URLs."""

    def __init__(self, C, kind, py, bindir, urls, tmp):
        self.C, self.kind = C, kind
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        common = ["--host", "127.0.0.1", "--port", str(self.port), "--worker-urls"] + list(urls) + [
            "--policy", "round_robin", "--health-check-interval-secs", "1",
            "--health-check-endpoint", "/health", "--prometheus-port", str(free_port())]
        if kind == "sglang":
            cmd = [py, "-m", "sglang_router.launch_router"] + common + ["--log-level", "warn"]
        else:
            cmd = [os.path.join(bindir, "vllm-router")] + common + ["--log-level", "warning"]
        self.log_path = os.path.join(tmp, "router-%s.log" % kind)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def log_tail(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-3000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def workers(self):
        """{url: is_healthy} of the router's registry (both routers: GET /workers)."""
        st, js, _ = http_json("GET", self.url + "/workers", timeout=10)
        if st != 200 or not isinstance(js, dict):
            return None
        return {w["url"].rstrip("/"): bool(w.get("is_healthy")) for w in js.get("workers", [])}

    def wait_workers(self, want, timeout=READY_TIMEOUT):
        """True once the registry is exactly `want`, every one healthy."""
        want = set(want)
        return bool(wait_until("workers", lambda: (lambda w: w is not None and set(w) == want and all(w.values()))(
            self.workers()), timeout))

    def register(self, url):
        """Adds a worker at run time; True once the router lists it healthy."""
        if self.kind == "sglang":
            st, js, raw = http_json("POST", self.url + "/workers", {"url": url})
            ok = st == 202
        else:
            st, js, raw = http_json("POST", self.url + "/add_worker?url=" + urllib.parse.quote(url, safe=""),
                                    timeout=60)
            ok = st == 200
        self.C.check(ok, "%s-router registers %s: HTTP %d %r" % (self.kind, url, st, raw[:300]))
        return ok and bool(wait_until("registered", lambda: (self.workers() or {}).get(url), READY_TIMEOUT))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


# ---------------------------------------------------------------------------------------------------
# traffic
# ---------------------------------------------------------------------------------------------------

class Traffic:
    """N client threads sending /generate and /v1/completions through the router until stopped;
    every request recorded as (route, prompt key, t0, t1, status, versions, text, error)."""

    def __init__(self, url, n):
        self.url, self.n = url, n
        self.stop_ev = threading.Event()
        self.records = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(n + 1)]

    def start(self):
        for t in self.threads:
            t.start()

    def one(self, i, k):
        if i == self.n:  # the long-request client
            key, route = ("long", 0), "/generate"
            body = {"input_ids": ID_PROMPTS[0], "sampling_params": {"max_new_tokens": LONG_TOKENS, "temperature": 0,
                                                                    "ignore_eos": True}}
        elif (i + k) % 2 == 0:
            j = (i + k) % len(ID_PROMPTS)
            key, route = ("ids", j), "/generate"
            body = {"input_ids": ID_PROMPTS[j], "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0,
                                                                    "ignore_eos": True}}
        else:
            j = (i + k) % len(TEXT_PROMPTS)
            key, route = ("text", j), "/v1/completions"
            body = {"model": SERVED, "prompt": TEXT_PROMPTS[j], "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True}
        t0 = time.monotonic()
        status, versions, text, err = None, None, None, None
        try:
            status, js, raw = http_json("POST", self.url + route, body, timeout=120)
            if status == 200 and isinstance(js, dict):
                if route == "/generate":
                    v, text = (js.get("meta_info") or {}).get("weight_version"), js.get("text")
                else:
                    v = js.get("weight_version")
                    text = (js.get("choices") or [{}])[0].get("text")
                versions = None if v is None else [str(x) for x in (v if isinstance(v, list) else [v])]
            elif status != 200:
                err = raw[:300].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            err = "%s: %s" % (type(e).__name__, e)
        rec = (route, key, t0, time.monotonic(), status, versions, text, err)
        with self.lock:
            self.records.append(rec)

    def run(self, i):
        k = 0
        while not self.stop_ev.is_set():
            self.one(i, k)
            k += 1
            time.sleep(0.005)

    def count(self):
        with self.lock:
            return len(self.records)

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(150)


# ---------------------------------------------------------------------------------------------------
# one router's run
# ---------------------------------------------------------------------------------------------------

def metric(url, name):
    st, _, raw = http_json("GET", url + "/metrics", timeout=10)
    if st != 200:
        return None
    m = re.search(r"^%s(?:\{[^}]*\})? ([0-9.e+]+)$" % re.escape(name), raw.decode(), re.M)
    return float(m.group(1)) if m else None


def ready(url):
    try:
        return http_json("GET", url + "/health?ready=1", timeout=5)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def run_router(C, kind, py, bindir, binary, ckpts, tensors, refs, root, tmp, has_pull):
    import graphswap_fleet as F
    from graphswap_client import GraphswapClient

    print("--- %s-router" % kind, flush=True)
    reps = [H.Server(C, binary, ckpts["a"], REPLICA_ARGS + ["--weights-root", root]) for _ in range(N_REPLICAS)]
    urls = ["http://127.0.0.1:%d" % s.port for s in reps]
    router = Router(C, kind, py, bindir, urls, tmp)
    traffic = None
    try:
        if not C.check(router.wait_workers(urls), "%s-router did not list %s healthy: %r\n%s"
                       % (kind, urls, router.workers() if router.proc.poll() is None else "exited",
                          router.log_tail())):
            return
        fleet = F.GraphswapFleet(urls, timeout=60, router_url=router.url, router_kind=kind)
        traffic = Traffic(router.url, N_CLIENTS)
        traffic.start()
        # version -> (checkpoint it holds, fan-out start, fan-out end)
        vinfo = {"0": ("a", float("-inf"), time.monotonic())}
        order = ["0"]
        killed_url, kill_t = None, None
        last_named = None
        for k in range(1, N_UPDATES + 1):
            # some traffic on every version (at least 0.2 s and 12 answers)
            time.sleep(0.2)
            wait_until("traffic", lambda n=traffic.count(): traffic.count() >= n + 12, 10)
            if k == KILL_BEFORE:
                killed_url = urls[1]
                busy = wait_until("busy", lambda: (metric(killed_url, "graphswap:num_requests_running") or 0) >= 1, 10)
                C.check(bool(busy), "%s: replica %s ran no request to be killed under" % (kind, killed_url))
                kill_t = time.monotonic()
                reps[1].proc.kill()  # SIGKILL: requests in flight there break; the router retries them
                reps[1].proc.wait(10)
            v = "%s-step-%02d" % (kind, k)
            s = time.monotonic()
            if k % 2 == 0:
                name = "c" if k % 4 == 2 else "d"
                last_named = tensors[name]
                try:
                    r = fleet.update_weights(last_named, version=v)
                except F.FleetError as e:
                    r = e.result
            else:
                name = "b" if k % 4 == 1 else "a"
                try:
                    r = fleet.load_from_disk(name, version=v)
                except F.FleetError as e:
                    r = e.result
            e_ = time.monotonic()
            vinfo[v] = (name, s, e_)
            order.append(v)
            if k == KILL_BEFORE:
                C.check(list(r.failed) == [killed_url] and r.removed == [killed_url]
                        and "unreachable" in r.failed.get(killed_url, ""),
                        "%s: update %d reports the killed replica unreachable and removes it: %r" % (kind, k, r))
                C.check(bool(wait_until("removed", lambda: (lambda w: w is not None and killed_url not in w)(
                    router.workers()), 15)), "%s-router still lists the killed replica %s: %r"
                    % (kind, killed_url, router.workers()))
                C.check(killed_url not in fleet.urls, "%s: the fleet dropped %s: %r" % (kind, killed_url, fleet.urls))
            else:
                C.check(not r.failed and sorted(r.ok) == sorted(fleet.urls),
                        "%s: update %d (%s) on every replica: %r" % (kind, k, v, r))
            if k == JOIN_AFTER:
                # the killed replica comes back (a new port), copies the live weights, and joins
                src = fleet.urls[0]
                extra = ["--weights-root", root]
                if has_pull:
                    extra += ["--weights-from", src, "--weights-from-timeout", "60"]
                new = H.Server(C, binary, ckpts["a"], REPLICA_ARGS + extra)
                reps[1] = new
                nurl = "http://127.0.0.1:%d" % new.port
                if not has_pull:
                    # the trainer gives it the live weights (the last update again) before it joins
                    nc = GraphswapClient(nurl, timeout=60)
                    if k % 2 == 0:
                        nc.update_weights(last_named, version=v)
                    else:
                        nc.load_from_disk(name, version=v)
                C.check(bool(wait_until("ready", lambda: ready(nurl), READY_TIMEOUT)),
                        "%s: the restarted replica %s never reported /health?ready=1 200:\n%s"
                        % (kind, nurl, new.stderr_text()[-2000:]))
                info = GraphswapClient(nurl, timeout=30).info()
                C.check(info.get("state") == "ready" and str(info.get("version")) == v,
                        "%s: the restarted replica holds the live version %r: %r" % (kind, v, info))
                same = fleet.client(src).checkpoint_checksums() == GraphswapClient(nurl).checkpoint_checksums()
                C.check(same, "%s: the restarted replica's checksums equal %s's" % (kind, src))
                # registered only now that it is ready
                if C.check(router.register(nurl), "%s-router lists %s healthy after registering it: %r\n%s"
                           % (kind, nurl, router.workers(), router.log_tail())):
                    fleet.urls.append(nurl)
                    urls[1] = nurl
                    served = wait_until("served", lambda: (metric(nurl, "graphswap:request_success_total") or 0) > 0,
                                        20)
                    C.check(bool(served), "%s-router sends the joined replica %s requests" % (kind, nurl))
        traffic.stop()
        recs = traffic.records
        print("%s-router: %d requests during %d updates, %d of them in flight when a replica was killed; "
              "removals: %r" % (kind, len(recs), N_UPDATES, sum(1 for r in recs if r[2] <= kill_t <= r[3]),
                                [(u, note) for u, _why, note in fleet.removals]), flush=True)
        C.check(len(recs) >= 10 * N_UPDATES, "%s: only %d requests ran" % (kind, len(recs)))
        # every request answered 200
        bad = [r for r in recs if r[4] != 200]
        C.check(not bad, "%s: %d of %d requests not answered 200, e.g. %r" % (kind, len(bad), len(recs), bad[:3]))
        # each answer's version was live while it ran, and its text is that version's greedy text
        ends = {order[i]: (vinfo[order[i + 1]][2] if i + 1 < len(order) else float("inf")) for i in range(len(order))}
        wrong_v, wrong_t, mixed = [], [], []
        for route, key, t0, t1, status, versions, text, err in recs:
            if status != 200:
                continue
            if not versions or len(versions) != 1 or versions[0] not in vinfo:
                mixed.append((route, versions))
                continue
            vv = versions[0]
            ck, start, _ = vinfo[vv]
            if not (t0 <= ends[vv] and t1 >= start):
                wrong_v.append((route, vv, round(t0, 3), round(t1, 3), round(start, 3), round(ends[vv], 3)))
            if text != refs[ck][key]:
                wrong_t.append((route, key, vv, text, refs[ck][key]))
        C.check(not mixed, "%s: %d answers without one known weight_version (pause wait), e.g. %r"
                % (kind, len(mixed), mixed[:3]))
        C.check(not wrong_v, "%s: %d answers carry a version that was not live while they ran, e.g. %r"
                % (kind, len(wrong_v), wrong_v[:3]))
        C.check(not wrong_t, "%s: %d answers' text is not their version's checkpoint's greedy text, e.g. %r"
                % (kind, len(wrong_t), wrong_t[:3]))
        seen = {r[5][0] for r in recs if r[4] == 200 and r[5] and len(r[5]) == 1}
        C.check(len(seen) >= N_UPDATES // 2, "%s: answers saw only %d versions" % (kind, len(seen)))
        # the end state: the router routes to the fleet, every replica equal to the trainer's last tensors
        C.check(router.wait_workers(fleet.urls, 15), "%s-router's workers %r are the fleet's %r, all healthy"
                % (kind, router.workers(), fleet.urls))
        C.check(len(fleet.urls) == N_REPLICAS, "%s: the fleet has %d replicas at the end: %r"
                % (kind, len(fleet.urls), fleet.urls))
        ver = fleet.verify(named=last_named)
        C.check(set(ver) == set(fleet.urls) and not any(ver.values()),
                "%s: every replica equals the last pushed tensors: %r" % (kind, ver))
        vs = fleet.versions()
        C.check(set(vs.values()) == {order[-1]}, "%s: every replica at %s: %r" % (kind, order[-1], vs))
    finally:
        if traffic is not None:
            traffic.stop()
        router.stop()
        for s in reps:
            s.kill()


def main():
    C = H.Checker("fleet_routers")
    binary = H.gs_bin(C)
    py, bindir = venv_python()
    try:
        import graphswap_fleet  # noqa: F401
    except ImportError as e:
        C.fail("clients/python/graphswap_fleet.py cannot be imported: %s" % e)
        return C.finish()
    tmp = H.scratch("fleet_routers")
    root = os.path.join(tmp, "ckpts")
    ckpts = {n: H.mkmodel(C, binary, os.path.join(root, n), extra=["--seed", str(i + 1)])
             for i, n in enumerate("abcd")}
    tensors = {n: read_st(os.path.join(ckpts[n], "model.safetensors")) for n in "cd"}
    refs = {n: references(C, binary, ckpts[n], tmp) for n in "abcd"}
    C.check(len({json.dumps(sorted(refs[n].items())) for n in refs}) == 4,
            "the four checkpoints answer differently (else the text check could not tell them apart)")
    p = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=30)
    has_pull = "--weights-from" in p.stdout + p.stderr
    if not has_pull:
        print("NOTE: this graphswap serve has no --weights-from: the restarted replica gets the live weights "
              "from the trainer (a full update) instead of copying them from a replica", flush=True)
    t0 = time.time()
    try:
        for kind in ("sglang", "vllm"):
            run_router(C, kind, py, bindir, binary, ckpts, tensors, refs, root, tmp, has_pull)
    finally:
        H._kill_all()
    print("both routers: %.1f s" % (time.time() - t0), flush=True)
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
