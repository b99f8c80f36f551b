"""vLLM tokens-in / tokens-out dialect of `graphswap serve` (server/dialects/vllm_generate.c), driven as SkyRL,
prime-rl and AReaL drive vLLM.

Protocol sources (field by field):
  vllm-project/vllm@343bacafc7bf4f973a105e8e7d99fa7de61f7e18 vllm/entrypoints/serve/disagg/protocol.py
      (GenerateRequest / GenerateResponse / GenerateStreamResponse)
  vllm-project/vllm@0001948bc76939369ca855c90b36d81256477e85 vllm/entrypoints/serve/disagg/serving.py
      (request_id "generate-tokens-<id>", max_tokens default = rest of the context, _create_tokens_logprobs,
      stream: a chunk per choice with new tokens, usage chunk, [DONE])
  vllm-project/vllm@063e5a89d54d5e17ded57593252c998889f9eb40 vllm/entrypoints/serve/disagg/api_router.py
Clients replayed:
  NovaSky-AI/SkyRL@a9564572eb8e91076be43c1bd5e4615e3de17265
      skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py (_generate_single, sample,
      get_world_size)
  PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64 src/prime_rl/utils/client.py
      (prefill_logprobs: prompt_logprobs 1, first entry of each dict)
  inclusionAI/AReaL@4aef98d8d818af55b43621aaadba047ae10f4e77 areal/engine/vllm_remote.py (its /v1/completions
      payload with return_tokens_as_token_ids, parsed as AReaL does)
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""

import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402

MAX_LEN = 512
PROMPTS = [[5, 17, 300, 42], [900, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [77]]


def raw(r):
    return json.loads(r.raw.decode(), parse_float=str)


def gen(srv, body):
    return T.post(srv, "/inference/v1/generate", body)


def skyrl_generate(srv, model, ids, sp, cache_salt=None):
    # SkyRL RemoteInferenceClient._generate_single
    payload = {"sampling_params": sp, "model": model, "token_ids": ids}
    if cache_salt is not None:
        payload["cache_salt"] = cache_salt
    r = gen(srv, payload)
    if r.status != 200:
        return r, None
    choice = r.json["choices"][0]
    lps = None
    if choice.get("logprobs") is not None and choice["logprobs"].get("content"):
        lps = [x["logprob"] for x in choice["logprobs"]["content"]]
    return r, {"stop_reason": choice["finish_reason"], "response_ids": choice["token_ids"], "response_logprobs": lps}


def test_skyrl(C, srv, binary, model):
    for i, ids in enumerate(PROMPTS):
        n_tok = [12, 20, 7][i]
        sp = {"max_tokens": n_tok, "temperature": 0.0, "logprobs": 0, "ignore_eos": True}
        r, out = skyrl_generate(srv, model, ids, sp, cache_salt="salt-%d" % i if i else None)
        if not C.check(out is not None, "SkyRL generate %d: %r" % (i, r)):
            continue
        C.check(out["stop_reason"] == "length" and len(out["response_ids"]) == n_tok, "SkyRL answer %r" % out)
        j = r.json
        for k in ("request_id", "model", "created", "choices", "usage", "prompt_logprobs", "kv_transfer_params"):
            C.check(k in j, "response lacks %s" % k)
        C.check(j["request_id"].startswith("generate-tokens-"), "request_id %r" % j["request_id"])
        C.check(j["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids) + n_tok, "completion_tokens": n_tok,
                               "prompt_tokens_details": None}, "usage %r" % j["usage"])
        c0 = j["choices"][0]
        C.check(set(c0) == {"index", "logprobs", "finish_reason", "token_ids", "routed_experts"}, "choice keys %r" % c0)
        ent = c0["logprobs"]["content"][0]
        C.check(ent["token"] == "token_id:%d" % c0["token_ids"][0] and ent["bytes"] is None and
                len(ent["top_logprobs"]) == 1 and ent["top_logprobs"][0]["token"] == ent["token"],
                "logprobs entry %r" % ent)
        o = T.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": n_tok, "temperature": 0, "logprobs": 0,
                                            "ignore_eos": True, "return_token_ids": True})
        if C.check(o.status == 200, "completions %r" % o):
            C.check(o.json["choices"][0]["token_ids"] == out["response_ids"], "generate != completions tokens")
            C.check([x["logprob"] for x in raw(r)["choices"][0]["logprobs"]["content"]] ==
                    raw(o)["choices"][0]["logprobs"]["token_logprobs"], "generate != completions logprobs")
        ref = T.generate_cli(binary, model, ids, n_tok, logprobs=0)
        if C.check(ref is not None, "generate CLI failed"):
            C.check(ref["token_ids"] == out["response_ids"], "generate route != graphswap generate")

    # logprobs null when not asked; top_logprobs: the sampled token first, then max(logprobs, 1) in all
    r, out = skyrl_generate(srv, model, [5, 6], {"max_tokens": 4, "temperature": 0})
    C.check(out is not None and out["response_logprobs"] is None and r.json["choices"][0]["logprobs"] is None,
            "no logprobs: %r" % r)
    r = gen(srv, {"token_ids": [5, 6], "sampling_params": {"max_tokens": 4, "temperature": 0.8, "seed": 1,
                                                            "logprobs": 3}})
    if C.check(r.status == 200, "logprobs 3: %r" % r):
        content = r.json["choices"][0]["logprobs"]["content"]
        C.check(len(content) == 4, "logprobs 3: %d content entries for 4 tokens" % len(content))  # else no row is checked
        for e in content:
            tops = e["top_logprobs"]
            C.check(len(tops) == 3 and tops[0]["token"] == e["token"] and len({t["token"] for t in tops}) == 3,
                    "top_logprobs %r" % tops)

    # SkyRL sample(): n samples, logprobs 0, output_kind FINAL_ONLY, prompt_logprobs
    sp = {"n": 2, "logprobs": 0, "output_kind": 2, "prompt_logprobs": 0, "max_tokens": 5, "temperature": 1.0,
          "seed": 7, "ignore_eos": True}
    r = gen(srv, {"sampling_params": sp, "model": model, "token_ids": [900, 1, 2, 3]})
    if C.check(r.status == 200, "SkyRL sample: %r" % r):
        seqs = [{"tokens": c["token_ids"], "logprobs": [x["logprob"] for x in c["logprobs"]["content"]],
                 "stop_reason": c.get("finish_reason")} for c in r.json["choices"]]
        C.check(len(seqs) == 2 and all(len(s["tokens"]) == 5 and len(s["logprobs"]) == 5 for s in seqs),
                "sample sequences %r" % seqs)
        C.check([c["index"] for c in r.json["choices"]] == [0, 1], "sample indices")
        o = T.post(srv, "/v1/completions", {"prompt": [900, 1, 2, 3], "n": 2, "max_tokens": 5, "temperature": 1.0,
                                            "seed": 7, "ignore_eos": True, "return_token_ids": True})
        C.check([c["token_ids"] for c in o.json["choices"]] == [s["tokens"] for s in seqs], "seeded n=2 != completions")
        pl = r.json["prompt_logprobs"]
        C.check(isinstance(pl, list) and len(pl) == 4 and pl[0] is None and all(isinstance(x, dict) for x in pl[1:]),
                "prompt_logprobs %r" % pl)

    # SkyRL get_world_size
    r = T.get(srv, "/get_world_size")
    C.check(r.status == 200 and r.json.get("world_size") == 1, "/get_world_size: %r" % r)
    r = T.get(srv, "/get_world_size?include_dp=false")
    C.check(r.status == 200 and r.json.get("world_size") == 1, "/get_world_size include_dp: %r" % r)


def test_prime_rl(C, srv, model):
    # prime-rl prefill_logprobs
    ids = [900, 1, 2, 3, 4, 5]
    r = gen(srv, {"model": model, "token_ids": ids,
                  "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": 1}})
    if not C.check(r.status == 200, "prime-rl prefill: %r" % r):
        return
    flat = []
    for entry in raw(r)["prompt_logprobs"] or []:
        if not entry:
            flat.append("0.0")
            continue
        flat.append(next(iter(entry.values()))["logprob"])
    o = T.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 1})
    ref = ["0.0"] + [raw(o)["choices"][0]["prompt_logprobs"][i][str(ids[i])]["logprob"] for i in range(1, len(ids))]
    C.check(len(flat) == len(ids) and flat == ref, "prefill_logprobs %r != completions %r" % (flat, ref))
    first_keys = [next(iter(e)) for e in r.json["prompt_logprobs"][1:]]
    C.check(first_keys == [str(x) for x in ids[1:]], "prompt_logprobs: the prompt token is not first: %r" % first_keys)


def test_areal(C, srv):
    # AReaL VLLMBackend.build_generation_request (a token prompt -> /v1/completions), parse_generation_response
    ids = [5, 17, 300]
    payload = {"top_p": 1.0, "top_k": int(1e8), "max_tokens": 9, "temperature": 0.0, "stop_token_ids": [],
               "ignore_eos": False, "skip_special_tokens": True, "return_tokens_as_token_ids": True, "logprobs": 0,
               "use_beam_search": False, "stream": False, "prompt": list(ids)}
    r = T.post(srv, "/v1/completions", payload)
    if not C.check(r.status == 200, "AReaL vLLM payload: %r" % r):
        return
    meta = r.json["choices"][0]
    toks = [int(t.split(":")[1]) for t in meta["logprobs"]["tokens"]]
    g = gen(srv, {"token_ids": ids, "sampling_params": {"max_tokens": 9, "temperature": 0, "logprobs": 0}})
    C.check(g.status == 200 and g.json["choices"][0]["token_ids"] == toks and
            g.json["choices"][0]["finish_reason"] == meta["finish_reason"], "AReaL completions != generate")


def test_defaults_stream(C, srv):
    # max_tokens omitted: the rest of the context (vLLM serving get_max_tokens)
    r = gen(srv, {"token_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "ignore_eos": True}})
    C.check(r.status == 200 and len(r.json["choices"][0]["token_ids"]) == MAX_LEN - 3, "default max_tokens: %r" % r)
    r = gen(srv, {"request_id": "abc", "token_ids": [5, 6], "sampling_params": {"max_tokens": 2}})
    C.check(r.status == 200 and r.json["request_id"] == "generate-tokens-abc", "request_id: %r" % r)
    # stream: deltas concatenate to the whole answer
    body = {"token_ids": [900, 1, 2], "sampling_params": {"max_tokens": 12, "temperature": 0, "logprobs": 1,
                                                          "ignore_eos": True},
            "stream": True, "stream_options": {"include_usage": True}}
    st, evs, s = T.stream_all(srv, "/inference/v1/generate", body)
    full = gen(srv, dict(body, stream=False))
    if C.check(st == 200 and full.status == 200, "stream %r" % st):
        C.check(evs[-1] == "[DONE]", "stream end %r" % evs[-1:])
        chunks = [e for e in evs if isinstance(e, dict) and e.get("choices")]
        usage = [e for e in evs if isinstance(e, dict) and not e.get("choices")]
        toks = [t for c in chunks for t in c["choices"][0]["token_ids"]]
        lps = [x for c in chunks for x in c["choices"][0]["logprobs"]["content"]]
        C.check(toks == full.json["choices"][0]["token_ids"] and lps == full.json["choices"][0]["logprobs"]["content"],
                "stream != whole answer")
        C.check(all(set(c) == {"request_id", "choices", "usage"} and c["usage"] is None for c in chunks),
                "stream chunk keys")
        fins = [c["choices"][0]["finish_reason"] for c in chunks]
        C.check(fins[-1] == "length" and all(f is None for f in fins[:-1]), "stream finish_reason %r" % fins)
        C.check(len(usage) == 1 and usage[0]["usage"] == {"prompt_tokens": 3, "total_tokens": 15,
                                                          "completion_tokens": 12}, "usage chunk %r" % usage)
        C.check(len({c["request_id"] for c in chunks + usage}) == 1, "request_id changes in the stream")


def test_errors(C, srv, model):
    def bad(body, param, status=400):
        r = gen(srv, body)
        e = (r.json or {}).get("error", {})
        C.check(r.status == status and isinstance(e.get("message"), str) and e.get("code") == status and
                (param is None or e.get("param") == param), "%s -> %r (want %d %s)" % (json.dumps(body)[:100], r,
                                                                                      status, param))
    bad({"sampling_params": {}}, "token_ids")
    bad({"token_ids": [1, 2]}, "sampling_params")
    bad({"token_ids": "12", "sampling_params": {}}, "token_ids")
    bad({"token_ids": [1, 10 ** 7], "sampling_params": {}}, "token_ids")
    bad({"token_ids": [1], "sampling_params": {"max_tokens": 10 ** 5}}, "max_tokens")
    bad({"token_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature")
    bad({"token_ids": [1], "sampling_params": {"structured_outputs": {"regex": "a"}}}, "structured_outputs")
    bad({"token_ids": [1], "sampling_params": {"bad_words": ["x"]}}, "bad_words")
    bad({"token_ids": [1], "sampling_params": {}, "priority": 3}, "priority")
    bad({"token_ids": [1], "sampling_params": {}, "model": "other"}, "model", status=404)
    for k, v in (("presence_penalty", 0.5), ("repetition_penalty", 1.2)):
        r = gen(srv, {"token_ids": [5, 6], "sampling_params": {k: v, "max_tokens": 2}})
        o = T.post(srv, "/v1/completions", {"prompt": [5, 6], k: v, "max_tokens": 2})
        C.check(r.status == o.status, "%s: generate %d vs completions %d" % (k, r.status, o.status))
    r = gen(srv, {"token_ids": [1], "sampling_params": {"max_tokens": 2}, "model": model})
    C.check(r.status == 200, "served model name: %r" % r)


def test_cached_tokens(C, binary, model, srv):
    # usage.prompt_tokens_details: {cached_tokens} with --enable-prompt-tokens-details and a prefix-cache
    # hit, else null (serving.py serve_tokens_full_generator); cache_salt salts the prefix cache.
    ids = [(i * 71 + 13) % 1000 for i in range(50)]  # 3 full 16-token blocks + 2
    sp = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}

    def details(s, salt=None, **extra):
        body = {"token_ids": ids, "sampling_params": dict(sp, **extra)}
        if salt is not None:
            body["cache_salt"] = salt
        r = gen(s, body)
        return r.json["usage"]["prompt_tokens_details"] if r.status == 200 else r

    got = [details(srv), details(srv)]  # the flag is off here: null even on a hit
    C.check(got == [None, None], "prompt_tokens_details without the flag %r" % got)
    d = T.Server(C, binary, model, args=["--max-model-len", str(MAX_LEN), "--enable-prompt-tokens-details"])
    try:
        got = [details(d), details(d)]
        C.check(got == [None, {"cached_tokens": 48}], "prompt_tokens_details of two identical prompts %r" % got)
        C.check(details(d, prompt_logprobs=0) is None, "prompt_logprobs reuses the cache")
        st, evs, _ = T.stream_all(d, "/inference/v1/generate", {"token_ids": ids, "sampling_params": sp, "stream": True,
                                                                "stream_options": {"include_usage": True}})
        u = [e["usage"] for e in evs if isinstance(e, dict) and not e.get("choices")]
        C.check(st == 200 and len(u) == 1 and u[0].get("prompt_tokens_details") == {"cached_tokens": 48},
                "stream usage chunk %r" % u)
        ids = [(i * 37 + 5) % 1000 for i in range(40)]  # 2 full blocks + 8
        got = [details(d, "A"), details(d, "A"), details(d, "B"), details(d), details(d, "B")]
        C.check(got == [None, {"cached_tokens": 32}, None, None, {"cached_tokens": 32}], "cache_salt A A B - B %r" % got)
        for bad in ("", 5, ["A"], "x" * 1025):
            r = gen(d, {"token_ids": ids, "sampling_params": sp, "cache_salt": bad})
            T.error_ok(C, "cache_salt %r" % (bad if not isinstance(bad, str) else bad[:8]), r, 400, "cache_salt")
        r = gen(d, {"token_ids": ids, "sampling_params": sp, "cache_salt": None})
        C.check(r.status == 200 and r.json["usage"]["prompt_tokens_details"] == {"cached_tokens": 32},
                "cache_salt null is no salt: %r" % r)
    finally:
        T.stop_clean(C, d)


def main():
    C = T.Checker("dialect_vllm")
    binary = T.gs_bin(C)
    tmp = T.scratch("dialect_vllm")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model, args=["--max-model-len", str(MAX_LEN)])
    try:
        test_skyrl(C, srv, binary, model)
        test_prime_rl(C, srv, model)
        test_areal(C, srv)
        test_defaults_stream(C, srv)
        test_errors(C, srv, model)
        test_cached_tokens(C, binary, model, srv)
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
