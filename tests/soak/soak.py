#!/usr/bin/env python3
"""Soak: many HTTP weight updates under continuous generation load (`make soak`; not in `make check`).

One `graphswap serve` on a small random model (loopback, --port 0). SOAK_CLIENTS client threads
send requests without pause (completions and chat, streaming and not, greedy and seeded sampling)
while the main thread pushes SOAK_UPDATES full updates (begin -> "mixed" buckets -> finish),
alternating two checkpoints and cycling through the pause modes wait, abort, keep, recompute;
every 25th update is preceded by a vLLM /pause (modes abort, wait, keep in turn) and /resume.
Checks:
  - every weight call answers 200 (begin "updating", each bucket its tensor count, finish "ready"
    with the new version); after the last update /v1/weights reports it and the counters add up
  - every generation response is complete and well-formed: non-streaming: one choice, a
    finish_reason (length / stop / abort), token_ids as many as usage.completion_tokens, a
    weight_version; streaming: only "data:" lines of JSON, exactly one finish_reason, a usage chunk,
    [DONE] last, no error event; no request fails or hangs (bounded by REQ_TIMEOUT)
  - resource use is flat after warm-up: with the load held and the connections closed, open files
    (/proc/PID/fd) and threads (/proc/PID/status Threads) equal the warm-up baseline, and VmRSS
    grew less than RSS_SLACK_KB (RSS under load is sampled and reported too)
  - SIGTERM: exit 0, and no sanitizer report in the server's stderr (GS_BIN may be an ASan build)
Bounded: SOAK_UPDATES (default 1000; SOAK_GAP seconds of generation between two, default 0.05) and SOAK_TIME_LIMIT seconds (default 3000; hitting it stops
the updates early, which is reported but is not a failure by itself). SOAK_OUT: where to write
the summary JSON. Environment as the integration tests: GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import random
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

UPDATES = int(os.environ.get("SOAK_UPDATES", "1000"))
CLIENTS = int(os.environ.get("SOAK_CLIENTS", "6"))
TIME_LIMIT = float(os.environ.get("SOAK_TIME_LIMIT", "3000"))
GAP = float(os.environ.get("SOAK_GAP", "0.05"))  # seconds of generation between two updates
WARMUP = max(10, min(50, UPDATES // 10))
MODES = ("wait", "abort", "keep", "recompute")
VLLM_PAUSE = ("abort", "wait", "keep")
REQ_TIMEOUT = 120
RSS_SLACK_KB = 16 * 1024


def proc_status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def nfds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


class Load:
    """Client threads; hold() lets the requests in flight end and parks the threads."""

    def __init__(self, srv, n):
        self.srv = srv
        self.go = threading.Event()
        self.go.set()
        self.stop = False
        self.mu = threading.Lock()
        self.inflight = 0
        self.counts = {}
        self.failures = []
        self.n_fail = 0
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(n)]

    def start(self):
        for t in self.threads:
            t.start()

    def hold(self, timeout=REQ_TIMEOUT):
        self.go.clear()
        end = time.time() + timeout
        while time.time() < end:
            with self.mu:
                if self.inflight == 0:
                    return True
            time.sleep(0.05)
        return False

    def resume(self):
        self.go.set()

    def finish(self):
        self.stop = True
        self.go.set()
        for t in self.threads:
            t.join(REQ_TIMEOUT + 10)
        return [t.name for t in self.threads if t.is_alive()]

    def fail(self, what):
        with self.mu:
            self.n_fail += 1
            if len(self.failures) < 20:
                self.failures.append(what)

    def count(self, key):
        with self.mu:
            self.counts[key] = self.counts.get(key, 0) + 1

    def run(self, i):
        rng = random.Random(1000 + i)
        while not self.stop:
            self.go.wait()
            if self.stop:
                break
            with self.mu:
                self.inflight += 1
            try:
                self.one(rng, i)
            except Exception as e:  # a dropped connection or a timeout is a failure
                self.fail("client %d: %r" % (i, e))
            finally:
                with self.mu:
                    self.inflight -= 1

    def one(self, rng, i):
        chat = rng.random() < 0.35
        stream = rng.random() < 0.5
        body = {"max_tokens": rng.randint(4, 24), "return_token_ids": True, "ignore_eos": rng.random() < 0.7}
        if rng.random() < 0.5:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
        if chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": "soak %d says %s" % (i, "hi " * rng.randint(1, 20))}]
        else:
            path = "/v1/completions"
            body["prompt"] = [rng.randrange(1, 1000) for _ in range(rng.randint(1, 40))]
        key = "%s-%s" % ("chat" if chat else "completions", "stream" if stream else "plain")
        what = "%s (client %d)" % (key, i)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            self.check_stream(what, path, body)
        else:
            self.check_plain(what, path, body, chat)
        self.count(key)

    def check_plain(self, what, path, body, chat):
        r = H.post(self.srv, path, body, timeout=REQ_TIMEOUT)
        if r.status != 200 or not isinstance(r.json, dict):
            return self.fail("%s: %r" % (what, r))
        chs = r.json.get("choices")
        if not (isinstance(chs, list) and len(chs) == 1):
            return self.fail("%s: choices %r" % (what, chs))
        ch = chs[0]
        fin = ch.get("finish_reason")
        ids = ch.get("token_ids")
        usage = r.json.get("usage") or {}
        text = (ch.get("message") or {}).get("content") if chat else ch.get("text")
        if fin not in ("length", "stop", "abort"):
            return self.fail("%s: finish_reason %r" % (what, fin))
        if not isinstance(ids, list) or len(ids) != usage.get("completion_tokens"):
            return self.fail("%s: %r token_ids vs usage %r" % (what, ids, usage))
        if fin == "length" and len(ids) != body["max_tokens"]:
            return self.fail("%s: finish length with %d of %d tokens" % (what, len(ids), body["max_tokens"]))
        if not isinstance(text, str) or r.json.get("weight_version") is None:
            return self.fail("%s: text %r weight_version %r" % (what, text, r.json.get("weight_version")))
        self.count("finish-" + fin)

    def check_stream(self, what, path, body):
        s = H.Stream(self.srv, path, body, timeout=REQ_TIMEOUT)
        try:
            if s.status != 200:
                return self.fail("%s: HTTP %d %r" % (what, s.status, s.body()[:300]))
            evs = list(s.events())
        finally:
            s.close()
        if s.bad_lines:
            return self.fail("%s: bad SSE lines %r" % (what, s.bad_lines[:3]))
        if not evs or evs[-1] != "[DONE]" or evs.count("[DONE]") != 1:
            return self.fail("%s: stream does not end with one [DONE]: %r" % (what, evs[-2:]))
        objs = [e for e in evs[:-1] if isinstance(e, dict)]
        if len(objs) != len(evs) - 1 or any("error" in e or "_unparsable" in e for e in objs):
            return self.fail("%s: error or non-object event: %r" % (what, [e for e in objs if "error" in e][:1]))
        fins = [ch.get("finish_reason") for e in objs for ch in e.get("choices") or [] if ch.get("finish_reason")]
        ids = [t for e in objs for ch in e.get("choices") or [] for t in ch.get("token_ids") or []]
        usage = [e["usage"] for e in objs if e.get("usage")]
        if len(fins) != 1 or fins[0] not in ("length", "stop", "abort"):
            return self.fail("%s: finish reasons %r" % (what, fins))
        if not usage or usage[-1].get("completion_tokens") != len(ids):
            return self.fail("%s: %d token ids, usage %r" % (what, len(ids), usage[-1:]))
        if fins[0] == "length" and len(ids) != body["max_tokens"]:
            return self.fail("%s: finish length with %d of %d tokens" % (what, len(ids), body["max_tokens"]))
        self.count("finish-" + fins[0])


def quiescent(pid, timeout=10.0):
    """(open files, threads) once the client connections closed: the minimum over a short poll."""
    end = time.time() + timeout
    best = (nfds(pid), proc_status(pid, "Threads"))
    while time.time() < end:
        time.sleep(0.2)
        now = (nfds(pid), proc_status(pid, "Threads"))
        best = (min(best[0], now[0]), min(best[1], now[1]))
    return best


def main():
    C = H.Checker("soak")
    binary = H.gs_bin(C)
    tmp = H.scratch("soak")
    geo = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
           "--intermediate", "128"]
    S0 = H.mkmodel(C, binary, os.path.join(tmp, "S0"), vocab=1024, extra=geo + ["--seed", "41"])
    S1 = H.mkmodel(C, binary, os.path.join(tmp, "S1"), vocab=1024, extra=geo + ["--seed", "42"])
    asan = os.environ.get("ASAN_OPTIONS", "")
    asan = (asan + ":" if asan else "") + "quarantine_size_mb=1:thread_local_quarantine_size_kb=64"
    srv = H.Server(C, binary, S0, args=["--http-threads", str(CLIENTS + 6), "--drain-timeout", "30",
                                        "--keep-alive-ms", "200"], env={"ASAN_OPTIONS": asan})
    summary = {"updates_planned": UPDATES, "clients": CLIENTS, "binary": binary}
    load = Load(srv, CLIENTS)
    try:
        pid = srv.proc.pid
        sides = [W.ckpt(S1), W.ckpt(S0)]
        rng = random.Random(5)
        load.start()
        t0 = time.time()
        base = None
        samples = []
        done = 0
        weights_fail = 0
        for k in range(UPDATES):
            if time.time() - t0 > TIME_LIMIT:
                summary["stopped_by_time_limit"] = True
                break
            if k == WARMUP:  # baseline: load held, connections closed
                C.check(load.hold(), "warm-up: requests still in flight after %d s" % REQ_TIMEOUT)
                time.sleep(0.5)
                fd, th = quiescent(pid)
                base = {"fds": fd, "threads": th, "rss_kb": proc_status(pid, "VmRSS"), "update": k}
                load.resume()
            if k % 25 == 24:
                m = VLLM_PAUSE[(k // 25) % len(VLLM_PAUSE)]
                rp = H.post(srv, "/pause?mode=%s" % m, {})
                rr = H.post(srv, "/resume", {})
                if not C.check(rp.status == 200 and rr.status == 200, "update %d: /pause?mode=%s %r, /resume %r"
                               % (k, m, rp, rr)):
                    weights_fail += 1
            mode = MODES[k % len(MODES)]
            t = sides[k % 2]
            res = W.push(C, srv, "update %d (%s)" % (k, mode), t, W.make_buckets(list(t), "mixed", rng),
                         {"mode": "full", "pause": mode, "version": "s%d" % k})
            if res is None or not C.check(res.get("version") == "s%d" % k, "update %d: finish %r" % (k, res)):
                weights_fail += 1
                if weights_fail > 5:
                    break
            done = k + 1
            time.sleep(GAP)
            if k % 50 == 49:
                samples.append({"update": k + 1, "t": round(time.time() - t0, 1), "rss_kb": proc_status(pid, "VmRSS"),
                                "fds": nfds(pid), "threads": proc_status(pid, "Threads")})
                print("soak: %d updates, %.0f s, VmRSS %d KiB, fds %d, threads %d, requests %d, failures %d"
                      % (k + 1, time.time() - t0, samples[-1]["rss_kb"], samples[-1]["fds"], samples[-1]["threads"],
                         sum(v for kk, v in load.counts.items() if not kk.startswith("finish")), load.n_fail),
                      flush=True)
        t_updates = time.time() - t0
        C.check(load.hold(), "end: requests still in flight after %d s" % REQ_TIMEOUT)
        time.sleep(0.5)
        fd, th = quiescent(pid)
        end = {"fds": fd, "threads": th, "rss_kb": proc_status(pid, "VmRSS"), "update": done}
        hung = load.finish()
        C.check(not hung, "client threads never ended: %r" % hung)
        C.check(load.n_fail == 0, "%d generation requests failed; first: %s" % (load.n_fail, "\n  ".join(load.failures)))
        C.check(done == UPDATES or summary.get("stopped_by_time_limit"), "only %d of %d updates" % (done, UPDATES))
        info = W.weights_info(srv)
        C.check(info.get("version") == "s%d" % (done - 1) and info["counters"]["updates_ok"] == done,
                "after %d updates /v1/weights says %r" % (done, info))
        if C.check(base is not None, "no baseline: fewer updates than the warm-up (%d)" % WARMUP):
            C.check(end["fds"] <= base["fds"], "open files %d -> %d after warm-up" % (base["fds"], end["fds"]))
            C.check(end["threads"] == base["threads"], "threads %d -> %d after warm-up" % (base["threads"], end["threads"]))
            C.check(end["rss_kb"] - base["rss_kb"] < RSS_SLACK_KB, "VmRSS grew by %d KiB after warm-up (%d -> %d)"
                    % (end["rss_kb"] - base["rss_kb"], base["rss_kb"], end["rss_kb"]))
        H.healthy(C, srv, "after the soak")
        n_req = sum(v for kk, v in load.counts.items() if not kk.startswith("finish"))
        summary.update(updates_done=done, seconds_updates=round(t_updates, 1),
                       updates_per_s=round(done / t_updates, 2) if t_updates else None, requests=n_req,
                       requests_per_s=round(n_req / t_updates, 1) if t_updates else None,
                       request_kinds=dict(sorted(load.counts.items())), request_failures=load.n_fail,
                       first_failures=load.failures, weights_failures=weights_fail, baseline=base, end=end,
                       samples_under_load=samples, rss_max_under_load_kb=max([s["rss_kb"] for s in samples] or [0]))
    finally:
        load.stop = True
        load.go.set()
        rc, secs = srv.stop()
        C.check(rc == 0, "server exit %r after SIGTERM (%.1f s): %s" % (rc, secs, srv.stderr_text()[-3000:]))
        H.sanitizer_clean(C, srv)
        srv.kill()
        H._kill_all()
    summary["checks_failed"] = C.failed if hasattr(C, "failed") else None
    print("soak summary: " + json.dumps(summary, indent=1), flush=True)
    out = os.environ.get("SOAK_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
