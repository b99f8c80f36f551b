"""SGLang dialect of `graphswap serve` (server/dialects/sglang_generate.c), driven as slime and AReaL drive SGLang.

Protocol sources (field by field):
  sgl-project/sglang@001067fffe33427bee0ed2f007fb7551a1d76b44 python/sglang/srt/managers/tokenizer_manager.py
      (_handle_batch_output: meta_info keys, cumulative streaming text / output_ids, "Abort before prefill")
  sgl-project/sglang@00c17cafcb9e289d5ca97c50e44ada54e4fd5b03 python/sglang/srt/sampling/sampling_params.py
      (max_new_tokens 128, top_k -1 / 1 << 30, temperature 0 = greedy, verify() messages)
  sgl-project/sglang@9c0549b727fe222444495cea6b369697534d60f0 python/sglang/srt/entrypoints/http_server.py
      (/generate, /abort_request, /get_model_info, /get_server_info, {"error": {"message"}} with 400)
Clients replayed:
  THUDM/slime@624b824a898ab0ec1fcb4d373004c7f3852bf515 slime/rollout/sglang_rollout.py (payload, meta_info reads),
      slime/rollout/sglang_streaming_rollout.py (stream chunks), slime/backends/sglang_utils/server_control.py
      (abort_all + /v1/loads?include=core until idle), slime/backends/sglang_utils/external.py (server info),
      slime/utils/types.py (finish_reason.type, weight_version, cached_tokens, spec counters)
  inclusionAI/AReaL@4aef98d8d818af55b43621aaadba047ae10f4e77 areal/engine/sglang_remote.py
      (build_generation_request / parse_generation_response)
Checks: every field those clients read is there and right; greedy output and logprobs equal the
/v1/completions route's (and `graphswap generate`); batch and n; stop strings / ids; streaming;
prompt logprobs against vLLM's prompt_logprobs; abort (abort_all, by rid, before prefill); errors.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""

import json
import os
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402

PROMPTS = [[5, 17, 300, 42], [900, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [77]]


def raw(r):
    return json.loads(r.raw.decode(), parse_float=str)


def slime_sampling_params(max_new):
    # slime GenerateState.__init__ with --rollout-temperature 0 (greedy), top_p 1, top_k -1
    return dict(temperature=0.0, top_p=1.0, top_k=-1, max_new_tokens=max_new, stop=None, stop_token_ids=None,
                skip_special_tokens=True, no_stop_trim=True, spaces_between_special_tokens=False)


def oai(srv, ids, n_tok, **kw):
    body = {"prompt": ids, "max_tokens": n_tok, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    body.update(kw)
    return T.post(srv, "/v1/completions", body)


def num_requests_from_load(load):
    # slime server_control.py num_requests_from_load
    if isinstance(load, list):
        return sum(num_requests_from_load(x) for x in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return num_requests_from_load(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return load[key]
    return load.get("num_running_reqs", 0) + load.get("num_waiting_reqs", 0)


def test_slime(C, srv, binary, model):
    for i, ids in enumerate(PROMPTS):
        n_tok = [12, 20, 7][i]
        sp = slime_sampling_params(n_tok)
        sp["ignore_eos"] = True
        r = T.post(srv, "/generate", {"sampling_params": sp, "return_logprob": True, "input_ids": ids})
        if not C.check(r.status == 200, "slime /generate %d: %r" % (i, r)):
            continue
        out = r.json
        m = out["meta_info"]
        for k in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version",
                  "output_token_logprobs"):
            C.check(k in m, "meta_info lacks %s: %r" % (k, m))
        C.check(m["finish_reason"] == {"type": "length", "length": n_tok}, "finish_reason %r" % m["finish_reason"])
        C.check(m["prompt_tokens"] == len(ids) and m["completion_tokens"] == n_tok, "token counts %r" % m)
        C.check(isinstance(out["text"], str), "text is not a string")
        toks = [x[1] for x in m["output_token_logprobs"]]
        C.check(toks == out["output_ids"], "output_token_logprobs ids != output_ids")
        C.check(all(len(x) == 3 and x[2] is None for x in m["output_token_logprobs"]),
                "output_token_logprobs entries are not [logprob, id, null]")
        # greedy parity: the OpenAI route and the CLI
        o = oai(srv, ids, n_tok, ignore_eos=True)
        if C.check(o.status == 200, "completions %r" % o):
            ch = o.json["choices"][0]
            C.check(ch["token_ids"] == out["output_ids"], "SGLang output_ids %r != completions %r"
                    % (out["output_ids"], ch["token_ids"]))
            C.check(ch["text"] == out["text"], "SGLang text %r != completions %r" % (out["text"], ch["text"]))
            C.check([x[0] for x in raw(r)["meta_info"]["output_token_logprobs"]] ==
                    raw(o)["choices"][0]["logprobs"]["token_logprobs"], "SGLang logprobs != completions logprobs")
        ref = T.generate_cli(binary, model, ids, n_tok, logprobs=0)
        if C.check(ref is not None, "generate CLI failed"):
            C.check(ref["token_ids"] == out["output_ids"], "SGLang != graphswap generate for %r" % ids)
            C.check([x[0] for x in raw(r)["meta_info"]["output_token_logprobs"]] == ref["logprobs"],
                    "SGLang logprobs != graphswap generate logprobs")

    # max_new_tokens default 128; top_k huge (SGLang's TOP_K_ALL) == -1
    r = T.post(srv, "/generate", {"input_ids": [5, 6], "sampling_params": {"temperature": 0, "ignore_eos": True,
                                                                            "top_k": 1 << 30}})
    C.check(r.status == 200 and r.json["meta_info"]["completion_tokens"] == 128, "default max_new_tokens: %r" % r)
    r2 = T.post(srv, "/generate", {"input_ids": [5, 6], "sampling_params": {"temperature": 0.7, "ignore_eos": True,
                                                                             "top_k": -1, "sampling_seed": 3,
                                                                             "max_new_tokens": 9}})
    r3 = T.post(srv, "/generate", {"input_ids": [5, 6], "sampling_params": {"temperature": 0.7, "ignore_eos": True,
                                                                             "top_k": 10 ** 12, "sampling_seed": 3,
                                                                             "max_new_tokens": 9}})
    o = T.post(srv, "/v1/completions", {"prompt": [5, 6], "temperature": 0.7, "seed": 3, "max_tokens": 9,
                                        "ignore_eos": True, "return_token_ids": True})
    if C.check(r2.status == 200 and r3.status == 200 and o.status == 200, "seeded: %r %r %r" % (r2, r3, o)):
        C.check(r2.json["output_ids"] == r3.json["output_ids"] == o.json["choices"][0]["token_ids"],
                "seeded sampling: top_k -1 / 1e12 / completions differ")

    # slime server info, model info, loads, health_generate
    for path in ("/server_info", "/get_server_info"):
        r = T.get(srv, path)
        if C.check(r.status == 200, "%s: %r" % (path, r)):
            info = r.json
            C.check(int(info.get("tp_size") or 1) == 1 and int(info.get("pp_size") or 1) == 1 and
                    info.get("disaggregation_mode") not in ("prefill", "decode") and not info.get("encoder_only"),
                    "%s topology fields: %r" % (path, info))
            C.check(info.get("context_length") and info.get("model_path") == model, "%s model fields" % path)
    for path in ("/get_model_info", "/model_info"):
        r = T.get(srv, path)
        C.check(r.status == 200 and r.json["is_generation"] is True and r.json["model_path"] == model,
                "%s: %r" % (path, r))
    r = T.get(srv, "/v1/loads?include=core")
    C.check(r.status == 200 and num_requests_from_load(r.json) == 0 and r.json["loads"][0]["num_running_reqs"] == 0,
            "/v1/loads idle: %r" % r)
    r = T.get(srv, "/health_generate")
    C.check(r.status == 200, "/health_generate: %r" % r)


def test_areal(C, srv):
    # AReaL SGLangBackend.build_generation_request (greedy), then parse_generation_response
    ids = [900, 1, 2, 3]
    payload = {"input_ids": list(ids), "image_data": None,
               "sampling_params": {"top_p": 1.0, "top_k": int(1e8), "max_new_tokens": 10, "temperature": 0.0,
                                   "stop_token_ids": [], "ignore_eos": False, "skip_special_tokens": True,
                                   "frequency_penalty": 0.0},
               "return_logprob": True, "stream": False}
    r = T.post(srv, "/generate", payload)
    if not C.check(r.status == 200, "AReaL /generate: %r" % r):
        return
    m = r.json["meta_info"]
    fr = m["finish_reason"]
    C.check(fr["type"] in ("stop", "length") and isinstance(fr.get("message", ""), str), "finish_reason %r" % fr)
    toks = [x[1] for x in m["output_token_logprobs"]]
    o = oai(srv, ids, 10)
    C.check(o.status == 200 and o.json["choices"][0]["token_ids"] == toks, "AReaL greedy != completions")
    if fr["type"] == "stop":
        C.check(fr.get("matched") == toks[-1], "eos stop: matched %r, last token %r" % (fr.get("matched"), toks[-1]))


def test_text_batch_n(C, srv):
    # text prompt == /v1/completions string prompt (both add the model's special tokens)
    r = T.post(srv, "/generate", {"text": "The cat sat", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    o = T.post(srv, "/v1/completions", {"prompt": "The cat sat", "max_tokens": 8, "temperature": 0,
                                        "return_token_ids": True})
    if C.check(r.status == 200 and o.status == 200, "text: %r %r" % (r, o)):
        C.check(r.json["output_ids"] == o.json["choices"][0]["token_ids"] and r.json["text"] ==
                o.json["choices"][0]["text"], "text prompt != completions")
        C.check(r.json["meta_info"]["prompt_tokens"] == o.json["usage"]["prompt_tokens"], "prompt_tokens differ")
        C.check("output_token_logprobs" not in r.json["meta_info"], "logprobs without return_logprob")
    # batch: a list of answers, each as the single request
    sp = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = T.post(srv, "/generate", {"input_ids": PROMPTS, "sampling_params": sp, "rid": ["a", "b", "c"]})
    if C.check(r.status == 200 and isinstance(r.json, list) and len(r.json) == 3, "batch: %r" % r):
        for i, ids in enumerate(PROMPTS):
            one = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": sp})
            C.check(one.json["output_ids"] == r.json[i]["output_ids"], "batch[%d] != single" % i)
            C.check(r.json[i]["meta_info"]["id"] == "abc"[i], "batch rid %d: %r" % (i, r.json[i]["meta_info"]["id"]))
    r = T.post(srv, "/generate", {"text": ["The cat", "A dog"], "sampling_params": sp})
    C.check(r.status == 200 and len(r.json) == 2, "text batch: %r" % r)
    # n > 1 with a seed: a list of n, sample i == seed + i (the native rule)
    sp = {"max_new_tokens": 6, "temperature": 1.0, "n": 2, "sampling_seed": 11, "ignore_eos": True}
    r = T.post(srv, "/generate", {"input_ids": [5, 6, 7], "sampling_params": sp})
    o = T.post(srv, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 1.0, "n": 2, "seed": 11,
                                        "ignore_eos": True, "return_token_ids": True})
    if C.check(r.status == 200 and isinstance(r.json, list) and len(r.json) == 2, "n=2: %r" % r):
        C.check([x["output_ids"] for x in r.json] == [c["token_ids"] for c in o.json["choices"]], "n=2 != completions")
        C.check(r.json[0]["meta_info"]["id"] != r.json[1]["meta_info"]["id"], "n=2 ids not distinct")


def test_stops(C, srv):
    base = T.post(srv, "/generate", {"input_ids": [5, 17, 300], "sampling_params": {"max_new_tokens": 24,
                                                                                     "temperature": 0,
                                                                                     "ignore_eos": True}})
    if not C.check(base.status == 200, "stop base %r" % base):
        return
    text, ids = base.json["text"], base.json["output_ids"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    if stop.strip():
        for trim in (False, True):
            sp = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop], "no_stop_trim": trim}
            r = T.post(srv, "/generate", {"input_ids": [5, 17, 300], "sampling_params": sp})
            o = T.post(srv, "/v1/completions", {"prompt": [5, 17, 300], "max_tokens": 24, "temperature": 0,
                                                "ignore_eos": True, "stop": [stop], "include_stop_str_in_output": trim})
            if C.check(r.status == 200, "stop %r: %r" % (stop, r)):
                fr = r.json["meta_info"]["finish_reason"]
                C.check(fr == {"type": "stop", "matched": stop}, "stop string finish_reason %r" % fr)
                C.check(r.json["text"] == o.json["choices"][0]["text"], "no_stop_trim=%s text != completions" % trim)
                C.check(r.json["text"].endswith(stop) == trim, "no_stop_trim=%s: %r" % (trim, r.json["text"]))
    k = 5
    sp = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "stop_token_ids": [ids[k]]}
    r = T.post(srv, "/generate", {"input_ids": [5, 17, 300], "sampling_params": sp})
    if C.check(r.status == 200, "stop_token_ids %r" % r):
        first = ids.index(ids[k])
        C.check(r.json["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[k]},
                "stop id finish_reason %r" % r.json["meta_info"]["finish_reason"])
        C.check(r.json["output_ids"] == ids[:first + 1], "stop id output_ids %r" % r.json["output_ids"])


def test_stream(C, srv):
    # slime sglang_streaming_rollout.generate: data: lines, cumulative text / output_token_logprobs
    body = {"input_ids": [900, 1, 2], "sampling_params": dict(slime_sampling_params(15), ignore_eos=True),
            "return_logprob": True, "stream": True}
    st, evs, s = T.stream_all(srv, "/generate", body)
    if not C.check(st == 200 and s.headers.get("content-type", "").startswith("text/event-stream"),
                   "stream status %r" % st):
        return
    C.check(evs and evs[-1] == "[DONE]", "stream does not end with [DONE]")
    chunks = [e for e in evs if isinstance(e, dict)]
    # how many chunks 15 tokens make is timing (a fast engine may publish them all before the first
    # snapshot): the cumulative shape is checked on whatever came; incremental delivery below
    C.check(len(chunks) >= 1, "stream has no chunk")
    fins = [c["meta_info"].get("finish_reason") for c in chunks]
    C.check(all(f is None for f in fins[:-1]) and fins[-1] == {"type": "length", "length": 15},
            "stream finish_reason sequence %r" % fins)
    prev = 0
    for c in chunks:
        n = len(c["meta_info"]["output_token_logprobs"])
        C.check(n >= prev and c["output_ids"] == [x[1] for x in c["meta_info"]["output_token_logprobs"]],
                "stream chunks not cumulative")
        prev = n
    # incremental delivery: a long generation reaches the client in more than one chunk
    long_body = dict(body, sampling_params=dict(slime_sampling_params(1000), ignore_eos=True), return_logprob=False)
    lst, levs, _ = T.stream_all(srv, "/generate", long_body)
    lchunks = [e for e in levs if isinstance(e, dict)]
    C.check(lst == 200 and len(lchunks) >= 2, "a 1000-token stream came in %d chunk(s)" % len(lchunks))
    full = T.post(srv, "/generate", dict(body, stream=False))
    last = chunks[-1]
    C.check(last["text"] == full.json["text"] and last["output_ids"] == full.json["output_ids"] and
            last["meta_info"]["output_token_logprobs"] == full.json["meta_info"]["output_token_logprobs"],
            "final stream chunk != non-streamed answer")
    C.check(all(c["text"] == last["text"][:len(c["text"])] for c in chunks), "stream text not cumulative prefixes")


def test_prompt_logprobs(C, srv):
    ids = [900, 1, 2, 3, 4]
    r = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                                  "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2})
    o = T.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0, "prompt_logprobs": 2})
    if not C.check(r.status == 200 and o.status == 200, "prompt logprobs %r %r" % (r, o)):
        return
    m, mr = r.json["meta_info"], raw(r)["meta_info"]
    inp = m["input_token_logprobs"]
    C.check(len(inp) == len(ids) and [x[1] for x in inp] == ids and inp[0][0] is None, "input_token_logprobs %r" % inp)
    vl = raw(o)["choices"][0]["prompt_logprobs"]
    C.check([x[0] for x in mr["input_token_logprobs"][1:]] == [vl[i][str(ids[i])]["logprob"] for i in range(1, len(ids))],
            "input_token_logprobs != vLLM prompt_logprobs")
    C.check(m["input_top_logprobs"][0] is None and len(m["input_top_logprobs"][1]) == 2 and
            len(m["output_top_logprobs"]) == 3 and len(m["output_top_logprobs"][0]) == 2, "top logprobs shapes")
    r = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
                                  "logprob_start_len": 3})
    C.check(r.status == 200 and len(r.json["meta_info"]["input_token_logprobs"]) == 2, "logprob_start_len 3: %r" % r)
    r = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}, "return_logprob": True})
    C.check(r.status == 200 and r.json["meta_info"]["input_token_logprobs"] == [], "logprob_start_len -1: %r" % r)
    r = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
                                  "return_text_in_logprobs": True})
    C.check(r.status == 200 and all(isinstance(x[2], str) for x in r.json["meta_info"]["output_token_logprobs"]),
            "return_text_in_logprobs: %r" % r)


def test_cached_tokens(C, srv):
    # meta_info.cached_tokens: the prompt tokens taken from the prefix cache (full 16-token blocks shared at
    # admission; the last prompt token is always computed). A prompt-logprobs request never reuses the cache.
    ids = [(i * 53 + 29) % 1000 for i in range(50)]  # 3 full blocks + 2
    sp = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    got = []
    for _ in range(2):
        r = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": sp})
        got.append(r.json["meta_info"]["cached_tokens"] if r.status == 200 else r)
    C.check(got == [0, 48], "cached_tokens of two identical prompts %r" % got)
    r = T.post(srv, "/generate", {"input_ids": ids, "sampling_params": sp, "return_logprob": True,
                                  "logprob_start_len": 0})
    C.check(r.status == 200 and r.json["meta_info"]["cached_tokens"] == 0, "prompt logprobs cached_tokens %r" % r)
    _, evs, _ = T.stream_all(srv, "/generate", {"input_ids": ids, "sampling_params": sp, "stream": True})
    last = [e for e in evs if isinstance(e, dict)][-1:]
    C.check(last and last[0]["meta_info"]["cached_tokens"] == 48, "stream cached_tokens %r" % last)


def long_request(srv, out, key, body):
    def run():
        out[key] = T.post(srv, "/generate", body)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_running(srv, n, limit=20):
    t0 = time.time()
    while time.time() - t0 < limit:
        r = T.get(srv, "/v1/loads?include=core")
        if r.status == 200 and r.json["loads"][0]["num_running_reqs"] >= n:
            return True
        time.sleep(0.02)
    return False


def start_together(C, srv, out, bodies, what):
    """Starts one thread per (key, body), queued behind a pause so that they run together however late
    a loaded machine starts any thread, then waits until all are running."""
    C.check(T.post(srv, "/pause_generation", {"mode": "in_place"}).status == 200, "pause before " + what)
    ts = [long_request(srv, out, k, b) for k, b in bodies]
    t0 = time.time()
    while (time.time() - t0 < 20 and
           T.get(srv, "/v1/loads?include=core").json["loads"][0]["num_waiting_reqs"] < len(bodies)):
        time.sleep(0.02)
    C.check(T.post(srv, "/continue_generation", {}).status == 200, "continue before " + what)
    C.check(wait_running(srv, len(bodies)), what + ": requests never ran")
    return ts


def test_abort(C, srv):
    big = {"max_new_tokens": 3500, "ignore_eos": True, "temperature": 0}
    # slime abort(): abort_all, then /v1/loads until idle
    out = {}
    ts = start_together(C, srv, out, [(i, {"input_ids": [5, 6, i + 1], "sampling_params": big, "return_logprob": True})
                                      for i in range(2)], "abort_all")
    r = T.post(srv, "/abort_request", {"abort_all": True})
    C.check(r.status == 200, "abort_all: %r" % r)
    for t in ts:
        t.join(60)
    for i in range(2):
        res = out.get(i)
        if C.check(res is not None and res.status == 200, "aborted request %d: %r" % (i, res)):
            m = res.json["meta_info"]
            C.check(m["finish_reason"]["type"] == "abort", "abort_all finish_reason %r" % m["finish_reason"])
            C.check(0 < m["completion_tokens"] < 3500 and len(m["output_token_logprobs"]) == m["completion_tokens"],
                    "aborted completion_tokens %r" % m["completion_tokens"])
    t0 = time.time()
    while time.time() - t0 < 10 and num_requests_from_load(T.get(srv, "/v1/loads?include=core").json) > 0:
        time.sleep(0.05)
    C.check(num_requests_from_load(T.get(srv, "/v1/loads?include=core").json) == 0, "not idle after abort_all")

    # by rid: only that request ends (slime agent adapters: {"rid": rid}). Both are
    # long (a short keeper could finish before a loaded machine's poll saw the two running: a CI
    # flake); the keeper must still be running once the victim has returned, then ends by its own rid.
    out = {}
    ta, tb = start_together(C, srv, out, [("a", {"input_ids": [5, 6], "sampling_params": big, "rid": "victim-1"}),
                                          ("b", {"input_ids": [5, 7], "sampling_params": big, "rid": "keeper-1"})],
                            "the rid case")
    C.check(T.post(srv, "/abort_request", {"rid": "victim-1"}).status == 200, "abort rid")
    ta.join(60)
    keeper_alive = tb.is_alive()
    C.check(keeper_alive, "the keeper ended with the victim: %r" % out.get("b"))
    C.check(T.post(srv, "/abort_request", {"rid": "keeper-1"}).status == 200, "abort keeper rid")
    tb.join(60)
    a, b = out.get("a"), out.get("b")
    for res, rid in ((a, "victim-1"), (b, "keeper-1")):
        C.check(res is not None and res.status == 200 and
                res.json["meta_info"]["finish_reason"]["type"] == "abort" and
                res.json["meta_info"]["id"] == rid and
                0 < res.json["meta_info"]["completion_tokens"] < 3500, "rid abort of %s: %r" % (rid, res))
    if a is not None and b is not None and a.status == 200 and b.status == 200:
        C.check(b.json["meta_info"]["completion_tokens"] > a.json["meta_info"]["completion_tokens"],
                "the keeper decoded past the victim's abort: %r / %r" %
                (a.json["meta_info"]["completion_tokens"], b.json["meta_info"]["completion_tokens"]))
    C.check(T.post(srv, "/abort_request", {"rid": "no-such-rid"}).status == 200, "abort of an unknown rid")

    # before prefill (AReaL resubmits on "Abort before prefill"): generation paused, request queued
    p = T.post(srv, "/pause_generation", {"mode": "in_place"})
    if C.check(p.status == 200, "pause_generation: %r" % p):
        out = {}
        t = long_request(srv, out, "q", {"input_ids": [5, 8], "sampling_params": big, "rid": "queued-1",
                                         "return_logprob": True})
        time.sleep(0.3)
        T.post(srv, "/abort_request", {"rid": "queued-1"})
        T.post(srv, "/continue_generation", {})
        t.join(60)
        q = out.get("q")
        if C.check(q is not None and q.status == 200, "queued abort: %r" % q):
            fr = q.json["meta_info"]["finish_reason"]
            C.check(fr["type"] == "abort" and fr.get("message", "").startswith("Abort before prefill") and
                    q.json["output_ids"] == [], "abort before prefill: %r" % q.json)
    else:
        T.post(srv, "/continue_generation", {})

    # a streamed request aborted: its last chunk carries the abort
    out = {}

    def run_stream():
        out["s"] = T.stream_all(srv, "/generate", {"input_ids": [5, 9], "sampling_params": big, "stream": True,
                                                   "rid": "stream-1", "return_logprob": True})
    t = threading.Thread(target=run_stream, daemon=True)
    t.start()
    C.check(wait_running(srv, 1), "stream never ran")
    time.sleep(0.1)
    T.post(srv, "/abort_request", {"rid": "stream-1"})
    t.join(60)
    st, evs, _ = out.get("s", (None, [], None))
    chunks = [e for e in evs if isinstance(e, dict)]
    C.check(st == 200 and chunks and chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort" and
            evs[-1] == "[DONE]", "aborted stream: %r" % (chunks[-1] if chunks else evs))


def test_errors(C, srv):
    def bad(body, param, status=400, path="/generate"):
        r = T.post(srv, path, body)
        ok = r.status == status and isinstance(r.json, dict) and isinstance(r.json.get("error", {}).get("message"), str)
        C.check(ok and (param is None or r.json["error"].get("param") == param), "%s -> %r (want %d %s)"
                % (json.dumps(body)[:120], r, status, param))
    bad({"sampling_params": {}}, "input_ids")
    bad({"input_ids": [1], "text": "x"}, "text")
    bad({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k")
    bad({"input_ids": [1], "sampling_params": {"top_k": -2}}, "top_k")
    bad({"input_ids": [1], "sampling_params": {"max_new_tokens": 10 ** 6}}, "max_new_tokens")
    bad({"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}}, "max_new_tokens")
    bad({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature")
    bad({"input_ids": [1], "sampling_params": {"regex": "a+"}}, "regex")
    bad({"input_ids": [1], "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 4}}, "min_new_tokens")
    bad({"input_ids": [1, 10 ** 7]}, "input_ids")
    bad({"input_ids": [1], "image_data": ["x.png"]}, "image_data")
    bad({"input_ids": [1], "lora_path": "a"}, "lora_path")
    bad({"input_ids": [1], "return_logprob": True, "logprob_start_len": 5}, "logprob_start_len")
    bad({"input_ids": [1], "stream": "yes"}, "stream")
    bad({"rid": 5}, "rid", path="/abort_request")
    r = T.post(srv, "/generate", "{not json")
    C.check(r.status == 400 and "error" in (r.json or {}), "bad JSON: %r" % r)
    # penalties: the same one rule as /v1/completions (refused until implemented, then accepted by both)
    for k, v in (("presence_penalty", 0.5), ("frequency_penalty", 0.5), ("repetition_penalty", 1.2)):
        r = T.post(srv, "/generate", {"input_ids": [5, 6], "sampling_params": {k: v, "max_new_tokens": 2}})
        o = T.post(srv, "/v1/completions", {"prompt": [5, 6], k: v, "max_tokens": 2})
        C.check(r.status == o.status, "%s: /generate %d vs /v1/completions %d" % (k, r.status, o.status))
        if r.status == 400:
            C.check(r.json["error"]["param"] == k, "%s refusal param %r" % (k, r.json["error"]))
    r = T.post(srv, "/generate", {"input_ids": [5, 6], "sampling_params": {"frequency_penalty": 0.0,
                                                                            "presence_penalty": 0.0,
                                                                            "repetition_penalty": 1.0,
                                                                            "max_new_tokens": 2}})
    C.check(r.status == 200, "neutral penalties: %r" % r)


def test_spec(C, binary, tmp):
    # with a drafter: slime types.py SpecInfo reads spec_accept_token_num / spec_draft_token_num /
    # spec_verify_ct (sglang _calculate_spec_decoding_metrics); they equal the native usage.spec counters
    Tm = T.mkmodel(C, binary, os.path.join(tmp, "T"), vocab=1024, extra=["--layers", "3", "--seed", "21"])
    D = os.path.join(tmp, "D")
    p = T.subprocess.run([binary, "mkmodel", "--arch", "dspark", "--target", Tm, "--out", D, "--block-size", "5",
                          "--markov-rank", "8", "--seed", "22"], capture_output=True)
    if not C.check(p.returncode == 0, "mkmodel dspark: %s" % p.stderr):
        return
    srv = T.Server(C, binary, Tm, args=["--draft", D])
    try:
        for ids in ([5, 6, 7, 8], [42] * 20):
            r = T.post(srv, "/generate", {"input_ids": ids, "return_logprob": True,
                                          "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                              "ignore_eos": True}})
            o = T.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                                                "return_token_ids": True})
            if not C.check(r.status == 200 and o.status == 200, "spec: %r %r" % (r, o)):
                continue
            m, us = r.json["meta_info"], o.json["usage"]["spec"]
            C.check(r.json["output_ids"] == o.json["choices"][0]["token_ids"], "spec: /generate != completions")
            C.check(m.get("spec_verify_ct") == us["drafts"] and m.get("spec_accept_token_num") == us["accepted_tokens"]
                    and m.get("spec_draft_token_num") == us["draft_tokens"], "spec counters %r vs %r" % (m, us))
            C.check(us["drafts"] > 0 and abs(m["spec_accept_length"] - 24.0 / us["drafts"]) < 1e-9 and
                    abs(m["spec_accept_rate"] - us["accepted_tokens"] / us["draft_tokens"]) < 1e-9,
                    "spec_accept_length / rate %r" % m)
    finally:
        T.stop_clean(C, srv)


def main():
    C = T.Checker("dialect_sglang")
    binary = T.gs_bin(C)
    tmp = T.scratch("dialect_sglang")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model)
    try:
        test_slime(C, srv, binary, model)
        test_areal(C, srv)
        test_text_batch_n(C, srv)
        test_stops(C, srv)
        test_stream(C, srv)
        test_prompt_logprobs(C, srv)
        test_cached_tokens(C, srv)
        test_abort(C, srv)
        test_errors(C, srv)
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    try:
        test_spec(C, binary, tmp)
    finally:
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
