"""HTTP API, part 2: SSE streaming of `graphswap serve`.

  - completions and chat streams: event shapes (text_completion / chat.completion.chunk, first chat
    chunk carries delta.role), one final chunk per choice with finish_reason, usage chunk only with
    stream_options.include_usage, then data: [DONE]; Content-Type text/event-stream
  - the concatenated stream equals the non-streamed response: text, token_ids, logprobs (both APIs),
    usage; also for seeded sampling over several seeds (UTF-8 never split: deltas concatenate to the
    same text, no stray U+FFFD)
  - stop strings: a substring of a greedy output chosen to span a token boundary stops the stream at
    its first occurrence (text cut, excluded or included with include_stop_str_in_output), finish_reason
    "stop", stop_reason = the string, nothing of the stop string leaks into earlier chunks; the same
    non-streaming; chat too
  - n > 1 and string[] batches stream every choice (indices prompt-major)
  - 32 concurrent streaming clients with different prompts and lengths all complete and each greedy
    output equals its sequential run
  - a client that disconnects mid-stream cancels its request: running drops to 0 and
    request_success_total{finished_reason="abort"} increases, long before the request could finish
  - errors before the first token are plain HTTP errors, not SSE
"""

import os
import random
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402


def nonstream(srv, path, body):
    b = dict(body)
    b.pop("stream", None)
    b.pop("stream_options", None)
    return T.post(srv, path, b)


def check_stream_shape(C, what, evs, chat, n_choices, usage):
    if not C.check(evs and evs[-1] == "[DONE]", "%s: stream does not end with [DONE]: %r" % (what, evs[-2:])):
        return
    C.check(evs.count("[DONE]") == 1, "%s: [DONE] more than once" % what)
    obj = "chat.completion.chunk" if chat else "text_completion"
    body = [e for e in evs[:-1]]
    C.check(all(isinstance(e, dict) and e.get("object") == obj and e.get("id") and "created" in e for e in body),
            "%s: chunk without object %s / id: %r" % (what, obj, [e for e in body if e.get("object") != obj][:2]))
    C.check(len(set(e.get("id") for e in body)) == 1, "%s: chunk ids differ" % what)
    finals = {}
    for e in body:
        for ch in e.get("choices", []):
            if ch.get("finish_reason") is not None:
                finals[ch["index"]] = finals.get(ch["index"], 0) + 1
    C.check(sorted(finals) == list(range(n_choices)) and all(v == 1 for v in finals.values()),
            "%s: final chunks per choice: %r" % (what, finals))
    uchunks = [e for e in body if e.get("usage")]
    if usage:
        C.check(len(uchunks) == 1 and uchunks[0] is body[-1] and uchunks[0]["choices"] == [],
                "%s: expected one usage chunk with choices [] last: %r" % (what, uchunks))
    else:
        C.check(not uchunks, "%s: usage chunk without include_usage" % what)
    if chat:
        firsts = {}
        for e in body:
            for ch in e.get("choices", []):
                firsts.setdefault(ch["index"], ch)
        C.check(all(f.get("delta", {}).get("role") == "assistant" for f in firsts.values()),
                "%s: first chat chunk lacks delta.role: %r" % (what, firsts))


def test_stream_vs_full(C, srv):
    # completions, greedy, logprobs + token ids + usage
    body = {"prompt": "Streaming is", "max_tokens": 20, "temperature": 0, "ignore_eos": True, "logprobs": 2,
            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}
    st, evs, s = T.stream_all(srv, "/v1/completions", body)
    if C.check(st == 200, "completions stream status %r" % st):
        C.check(s.headers.get("content-type", "").startswith("text/event-stream"), "stream content-type %r" % s.headers)
        C.check(not s.bad_lines, "stream has non-SSE lines: %r" % s.bad_lines[:3])
        check_stream_shape(C, "completions stream", evs, False, 1, True)
        full = nonstream(srv, "/v1/completions", body).json
        got = T.collect_stream(evs)[0]
        fc = full["choices"][0]
        C.check(got["text"] == fc["text"], "stream text %r != full %r" % (got["text"], fc["text"]))
        C.check(got["token_ids"] == fc["token_ids"], "stream token_ids != full")
        toks = sum((lp["tokens"] for lp in got["logprobs"]), [])
        tlps = sum((lp["token_logprobs"] for lp in got["logprobs"]), [])
        tops = sum((lp["top_logprobs"] for lp in got["logprobs"]), [])
        offs = sum((lp["text_offset"] for lp in got["logprobs"]), [])
        C.check(toks == fc["logprobs"]["tokens"] and tlps == fc["logprobs"]["token_logprobs"] and
                tops == fc["logprobs"]["top_logprobs"] and offs == fc["logprobs"]["text_offset"],
                "stream logprobs != full logprobs")
        C.check(got["finish_reason"] == "length" and got["after_final"] == 0, "stream finish: %r" % got)
        C.check(evs[-2]["usage"] == full["usage"], "usage chunk %r != full usage %r" % (evs[-2]["usage"], full["usage"]))
    # without include_usage
    body2 = {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "stream": True}
    st, evs, _ = T.stream_all(srv, "/v1/completions", body2)
    if C.check(st == 200, "stream no usage status %r" % st):
        check_stream_shape(C, "completions stream (no usage)", evs, False, 1, False)
    # echo in a stream: the first chunk carries the prompt text
    body3 = {"prompt": "Echo me", "max_tokens": 4, "temperature": 0, "stream": True, "echo": True}
    st, evs, _ = T.stream_all(srv, "/v1/completions", body3)
    if C.check(st == 200, "stream echo status %r" % st):
        full = nonstream(srv, "/v1/completions", body3).json
        C.check(T.collect_stream(evs)[0]["text"] == full["choices"][0]["text"], "stream echo text != full")

    # chat, with logprobs and usage
    msgs = [{"role": "user", "content": "Tell me a story"}]
    cb = {"messages": msgs, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": True,
          "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True}}
    st, evs, _ = T.stream_all(srv, "/v1/chat/completions", cb)
    if C.check(st == 200, "chat stream status %r" % st):
        check_stream_shape(C, "chat stream", evs, True, 1, True)
        full = nonstream(srv, "/v1/chat/completions", cb).json
        got = T.collect_stream(evs, chat=True)[0]
        C.check(got["text"] == full["choices"][0]["message"]["content"], "chat stream content != full")
        content = sum((lp["content"] for lp in got["logprobs"]), [])
        C.check(content == full["choices"][0]["logprobs"]["content"], "chat stream logprobs != full")
        C.check(evs[-2]["usage"] == full["usage"], "chat usage chunk != full usage")


def test_sampled_utf8(C, srv):
    """Seeded sampling produces arbitrary byte tokens; deltas must concatenate to the full text."""
    bad = 0
    for seed in range(10):
        body = {"prompt": "\u00dcn\u00efc\u00f6d\u00e9 \u2603 \u65e5\u672c\u8a9e", "max_tokens": 40,
                "temperature": 1.5, "seed": seed, "ignore_eos": True, "stream": True}
        st, evs, _ = T.stream_all(srv, "/v1/completions", body)
        full = nonstream(srv, "/v1/completions", body)
        if st != 200 or full.status != 200:
            C.fail("sampled stream seed %d: status %r / %r" % (seed, st, full.status))
            continue
        got = T.collect_stream(evs)[0]["text"]
        if got != full.json["choices"][0]["text"]:
            bad += 1
            C.fail("seed %d: stream text %r != full text %r" % (seed, got, full.json["choices"][0]["text"]))
    C.check(bad == 0, "sampled streams differing from full responses: %d of 10" % bad)


def pick_stop(text, offsets):
    """A substring of text that starts inside token i and ends inside token i+1 (so it spans a token
    boundary), for the first suitable i after the start; None when there is none."""
    bounds = offsets[1:] + [len(text)]
    for i in range(2, len(offsets) - 2):
        a, b = offsets[i], bounds[i]
        c = bounds[i + 1]
        if b - a >= 2 and c - b >= 1:
            s = text[a + 1:b + 1]
            if s.strip() and "\ufffd" not in s:
                return s
    return None


def test_stop_strings(C, srv):
    found = 0
    for pi, prompt in enumerate([[11, 22, 33, 44], "The weather today", [500, 600, 700], "Numbers: 1, 2, 3"]):
        base = T.post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": 48, "temperature": 0,
                                               "ignore_eos": True, "logprobs": 0})
        if not C.check(base.status == 200, "stop base %d: %r" % (pi, base)):
            continue
        text = base.json["choices"][0]["text"]
        stop = pick_stop(text, base.json["choices"][0]["logprobs"]["text_offset"])
        if stop is None:
            continue
        found += 1
        idx = text.find(stop)
        for include in (False, True):
            exp = text[:idx + len(stop)] if include else text[:idx]
            body = {"prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
                    "stop": ["\u2603never\u2603", stop], "include_stop_str_in_output": include, "stream": True}
            st, evs, _ = T.stream_all(srv, "/v1/completions", body)
            if not C.check(st == 200, "stop stream %d: status %r" % (pi, st)):
                continue
            got = T.collect_stream(evs)[0]
            what = "prompt %d stop %r include=%s" % (pi, stop, include)
            C.check(got["text"] == exp, "%s: stream text %r, expected %r (full %r)" % (what, got["text"], exp, text))
            C.check(got["finish_reason"] == "stop" and got["stop_reason"] == stop,
                    "%s: finish %r stop_reason %r" % (what, got["finish_reason"], got["stop_reason"]))
            # nothing of the stop string may have been shown before the final chunk (when excluded)
            if not include:
                shown = ""
                for e in evs:
                    if isinstance(e, dict):
                        for ch in e.get("choices", []):
                            if ch.get("finish_reason") is None:
                                shown += ch.get("text", "")
                C.check(stop not in shown and len(shown) <= idx, "%s: stop text leaked before the end: %r"
                        % (what, shown))
            full = nonstream(srv, "/v1/completions", body).json["choices"][0]
            C.check(full["text"] == exp and full["finish_reason"] == "stop" and full["stop_reason"] == stop,
                    "%s: non-stream %r / %r / %r" % (what, full["text"], full["finish_reason"], full["stop_reason"]))
        # a stop string that never occurs: full length, unchanged text
        body = {"prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stop": "\u2603zz",
                "stream": True}
        st, evs, _ = T.stream_all(srv, "/v1/completions", body)
        got = T.collect_stream(evs).get(0, {})
        C.check(got.get("text") == text and got.get("finish_reason") == "length" and got.get("stop_reason") is None,
                "absent stop string changed the output: %r" % got)
    C.check(found >= 2, "could find a boundary-spanning stop string in only %d greedy outputs" % found)

    # chat: a stop string from the greedy answer
    msgs = [{"role": "user", "content": "Write something long"}]
    base = T.post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 40, "temperature": 0,
                                                "ignore_eos": True, "logprobs": True})
    if C.check(base.status == 200, "chat stop base: %r" % base):
        content = base.json["choices"][0]["message"]["content"]
        toks = [e["token"] for e in base.json["choices"][0]["logprobs"]["content"]]
        offs, o = [], 0
        for t in toks:
            offs.append(o)
            o += len(t)
        stop = pick_stop(content, offs) if "".join(toks) == content else None
        if stop:
            idx = content.find(stop)
            body = {"messages": msgs, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": stop,
                    "stream": True}
            st, evs, _ = T.stream_all(srv, "/v1/chat/completions", body)
            got = T.collect_stream(evs, chat=True).get(0, {})
            C.check(got.get("text") == content[:idx] and got.get("finish_reason") == "stop" and
                    got.get("stop_reason") == stop, "chat stop stream: %r (expected %r)" % (got, content[:idx]))


def test_n_and_batch_stream(C, srv):
    body = {"prompt": ["alpha beta", "gamma"], "n": 3, "max_tokens": 8, "temperature": 0.8, "seed": 99,
            "ignore_eos": True, "return_token_ids": True, "stream": True}
    st, evs, _ = T.stream_all(srv, "/v1/completions", body)
    if C.check(st == 200, "n=3 batch stream: %r" % st):
        check_stream_shape(C, "n=3 x 2 prompts stream", evs, False, 6, False)
        got = T.collect_stream(evs)
        full = nonstream(srv, "/v1/completions", body).json["choices"]
        for i in range(6):
            C.check(got[i]["text"] == full[i]["text"] and got[i]["token_ids"] == full[i]["token_ids"],
                    "stream choice %d != full choice %d" % (i, i))
    cb = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 6, "temperature": 1, "seed": 5,
          "ignore_eos": True, "stream": True}
    st, evs, _ = T.stream_all(srv, "/v1/chat/completions", cb)
    if C.check(st == 200, "chat n=2 stream: %r" % st):
        check_stream_shape(C, "chat n=2 stream", evs, True, 2, False)


def test_concurrent(C, srv):
    rng = random.Random(4242)
    jobs = []
    for i in range(32):
        ids = [rng.randrange(0, 1000) for _ in range(rng.randrange(1, 40))]
        jobs.append((ids, rng.randrange(4, 48)))
    seq = []
    for ids, mt in jobs:
        r = T.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": mt, "temperature": 0, "ignore_eos": True,
                                            "return_token_ids": True})
        seq.append(r.json["choices"][0]["token_ids"] if r.status == 200 else None)
    results = [None] * len(jobs)
    errors = []
    barrier = threading.Barrier(len(jobs))

    def worker(k):
        ids, mt = jobs[k]
        try:
            barrier.wait(60)
            st, evs, _ = T.stream_all(srv, "/v1/completions", {"prompt": ids, "max_tokens": mt, "temperature": 0,
                                                               "ignore_eos": True, "return_token_ids": True,
                                                               "stream": True})
            results[k] = (st, evs)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            errors.append("client %d: %r" % (k, e))

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(len(jobs))]
    t0 = time.time()
    for t in ths:
        t.start()
    for t in ths:
        t.join(300)
    C.check(not errors, "concurrent clients raised: %r" % errors[:5])
    ok = 0
    for k, res in enumerate(results):
        if res is None:
            C.fail("concurrent client %d did not finish" % k)
            continue
        st, evs = res
        got = T.collect_stream(evs).get(0, {})
        good = st == 200 and evs and evs[-1] == "[DONE]" and got.get("token_ids") == seq[k] and \
            got.get("finish_reason") == "length" and len(got["token_ids"]) == jobs[k][1]
        ok += bool(good)
        C.check(good, "concurrent client %d (prompt %d ids, max_tokens %d): status %r, %r vs sequential %r"
                % (k, len(jobs[k][0]), jobs[k][1], st, got.get("token_ids"), seq[k]))
    print("  32 concurrent streams: %d ok in %.1fs" % (ok, time.time() - t0))


def test_disconnect(C, srv):
    m0 = T.metrics(srv)
    s = T.Stream(srv, "/v1/completions", {"prompt": [9, 8, 7], "max_tokens": 3500, "temperature": 0,
                                          "ignore_eos": True, "stream": True})
    n = 0
    if C.check(s.status == 200, "disconnect stream status %r" % s.status):
        for e in s.events():
            n += 1
            if n >= 3:
                break
    # drop the connection without reading further
    try:
        s.c.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
    t0 = time.time()
    m = T.metrics(srv)
    while time.time() - t0 < 60:
        m = T.metrics(srv)
        if m.get("graphswap:num_requests_running") == 0 and \
                m.get('graphswap:request_success_total{finished_reason="abort"}', 0) > \
                m0.get('graphswap:request_success_total{finished_reason="abort"}', 0):
            break
        time.sleep(0.05)
    ab0 = m0.get('graphswap:request_success_total{finished_reason="abort"}', 0)
    ab1 = m.get('graphswap:request_success_total{finished_reason="abort"}', 0)
    C.check(ab1 == ab0 + 1, "disconnect: abort counter %r -> %r (running %r)"
            % (ab0, ab1, m.get("graphswap:num_requests_running")))
    gen = m.get("graphswap:generation_tokens_total", 0) - m0.get("graphswap:generation_tokens_total", 0)
    C.check(gen < 3500, "disconnect: the request ran to its end (%d tokens) instead of being cancelled" % gen)
    C.check(m.get("graphswap:kv_cache_usage_perc", 1) == 0, "disconnect: KV blocks still in use: %r"
            % m.get("graphswap:kv_cache_usage_perc"))


def test_error_before_first_token(C, srv):
    st, evs, s = T.stream_all(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 0, "stream": True})
    r = T.Resp(st, s.headers, getattr(s, "err_body", b""))
    T.error_ok(C, "stream with max_tokens 0", r, 400, "max_tokens")
    C.check(s.headers.get("content-type", "").startswith("application/json"), "stream error is not JSON")


def main():
    C = T.Checker("http_stream")
    binary = T.gs_bin(C)
    tmp = T.scratch("http_stream")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model)
    try:
        test_stream_vs_full(C, srv)
        test_sampled_utf8(C, srv)
        test_stop_strings(C, srv)
        test_n_and_batch_stream(C, srv)
        test_concurrent(C, srv)
        test_disconnect(C, srv)
        test_error_before_first_token(C, srv)
        T.healthy(C, srv, "after streaming tests")
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
