#!/usr/bin/env python3
"""Weight updates over HTTP, part 3: updates while clients stream, and many updates in a row.

- For each pause mode (wait, abort, keep, recompute): 16 streaming clients (max_tokens 48) and 4
  non-streaming ones run; once every stream has tokens, a full update is pushed (begin with the mode,
  buckets, finish). A request sent while the session is open waits and runs on the new weights.
  Checks: no crash, every client ends (streams with [DONE] and a finish_reason), "wait" -> every
  request finishes "length" on the old version, "abort" -> running requests end "abort" on the old
  version, "keep" / "recompute" -> they finish "length" and report both versions [old, new] (their
  tokens came from both); no other response mixes versions; new requests see the new version;
  streams report their version(s) like non-streaming responses (in the usage chunk or final chunk).
- 50 full updates in a row on a small model (after a warm-up): resident memory (VmRSS) and open
  files (/proc/PID/fd) stay flat; generation between updates keeps working.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import os
import random
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

N_STREAMS = 16
N_PLAIN = 4
MAX_TOKENS = 48
CLIENT_TIMEOUT = 150  # seconds any one client may take (bounded joins)


def versions_of(v):
    """weight_version (a string or a list) -> list of strings; None stays None."""
    if v is None:
        return None
    return list(v) if isinstance(v, list) else [v]


class Client(threading.Thread):
    def __init__(self, srv, i, stream):
        super().__init__(daemon=True)
        self.srv, self.i, self.stream = srv, i, stream
        self.started = threading.Event()
        self.status = None
        self.finish = None
        self.n_tokens = 0
        self.done_marker = False
        self.version = None
        self.error = None

    def body(self):
        b = {"prompt": [10 + self.i, 20 + self.i, 30, 40 + self.i], "max_tokens": MAX_TOKENS, "temperature": 0,
             "ignore_eos": True, "return_token_ids": True}
        if self.stream:
            b.update(stream=True, stream_options={"include_usage": True})
        return b

    def run(self):
        try:
            if not self.stream:
                self.started.set()
                r = H.post(self.srv, "/v1/completions", self.body(), timeout=CLIENT_TIMEOUT)
                self.status = r.status
                if r.status == 200:
                    ch = r.json["choices"][0]
                    self.finish, self.n_tokens = ch["finish_reason"], len(ch["token_ids"])
                    self.version = versions_of(r.json.get("weight_version"))
                return
            s = H.Stream(self.srv, "/v1/completions", self.body(), timeout=CLIENT_TIMEOUT)
            self.status = s.status
            try:
                for ev in s.events():
                    if ev == "[DONE]":
                        self.done_marker = True
                        continue
                    if not isinstance(ev, dict):
                        continue
                    if "error" in ev:
                        self.error = ev["error"]
                    if "weight_version" in ev:
                        self.version = versions_of(ev["weight_version"])
                    for ch in ev.get("choices") or []:
                        self.n_tokens += len(ch.get("token_ids") or [])
                        if self.n_tokens:
                            self.started.set()
                        if ch.get("finish_reason") is not None:
                            self.finish = ch["finish_reason"]
            finally:
                s.close()
        except Exception as e:  # a dropped connection is a failure the checks report
            self.error = repr(e)
        finally:
            self.started.set()


def check_live_mode(C, srv, mode, tensors, rng):
    """One update in pause mode `mode` while clients run."""
    old = W.weights_info(srv).get("version")
    new = "live-%s" % mode
    clients = [Client(srv, i, True) for i in range(N_STREAMS)] + [Client(srv, 100 + i, False) for i in range(N_PLAIN)]
    for c in clients:
        c.start()
    t_end = time.time() + 60
    for c in clients:
        c.started.wait(max(0.1, t_end - time.time()))
    frozen = set(c.i for c in clients[:N_STREAMS] if c.n_tokens and c.finish is None)
    C.check(len(frozen) > 0, "%s: no stream was running when the update began" % mode)
    r = H.post(srv, "/v1/weights/begin", {"mode": "full", "model": "target", "pause": mode, "version": new})
    C.check(r.status == 200, "%s: begin: %r" % (mode, r))
    aborted = (r.json or {}).get("aborted_requests")
    # a request arriving while the session is open waits and runs on the new weights
    late = Client(srv, 999, False)
    late.start()
    time.sleep(0.3)
    buckets = W.make_buckets(list(tensors), "mixed", rng)
    for b in buckets:
        rb = W.post_bucket(srv, W.st_encode([tensors[n] for n in b]))
        C.check(rb.status == 200, "%s: bucket: %r" % (mode, rb))
    C.check(late.is_alive(), "%s: a request completed while the session was open (I7)" % mode)
    rf = H.post(srv, "/v1/weights/finish", {})
    C.check(rf.status == 200 and rf.json.get("version") == new and rf.json.get("state") == "ready",
            "%s: finish: %r" % (mode, rf))
    for c in clients + [late]:
        c.join(CLIENT_TIMEOUT)
    hung = [c.i for c in clients + [late] if c.is_alive()]
    C.check(not hung, "%s: clients never ended: %r" % (mode, hung))
    for c in clients:
        what = "%s: %s client %d" % (mode, "stream" if c.stream else "plain", c.i)
        if not C.check(c.status == 200 and c.error is None, "%s: status %r error %r" % (what, c.status, c.error)):
            continue
        if c.stream:
            C.check(c.done_marker, "%s: no [DONE]" % what)
        C.check(c.finish in ("length", "abort"), "%s: finish_reason %r" % (what, c.finish))
        if c.finish == "length":
            C.check(c.n_tokens == MAX_TOKENS, "%s: %d tokens with finish length" % (what, c.n_tokens))
        if c.version is None:
            continue  # (streams without a version are counted below)
        if mode in ("keep", "recompute") and c.finish == "length":
            C.check(c.version in ([old], [new], [old, new]), "%s: weight_version %r" % (what, c.version))
        else:
            C.check(c.version in ([old], [new]), "%s: weight_version mixes versions: %r" % (what, c.version))
        if mode in ("wait", "abort"):
            C.check(c.version == [old] or c.finish == "length",
                    "%s: an aborted request reports %r" % (what, c.version))
    streams, plain = clients[:N_STREAMS], clients[N_STREAMS:]
    print("%s: %d of %d streams were running at begin; finish reasons %r" % (
        mode, len(frozen), N_STREAMS, sorted(set(c.finish for c in clients if c.finish))), flush=True)
    nover = [c.i for c in streams if c.status == 200 and c.version is None]
    C.check(not nover, "%s: %d of %d streams carry no weight_version (neither the final chunk nor the usage chunk)"
            % (mode, len(nover), len(streams)))
    fins = [c.finish for c in clients]
    if mode == "wait":
        C.check(all(f == "length" for f in fins), "wait: finish reasons %r" % fins)
        C.check(all(c.version == [old] for c in clients if c.version is not None),
                "wait: versions %r" % [c.version for c in clients])
    elif mode == "abort":
        C.check(any(f == "abort" for f in fins), "abort: no request ended with finish_reason abort: %r" % fins)
        n_ab = sum(1 for f in fins if f == "abort")
        C.check(aborted == n_ab, "abort: begin reports aborted_requests %r, but %d requests ended \"abort\"" % (aborted, n_ab))
        C.check(all(c.n_tokens < MAX_TOKENS for c in clients if c.finish == "abort"), "abort: aborted with all tokens")
    else:
        C.check(all(f == "length" for f in fins), "%s: finish reasons %r" % (mode, fins))
        both = [c for c in clients if c.version == [old, new]]
        C.check(len(both) > 0, "%s: no request reports both versions [%s, %s]: %r"
                % (mode, old, new, [c.version for c in plain]))
        C.check(not any(c.version == [old] and c.finish == "length" and c.stream and c.n_tokens == MAX_TOKENS
                        and c.i in frozen for c in streams),
                "%s: a stream frozen across the update reports only the old version" % mode)
    C.check(late.status == 200 and late.version == [new], "%s: the request sent during the session: %r %r"
            % (mode, late.status, late.version))
    g = W.greedy(srv, [7, 8, 9], 4)
    C.check(g[0] != "error" and g[2] == new, "%s: a new request after the update: %r" % (mode, g))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def nfds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def settled_fds(pid, want, timeout=5.0):
    """Open files once keep-alive connections closed (polls up to `timeout`)."""
    end = time.time() + timeout
    n = nfds(pid)
    while n > want and time.time() < end:
        time.sleep(0.1)
        n = nfds(pid)
    return n


def check_many_updates(C, binary, tmp):
    S0 = H.mkmodel(C, binary, os.path.join(tmp, "S0"), extra=["--layers", "2", "--seed", "31"])
    S1 = H.mkmodel(C, binary, os.path.join(tmp, "S1"), extra=["--layers", "2", "--seed", "32"])
    # few handler threads, so that the warm-up touches every thread stack; under ASan a small
    # quarantine, so that freed blocks held for use-after-free detection do not read as growth
    asan_opts = os.environ.get("ASAN_OPTIONS", "")
    asan_opts = (asan_opts + ":" if asan_opts else "") + "quarantine_size_mb=1:thread_local_quarantine_size_kb=64"
    srv = H.Server(C, binary, S0, args=["--http-threads", "8"], env={"ASAN_OPTIONS": asan_opts})
    try:
        pid = srv.proc.pid
        sides = [W.ckpt(S0), W.ckpt(S1)]
        rng = random.Random(77)
        first = W.greedy(srv, [1, 2, 3], 6)

        def update(k):
            t = sides[k % 2]
            res = W.push(C, srv, "update %d" % k, t, W.make_buckets(list(t), "mixed", rng),
                         {"mode": "full", "pause": "wait", "version": "u%d" % k})
            if k % 10 == 9:
                g = W.greedy(srv, [1, 2, 3], 6)
                C.check(g[0] != "error" and g[2] == "u%d" % k, "generation after update %d: %r" % (k, g))
            return res

        for k in range(10):  # warm-up: staging buffer, thread stacks, allocator arenas
            update(k)
        time.sleep(0.3)
        fd0 = settled_fds(pid, 0, 0.5)
        rss0 = rss_kb(pid)
        for k in range(10, 60):
            if update(k) is None:
                break
        fd1 = settled_fds(pid, fd0)
        rss1 = rss_kb(pid)
        slack = 8 * 1024  # KiB
        C.check(rss1 - rss0 < slack, "VmRSS grew by %d KiB over 50 updates (%d -> %d KiB, slack %d)"
                % (rss1 - rss0, rss0, rss1, slack))
        C.check(fd1 <= fd0, "open files grew over 50 updates: %d -> %d" % (fd0, fd1))
        info = W.weights_info(srv)
        C.check(info.get("version") == "u59" and info["counters"]["updates_ok"] == 60 and
                info["counters"]["hook_runs_target"] == 60, "after 60 updates: %r" % info)
        # 60 updates alternate S0/S1: back on S1, greedy output equals S1's cold start
        cold = H.Server(C, binary, S1)
        try:
            want = W.greedy(cold, [1, 2, 3], 6)
        finally:
            cold.stop()
            cold.kill()
        now = W.greedy(srv, [1, 2, 3], 6)
        C.check(now[0] == want[0] and now[0] != first[0], "after 60 updates: %r vs cold %r (start %r)"
                % (now, want, first))
        print("50 updates: VmRSS %d -> %d KiB, open files %d -> %d" % (rss0, rss1, fd0, fd1), flush=True)
    finally:
        rc, _ = srv.stop()
        C.check(rc == 0, "many-updates server exit %r: %s" % (rc, srv.stderr_text()[-3000:]))
        H.sanitizer_clean(C, srv)
        srv.kill()


def main():
    C = H.Checker("weights_live")
    binary = H.gs_bin(C)
    tmp = H.scratch("weights_live")
    geo = ["--layers", "4", "--hidden", "256", "--heads", "8", "--kv-heads", "4", "--head-dim", "32",
           "--intermediate", "768"]
    M0 = H.mkmodel(C, binary, os.path.join(tmp, "M0"), vocab=4096, extra=geo + ["--seed", "21"])
    M1 = H.mkmodel(C, binary, os.path.join(tmp, "M1"), vocab=4096, extra=geo + ["--seed", "22"])
    try:
        srv = H.Server(C, binary, M0, args=["--drain-timeout", "120"])
        try:
            sides = [W.ckpt(M1), W.ckpt(M0)]
            rng = random.Random(3)
            for k, mode in enumerate(("wait", "abort", "keep", "recompute")):
                check_live_mode(C, srv, mode, sides[k % 2], rng)
            H.healthy(C, srv, "after the live updates")
        finally:
            H.stop_clean(C, srv)
        check_many_updates(C, binary, tmp)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
