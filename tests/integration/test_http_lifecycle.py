"""HTTP API, part 4: /metrics and the server's life cycle.

  - /metrics is Prometheus text (HELP / TYPE for every family, well-formed samples) with the vLLM names
    under "graphswap:" (num_requests_running / waiting, kv_cache_usage_perc, prompt_tokens_total,
    generation_tokens_total, request_success_total{finished_reason}, prefix_cache_queries_total /
    hits_total, time_to_first_token_seconds / inter_token_latency_seconds / e2e_request_latency_seconds
    histograms, spec_decode_* counters)
  - the counters move exactly as the requests say: prompt and generation tokens, finish reasons,
    histogram counts (TTFT and e2e one per request, inter-token latency one per later token),
    cumulative buckets, prefix-cache hits for a repeated prompt; gauges return to 0 when idle
  - SIGTERM with a stream and a non-streaming request in flight: the stream ends with
    finish_reason "abort" and [DONE], the other request gets its partial result with "abort", and the
    process exits 0 promptly; an idle server exits 0 on SIGINT too
"""

import os
import re
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402

CMPL = "/v1/completions"
FAMILIES = {
    "num_requests_running": "gauge", "num_requests_waiting": "gauge", "kv_cache_usage_perc": "gauge",
    "prompt_tokens_total": "counter", "generation_tokens_total": "counter", "request_success_total": "counter",
    "prefix_cache_queries_total": "counter", "prefix_cache_hits_total": "counter",
    "time_to_first_token_seconds": "histogram", "inter_token_latency_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram", "spec_decode_num_drafts_total": "counter",
    "spec_decode_num_draft_tokens_total": "counter", "spec_decode_num_accepted_tokens_total": "counter",
}
SAMPLE = re.compile(r'^graphswap:[a-z0-9_]+(\{[a-z_]+="[^"\\]*"(,[a-z_]+="[^"\\]*")*\})? -?[0-9][0-9.e+-]*$')


def test_format(C, srv):
    r = T.get(srv, "/metrics")
    text = r.raw.decode()
    types = dict(re.findall(r"^# TYPE graphswap:(\S+) (\S+)$", text, re.M))
    helps = set(re.findall(r"^# HELP graphswap:(\S+) ", text, re.M))
    for fam, kind in FAMILIES.items():
        C.check(types.get(fam) == kind, "metric family %s: TYPE %r, expected %s" % (fam, types.get(fam), kind))
        C.check(fam in helps, "metric family %s without HELP" % fam)
    bad = [ln for ln in text.splitlines() if ln and not ln.startswith("#") and not SAMPLE.match(ln)]
    C.check(not bad, "malformed metric samples: %r" % bad[:5])
    C.check('model_name="' in text, "metrics lack the model_name label")


def hist(m, name):
    """{le: cumulative count} plus _sum and _count of a histogram."""
    b = {}
    for k, v in m.items():
        mm = re.match(r'graphswap:%s_bucket\{le="([^"]+)"\}' % name, k)
        if mm:
            b[mm.group(1)] = v
    return b, m.get("graphswap:%s_sum" % name, 0), m.get("graphswap:%s_count" % name, 0)


def test_counters(C, srv):
    m0 = T.metrics(srv)
    p1 = list(range(100, 140))  # 40 tokens: two full 16-token KV blocks
    r1 = T.post(srv, CMPL, {"prompt": p1, "max_tokens": 7, "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True})
    base = T.post(srv, CMPL, {"prompt": [3, 2, 1], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                              "return_token_ids": True})
    stop_id = base.json["choices"][0]["token_ids"][2]
    r2 = T.post(srv, CMPL, {"prompt": [3, 2, 1], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                            "stop_token_ids": [stop_id]})
    r3 = T.post(srv, CMPL, {"prompt": p1, "max_tokens": 7, "temperature": 0, "ignore_eos": True})
    if not C.check(all(r.status == 200 for r in (r1, base, r2, r3)), "metrics requests failed"):
        return
    m1 = T.metrics(srv)
    n2 = r2.json["usage"]["completion_tokens"]
    C.check(r2.json["choices"][0]["finish_reason"] == "stop", "stop_token_ids request did not stop")

    def d(name):
        return m1.get(name, 0) - m0.get(name, 0)
    C.check(d("graphswap:prompt_tokens_total") == 40 + 3 + 3 + 40,
            "prompt_tokens_total moved by %r, expected 86" % d("graphswap:prompt_tokens_total"))
    C.check(d("graphswap:generation_tokens_total") == 7 + 8 + n2 + 7,
            "generation_tokens_total moved by %r, expected %d" % (d("graphswap:generation_tokens_total"), 22 + n2))
    C.check(d('graphswap:request_success_total{finished_reason="length"}') == 3,
            "request_success_total{length} moved by %r" % d('graphswap:request_success_total{finished_reason="length"}'))
    C.check(d('graphswap:request_success_total{finished_reason="stop"}') == 1,
            "request_success_total{stop} moved by %r" % d('graphswap:request_success_total{finished_reason="stop"}'))
    C.check(d('graphswap:request_success_total{finished_reason="abort"}') == 0, "abort counter moved")
    for name, want in (("time_to_first_token_seconds", 4), ("e2e_request_latency_seconds", 4),
                       ("inter_token_latency_seconds", 6 + 7 + (n2 - 1) + 6)):
        b1, s1, c1 = hist(m1, name)
        b0, s0, c0 = hist(m0, name)
        C.check(c1 - c0 == want, "%s count moved by %r, expected %d" % (name, c1 - c0, want))
        C.check(b1.get("+Inf") == c1, "%s: +Inf bucket %r != count %r" % (name, b1.get("+Inf"), c1))
        vals = [b1[k] for k in sorted(b1, key=lambda x: float("inf") if x == "+Inf" else float(x))]
        C.check(vals == sorted(vals), "%s buckets not cumulative: %r" % (name, vals))
        C.check(s1 >= s0 and s1 - s0 < 600 * want, "%s sum moved by %r" % (name, s1 - s0))
    C.check(d("graphswap:prefix_cache_queries_total") >= 80,
            "prefix_cache_queries_total moved by %r" % d("graphswap:prefix_cache_queries_total"))
    C.check(d("graphswap:prefix_cache_hits_total") >= 16,
            "the repeated 40-token prompt hit no cached block (hits moved by %r)" % d("graphswap:prefix_cache_hits_total"))
    C.check(m1.get("graphswap:num_requests_running") == 0 and m1.get("graphswap:num_requests_waiting") == 0,
            "gauges not 0 when idle")
    C.check(m1.get("graphswap:kv_cache_usage_perc") == 0, "kv_cache_usage_perc %r when idle"
            % m1.get("graphswap:kv_cache_usage_perc"))
    # a running request shows up in the gauges and in kv usage
    s = T.Stream(srv, CMPL, {"prompt": [1, 2, 3], "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
                             "stream": True})
    next(s.events(), None)
    m = T.metrics(srv)
    C.check(m.get("graphswap:num_requests_running") == 1 and m.get("graphswap:kv_cache_usage_perc", 0) > 0,
            "a running stream is not visible in the gauges: running %r kv %r"
            % (m.get("graphswap:num_requests_running"), m.get("graphswap:kv_cache_usage_perc")))
    s.close()
    t0 = time.time()
    while time.time() - t0 < 60 and T.metrics(srv).get("graphswap:num_requests_running") != 0:
        time.sleep(0.05)


def test_sigterm(C, binary, tmp):
    model = T.mkmodel(C, binary, os.path.join(tmp, "slow"), extra=["--hidden", "256", "--layers", "4", "--heads", "4",
                                                                    "--kv-heads", "2", "--head-dim", "64",
                                                                    "--intermediate", "768", "--max-pos", "65536"])
    # long requests (the context allows 60000 tokens), so both are surely in flight at the signal
    srv = T.Server(C, binary, model, ["--max-model-len", "65536", "--kv-cache-mb", "1024"])
    try:
        s = T.Stream(srv, CMPL, {"prompt": [1, 2, 3], "max_tokens": 30000, "temperature": 0, "ignore_eos": True,
                                 "stream": True, "stream_options": {"include_usage": True}}, timeout=120)
        evs = []
        it = s.events()
        for e in it:
            evs.append(e)
            if len(evs) >= 2:
                break
        res = {}

        def nonstream():
            res["r"] = T.post(srv, CMPL, {"prompt": [4, 5], "max_tokens": 30000, "temperature": 0,
                                          "ignore_eos": True}, timeout=120)

        th = threading.Thread(target=nonstream)
        th.start()
        t0 = time.time()
        while time.time() - t0 < 60 and T.metrics(srv).get("graphswap:num_requests_running") != 2:
            time.sleep(0.02)
        C.check(T.metrics(srv).get("graphswap:num_requests_running") == 2, "two requests not in flight before SIGTERM")
        srv.proc.send_signal(signal.SIGTERM)
        t_sig = time.time()
        for e in it:
            evs.append(e)
        s.close()
        th.join(60)
        rc, _ = srv.stop(timeout=60)
        secs = time.time() - t_sig
        got = T.collect_stream(evs).get(0, {})
        C.check(evs and evs[-1] == "[DONE]" and got.get("finish_reason") == "abort",
                "stream across SIGTERM: finish %r, last events %r" % (got.get("finish_reason"), evs[-2:]))
        C.check(len(got.get("text", "")) >= 0 and any(isinstance(e, dict) and e.get("usage") for e in evs),
                "stream across SIGTERM lacks the usage chunk")
        r = res.get("r")
        C.check(r is not None and r.status == 200 and r.json["choices"][0]["finish_reason"] == "abort" and
                r.json["usage"]["completion_tokens"] < 30000,
                "non-streaming request across SIGTERM: %r" % r)
        C.check(rc == 0, "exit status after SIGTERM with requests in flight: %r\n%s" % (rc, srv.stderr_text()[-3000:]))
        C.check(secs < 30, "shutdown took %.1fs" % secs)
        T.sanitizer_clean(C, srv)
    finally:
        srv.kill()


def test_sigint_idle(C, binary, model):
    srv = T.Server(C, binary, model)
    C.check(T.get(srv, "/health").status == 200, "idle server not healthy")
    rc, secs = srv.stop(sig=signal.SIGINT, timeout=60)
    C.check(rc == 0 and secs < 20, "SIGINT on an idle server: rc %r after %.1fs" % (rc, secs))
    C.check("stopped" in srv.stderr_text(), "no 'stopped' line after SIGINT")
    T.sanitizer_clean(C, srv)


def main():
    C = T.Checker("http_lifecycle")
    binary = T.gs_bin(C)
    tmp = T.scratch("http_lifecycle")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model)
    try:
        test_format(C, srv)
        test_counters(C, srv)
        test_format(C, srv)
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    try:
        test_sigterm(C, binary, tmp)
        test_sigint_idle(C, binary, model)
    finally:
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
