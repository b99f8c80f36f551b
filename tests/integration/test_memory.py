#!/usr/bin/env python3
"""Memory release for a colocated trainer over HTTP: the vLLM and SGLang routes as RL frameworks
call them, RSS of the server process before / asleep / awake, identical greedy output after wake-up.

  - vLLM (as verl's vllm_async_server.py and SkyRL's remote_inference_engine.py call it):
    POST /sleep (level 1 by default), /sleep?level=2, POST /wake_up, /wake_up?tags=weights then
    ?tags=kv_cache, GET /is_sleeping; SkyRL's JSON bodies {"level": n} and {"tags": 1}.
  - SGLang (as slime's sglang_engine.py and verl's http_server_engine.py call it):
    POST /release_memory_occupation {} or {"tags": [...]}, /resume_memory_occupation
    {"tags": ["weights"]}, then {"tags": null}; without --enable-weights-cpu-backup the weights are
    discarded (level 2), so a full update must come between; with it (verl, colocated) they are
    kept (level 1) and nothing has to be pushed.
  - While asleep: /v1/completions and /v1/chat/completions get 503, weight updates 409 (weights
    asleep), /tokenize and /v1/models still answer.
  - Level 1 + wake: greedy output and every checksum identical. Level 2 + wake: generation 503 and
    partial updates 409 until a full update over /v1/weights/{begin,bucket,finish}; then identical.
  - RSS (/proc/PID/status VmRSS) drops by about the weights' bytes at level 2, and comes back.
  - The Python client's sleep() / wake_up(tags) / is_sleeping().
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "clients", "python")))
import graphswap_client as gc  # noqa: E402
import test_http_basic as H  # noqa: E402
import test_weights_update as W  # noqa: E402

PROMPTS = [[5, 6, 7, 8], list(range(50, 90))]
MB = 1 << 20


def rss(srv):
    with open("/proc/%d/status" % srv.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def gen(srv):
    return [W.greedy(srv, p, 12)[0] for p in PROMPTS]


def is_sleeping(srv):
    r = H.get(srv, "/is_sleeping")
    return r.json.get("is_sleeping") if r.status == 200 else ("error", r.status)


def full_push(C, srv, model_dir, what):
    t = W.ckpt(model_dir)
    names = sorted(t)
    buckets = [names[i:i + 8] for i in range(0, len(names), 8)]
    return W.push(C, srv, what, t, buckets, {"mode": "full", "version": what})


def refused_generation(C, srv, what, needle=None):
    r = H.post(srv, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
    C.check(r.status == 503, "%s: completions while asleep: %r" % (what, r))
    if needle:
        C.check(needle in r.raw.decode(errors="replace"), "%s: 503 without %r: %r" % (what, needle, r.raw[:300]))
    r = H.post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    C.check(r.status == 503, "%s: chat while asleep: %r" % (what, r))


def vllm_level1(C, srv, ref, sums, fig):
    r = H.post(srv, "/sleep", None)  # vLLM's default level is 1
    C.check(r.status == 200 and r.json.get("is_sleeping") is True and r.json.get("weights_level") == 1,
            "sleep: %r" % r)
    C.check(is_sleeping(srv) is True, "is_sleeping after /sleep")
    fig["level 1 asleep"] = rss(srv)
    refused_generation(C, srv, "level 1", "asleep")
    r = H.post(srv, "/v1/weights/begin", {"mode": "full"})
    C.check(r.status == 409, "weights begin while the weights sleep: %r" % r)
    r = H.post(srv, "/tokenize", {"prompt": "hello"})
    C.check(r.status == 200, "tokenize while asleep: %r" % r)
    r = H.get(srv, "/v1/models")
    C.check(r.status == 200, "models while asleep: %r" % r)
    r = H.post(srv, "/sleep?level=1", None)  # asleep already: a no-op
    C.check(r.status == 200, "second sleep: %r" % r)
    r = H.post(srv, "/wake_up", None)
    C.check(r.status == 200 and r.json.get("is_sleeping") is False, "wake_up: %r" % r)
    C.check(is_sleeping(srv) is False, "is_sleeping after /wake_up")
    C.check(gen(srv) == ref, "level 1: greedy output differs after wake-up")
    fig["level 1 awake"] = rss(srv)
    d = W.diff_sums(W.checksums(srv, "target"), sums)
    C.check(not d, "level 1: checksums differ after wake-up: %s" % d[:5])


def vllm_level2(C, srv, model_dir, ref, sums, fig, weight_bytes):
    before = rss(srv)
    r = H.post(srv, "/sleep?level=2", None)
    C.check(r.status == 200 and r.json.get("weights_level") == 2 and r.json.get("weights_backup_bytes") == 0,
            "sleep level 2: %r" % r)
    fig["level 2 asleep"] = rss(srv)
    C.check(before - fig["level 2 asleep"] >= weight_bytes * 0.8,
            "level 2: RSS %d -> %d MiB, expected a drop of about the weights (%d MiB)"
            % (before // MB, fig["level 2 asleep"] // MB, weight_bytes // MB))
    # verl / vLLM RLHF: the weights first, the update, then the KV cache
    r = H.post(srv, "/wake_up?tags=weights", None)
    C.check(r.status == 200 and r.json.get("sleeping_tags") == ["kv_cache"], "wake_up weights: %r" % r)
    C.check(is_sleeping(srv) is True, "is_sleeping with the KV cache asleep")
    refused_generation(C, srv, "level 2, kv asleep")
    r = H.post(srv, "/wake_up?tags=kv_cache", None)
    C.check(r.status == 200 and r.json.get("is_sleeping") is False and r.json.get("weights") == "inconsistent",
            "wake_up kv_cache: %r" % r)
    refused_generation(C, srv, "level 2 awake, no update", "sleep level 2")
    r = H.post(srv, "/v1/weights/begin", {"mode": "partial"})
    C.check(r.status == 409, "partial update after level 2: %r" % r)
    if r.status == 200:
        H.post(srv, "/v1/weights/abort", {})
    fig["level 2 awake, before the update"] = rss(srv)
    full_push(C, srv, model_dir, "after-level-2")
    C.check(gen(srv) == ref, "level 2: greedy output differs after the full update")
    d = W.diff_sums(W.checksums(srv, "target"), sums)
    C.check(not d, "level 2: checksums differ after the full update: %s" % d[:5])
    fig["level 2 awake, updated"] = rss(srv)
    r = H.post(srv, "/wake_up?tags=bogus", None)
    C.check(r.status == 400, "wake_up with an unknown tag: %r" % r)
    r = H.post(srv, "/sleep?level=3", None)
    C.check(r.status == 400, "sleep level 3: %r" % r)


def skyrl_bodies(C, srv, ref):
    r = H.post(srv, "/sleep", {"level": 1})
    C.check(r.status == 200 and r.json.get("weights_level") == 1, "SkyRL sleep body: %r" % r)
    r = H.post(srv, "/wake_up", {"tags": 1})
    C.check(r.status == 200 and r.json.get("is_sleeping") is False, "SkyRL wake_up body: %r" % r)
    C.check(gen(srv) == ref, "SkyRL: greedy output differs after wake-up")


def sglang(C, srv, model_dir, ref):
    # KV cache only: the weights stay, no update needed
    r = H.post(srv, "/release_memory_occupation", {"tags": ["kv_cache"]})
    C.check(r.status == 200 and r.json.get("success") is True and r.json.get("sleeping_tags") == ["kv_cache"],
            "release kv_cache: %r" % r)
    refused_generation(C, srv, "sglang kv_cache released")
    r = H.post(srv, "/resume_memory_occupation", {"tags": ["kv_cache"]})
    C.check(r.status == 200 and r.json.get("is_sleeping") is False, "resume kv_cache: %r" % r)
    C.check(gen(srv) == ref, "sglang kv_cache: greedy output differs after resume")
    # slime: release with {} (everything, weights discarded), resume weights, update, resume the rest
    r = H.post(srv, "/release_memory_occupation", {})
    C.check(r.status == 200 and r.json.get("weights_level") == 2, "release all: %r" % r)
    r = H.post(srv, "/resume_memory_occupation", {"tags": ["weights"]})
    C.check(r.status == 200 and r.json.get("sleeping_tags") == ["kv_cache"], "resume weights: %r" % r)
    full_push(C, srv, model_dir, "after-release")
    r = H.post(srv, "/resume_memory_occupation", {"tags": None})
    C.check(r.status == 200 and r.json.get("is_sleeping") is False, "resume null: %r" % r)
    C.check(gen(srv) == ref, "sglang: greedy output differs after release, update, resume")
    r = H.post(srv, "/release_memory_occupation", {"tags": ["bogus"]})
    C.check(r.status == 400, "release with an unknown tag: %r" % r)
    r = H.post(srv, "/release_memory_occupation", {"tags": "weights"})
    C.check(r.status == 400, "release with tags not a list: %r" % r)
    C.check(is_sleeping(srv) is False, "a refused release changed the state")


def python_client(C, srv, ref):
    cl = gc.GraphswapClient("http://127.0.0.1:%d" % srv.port)
    st = cl.sleep(1)
    C.check(st.get("is_sleeping") is True and cl.is_sleeping(), "client sleep: %r" % st)
    st = cl.wake_up(["kv_cache"])
    C.check(st.get("sleeping_tags") == ["weights"] and cl.is_sleeping(), "client wake_up kv_cache: %r" % st)
    cl.wake_up(["weights"])
    C.check(not cl.is_sleeping(), "client: still sleeping after waking both tags")
    C.check(gen(srv) == ref, "client: greedy output differs after wake-up")
    try:
        cl.wake_up(["bogus"])
        C.fail("client wake_up with an unknown tag did not raise")
    except gc.GraphswapError as e:
        C.check(e.status == 400, "client wake_up bogus: %r" % e)


def sglang_cpu_backup(C, binary, model):
    """--enable-weights-cpu-backup (verl sets it in colocated mode): release keeps the weights."""
    srv = H.Server(C, binary, model, args=["--kv-cache-mb", "64", "--threads", "1", "--enable-weights-cpu-backup"])
    try:
        ref = gen(srv)
        C.check(all(isinstance(g, list) and len(g) == 12 for g in ref), "CPU backup: reference generation failed: %r"
                % (ref,))
        r = H.post(srv, "/release_memory_occupation", {"tags": ["kv_cache", "weights"]})
        C.check(r.status == 200 and r.json.get("weights_level") == 1 and r.json.get("weights_backup_bytes", 0) > 0,
                "release with the CPU backup: %r" % r)
        r = H.post(srv, "/resume_memory_occupation", {})
        C.check(r.status == 200 and r.json.get("weights") == "ready", "resume with the CPU backup: %r" % r)
        C.check(gen(srv) == ref, "CPU backup: greedy output differs after release / resume")
        r = H.post(srv, "/sleep", None)  # then SIGTERM while asleep: a clean exit (stop_clean)
        C.check(r.status == 200, "sleep before shutdown: %r" % r)
    finally:
        H.stop_clean(C, srv)


def main():
    C = H.Checker("memory")
    binary = H.gs_bin(C)
    tmp = H.scratch("memory")
    model = H.mkmodel(C, binary, os.path.join(tmp, "T0"),
                      extra=["--hidden", "512", "--intermediate", "1536", "--layers", "4", "--heads", "8",
                             "--kv-heads", "4", "--head-dim", "64", "--seed", "5"])
    weight_bytes = sum(len(t.data) for t in W.ckpt(model).values())
    srv = H.Server(C, binary, model, args=["--kv-cache-mb", "64", "--threads", "1"])
    fig = {}
    try:
        C.check(is_sleeping(srv) is False, "is_sleeping at start")
        ref = gen(srv)
        sums = W.checksums(srv, "target")
        # every "identical after wake-up" check compares with these: an error tuple / "_error" here
        # would equal the same error later and pass them all
        C.check(all(isinstance(g, list) and len(g) == 12 for g in ref), "reference generation failed: %r" % (ref,))
        C.check(sums and "_error" not in sums, "reference checksums failed: %r" % (sums,))
        fig["before"] = rss(srv)
        vllm_level1(C, srv, ref, sums, fig)
        vllm_level2(C, srv, model, ref, sums, fig, weight_bytes)
        skyrl_bodies(C, srv, ref)
        sglang(C, srv, model, ref)
        python_client(C, srv, ref)
        sglang_cpu_backup(C, binary, model)
        H.healthy(C, srv, "memory")
        print("VmRSS of the server (weights %.1f MiB, --kv-cache-mb 64):" % (weight_bytes / MB))
        for k, v in fig.items():
            print("  %-34s %7.1f MiB" % (k, v / MB))
    finally:
        H.stop_clean(C, srv)
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
