"""TRL `trl vllm-serve` dialect of `graphswap serve` (server/dialects/trl_generate.c), driven as TRL's VLLMClient.

Protocol sources (field by field):
  huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8 trl/scripts/vllm_serve.py (routes with trailing
      slashes, GenerateRequest / ChatRequest defaults, generation_kwargs override, response fields)
  huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8 trl/generation/vllm_generation.py (extract_logprobs:
      per token the ids sorted by rank, the sampled one among them)
Client replayed:
  huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8 trl/generation/vllm_client.py (check_server
      GET /health/, generate / chat payloads and the keys read back, init_communicator's GET
      /get_world_size/ "world_size", reset_prefix_cache POST /reset_prefix_cache/)
Checks: fields right; greedy completion_ids and logprobs equal /v1/completions and /v1/chat/completions;
n and seeds; logprobs > 0 shape; trailing-slash routes are distinct from the other dialects' routes;
errors are FastAPI's 422 {"detail": [...]}.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""

import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402


def raw(r):
    return json.loads(r.raw.decode(), parse_float=str)


def client_generate(srv, prompts, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                    max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None):
    # VLLMClient.generate: the body it posts, the keys it reads
    r = T.post(srv, "/generate/", {"prompts": prompts, "images": None, "n": n, "repetition_penalty": repetition_penalty,
                                   "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                                   "max_tokens": max_tokens, "logprobs": logprobs,
                                   "structured_outputs_regex": structured_outputs_regex,
                                   "generation_kwargs": generation_kwargs or {}})
    if r.status != 200:
        return r, None
    j = r.json
    return r, {"prompt_ids": j["prompt_ids"], "completion_ids": j["completion_ids"], "logprobs": j["logprobs"],
               "logprob_token_ids": j["logprob_token_ids"]}


def test_generate(C, srv):
    # VLLMClient.check_server
    r = T.get(srv, "/health/")
    C.check(r.status == 200 and r.json == {"status": "ok"}, "/health/: %r" % r)
    # init_communicator reads world_size first
    r = T.get(srv, "/get_world_size/")
    C.check(r.status == 200 and r.json.get("world_size") == 1, "/get_world_size/: %r" % r)

    prompts = [[5, 17, 300, 42], [900, 1, 2]]
    r, out = client_generate(srv, prompts, temperature=0.0, max_tokens=10,
                             generation_kwargs={"ignore_eos": True})
    if C.check(out is not None, "generate/ token prompts: %r" % r):
        C.check(out["prompt_ids"] == prompts, "prompt_ids %r" % out["prompt_ids"])
        C.check(len(out["completion_ids"]) == 2 and all(len(c) == 10 for c in out["completion_ids"]),
                "completion_ids %r" % out["completion_ids"])
        C.check(all(len(t) == 1 for s in out["logprobs"] for t in s) and
                [[t[0] for t in s] for s in out["logprob_token_ids"]] == out["completion_ids"],
                "logprobs 0: one entry per token, the sampled id")
        for i, p in enumerate(prompts):
            o = T.post(srv, "/v1/completions", {"prompt": p, "max_tokens": 10, "temperature": 0, "logprobs": 0,
                                                "ignore_eos": True, "return_token_ids": True})
            C.check(o.json["choices"][0]["token_ids"] == out["completion_ids"][i], "generate/ != completions %d" % i)
            C.check([t[0] for t in raw(r)["logprobs"][i]] == raw(o)["choices"][0]["logprobs"]["token_logprobs"],
                    "generate/ logprobs != completions %d" % i)

    # string prompts (tokenized with the special tokens, as vLLM's {"prompt": str})
    r, out = client_generate(srv, ["The cat sat", "A dog"], temperature=0.0, max_tokens=6)
    if C.check(out is not None, "generate/ strings: %r" % r):
        t = T.post(srv, "/tokenize", {"prompt": "The cat sat"})
        C.check(out["prompt_ids"][0] == t.json["tokens"], "string prompt_ids != /tokenize")
        o = T.post(srv, "/v1/completions", {"prompt": "The cat sat", "max_tokens": 6, "temperature": 0,
                                            "return_token_ids": True})
        C.check(o.json["choices"][0]["token_ids"] == out["completion_ids"][0], "string prompt != completions")

    # n > 1: completions prompt-major, n each; a seed from generation_kwargs
    r, out = client_generate(srv, [[5, 6], [7, 8]], n=3, temperature=1.0, max_tokens=5,
                             generation_kwargs={"seed": 5, "ignore_eos": True})
    if C.check(out is not None, "n=3: %r" % r):
        C.check(len(out["completion_ids"]) == 6 and len(out["prompt_ids"]) == 2, "n=3 shapes")
        o = T.post(srv, "/v1/completions", {"prompt": [[5, 6], [7, 8]], "n": 3, "max_tokens": 5, "temperature": 1.0,
                                            "seed": 5, "ignore_eos": True, "return_token_ids": True})
        C.check([c["token_ids"] for c in o.json["choices"]] == out["completion_ids"], "n=3 != completions")

    # generation_kwargs override the named fields
    r, a = client_generate(srv, [[5, 6]], temperature=1.0, max_tokens=30, generation_kwargs={"max_tokens": 4,
                                                                                              "ignore_eos": True})
    C.check(a is not None and len(a["completion_ids"][0]) == 4, "generation_kwargs override: %r" % r)

    # logprobs N > 0: sorted by rank, N entries (+1 when the sampled token is not among them)
    r, out = client_generate(srv, [[5, 6, 7]], temperature=1.0, max_tokens=12, logprobs=2,
                             generation_kwargs={"seed": 3, "ignore_eos": True})
    if C.check(out is not None, "logprobs 2: %r" % r):
        # zip() stops at the shortest list: without this, missing rows would skip the row checks
        C.check(len(out["logprobs"][0]) == len(out["logprob_token_ids"][0]) == len(out["completion_ids"][0]) == 12,
                "logprobs 2: one row per completion token: %r" % (out,))
        for lp, ids, tok in zip(out["logprobs"][0], out["logprob_token_ids"][0], out["completion_ids"][0]):
            C.check(len(lp) == len(ids) and len(lp) in (2, 3) and tok in ids and
                    all(lp[k] >= lp[k + 1] for k in range(len(lp) - 1)), "logprobs row %r %r (token %d)" % (lp, ids, tok))
            C.check(len(lp) == 2 or ids[-1] == tok, "sampled token outside the top N is not last")
    # logprobs None: null
    r = T.post(srv, "/generate/", {"prompts": [[5, 6]], "max_tokens": 2, "logprobs": None})
    C.check(r.status == 200 and r.json["logprobs"] is None and r.json["logprob_token_ids"] is None,
            "logprobs None: %r" % r)
    # defaults (GenerateRequest): max_tokens 16
    r = T.post(srv, "/generate/", {"prompts": [[5, 6]], "generation_kwargs": {"ignore_eos": True}})
    C.check(r.status == 200 and len(r.json["completion_ids"][0]) == 16, "default max_tokens: %r" % r)

    # reset_prefix_cache (loopback: the admin rule lets it through)
    r = T.post(srv, "/reset_prefix_cache/", None)
    C.check(r.status == 200, "/reset_prefix_cache/: %r" % r)


def test_chat(C, srv):
    convs = [[{"role": "user", "content": "Hello there"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
    r = T.post(srv, "/chat/", {"messages": convs, "n": 1, "repetition_penalty": 1.0, "temperature": 0.0, "top_p": 1.0,
                               "top_k": 0, "min_p": 0.0, "max_tokens": 8, "logprobs": 0,
                               "structured_outputs_regex": None, "generation_kwargs": {}, "chat_template_kwargs": {},
                               "tools": None})
    if not C.check(r.status == 200, "chat/: %r" % r):
        return
    j = r.json
    C.check(len(j["prompt_ids"]) == 2 and len(j["completion_ids"]) == 2, "chat/ shapes %r" % j)
    for i, conv in enumerate(convs):
        o = T.post(srv, "/v1/chat/completions", {"messages": conv, "max_tokens": 8, "temperature": 0,
                                                 "return_token_ids": True, "logprobs": True})
        if C.check(o.status == 200, "chat completions %r" % o):
            C.check(o.json["prompt_token_ids"] == j["prompt_ids"][i], "chat/ prompt_ids != chat completions")
            C.check(o.json["choices"][0]["token_ids"] == j["completion_ids"][i], "chat/ completion != chat completions")
            C.check([t[0] for t in raw(r)["logprobs"][i]] ==
                    [x["logprob"] for x in raw(o)["choices"][0]["logprobs"]["content"]], "chat/ logprobs differ")


def test_routes_errors(C, srv):
    # trailing slashes are TRL's own routes: the other dialects' paths answer in their shapes
    r = T.get(srv, "/health")
    C.check(r.status == 200 and "weights" in (r.json or {}), "/health (native) %r" % r)
    r = T.post(srv, "/generate/", {"input_ids": [1, 2], "sampling_params": {}})
    C.check(r.status == 422 and isinstance(r.json.get("detail"), list), "SGLang body on /generate/: %r" % r)
    r = T.post(srv, "/generate", {"prompts": [[1, 2]]})
    C.check(r.status == 400 and "error" in r.json, "TRL body on /generate (SGLang): %r" % r)

    def bad(path, body, loc):
        r = T.post(srv, path, body)
        d = (r.json or {}).get("detail")
        C.check(r.status == 422 and isinstance(d, list) and d and isinstance(d[0].get("msg"), str) and
                d[0].get("loc") == ["body", loc], "%s %s -> %r (want 422 %s)" % (path, json.dumps(body)[:90], r, loc))
    bad("/generate/", {}, "prompts")
    bad("/generate/", {"prompts": "hi"}, "prompts")
    bad("/generate/", {"prompts": [[1, 10 ** 7]]}, "prompts")
    bad("/generate/", {"prompts": [[1]], "structured_outputs_regex": "a+"}, "structured_outputs_regex")
    bad("/generate/", {"prompts": [[1]], "guided_decoding_regex": "a+"}, "guided_decoding_regex")
    bad("/generate/", {"prompts": [[1]], "images": [["aGVsbG8="]]}, "images")
    bad("/generate/", {"prompts": [[1]], "max_tokens": 0}, "max_tokens")
    bad("/generate/", {"prompts": [[1]], "generation_kwargs": {"temperature": -1}}, "temperature")
    bad("/chat/", {"messages": [[{"role": "user", "content": "x"}]], "chat_template_kwargs": {"enable_thinking": 1}},
        "chat_template_kwargs")
    # chat_template_kwargs as /v1/chat/completions reads them (enable_thinking is a template variable)
    r = T.post(srv, "/chat/", {"messages": [[{"role": "user", "content": "x"}]], "max_tokens": 1,
                               "chat_template_kwargs": {"enable_thinking": False}})
    C.check(r.status == 200, "/chat/ with chat_template_kwargs.enable_thinking: %r" % r)
    bad("/chat/", {"messages": [{"role": "user", "content": "x"}]}, "messages")
    # repetition_penalty: the same one rule as /v1/completions
    r, _ = client_generate(srv, [[5, 6]], repetition_penalty=1.2, max_tokens=2)
    o = T.post(srv, "/v1/completions", {"prompt": [5, 6], "repetition_penalty": 1.2, "max_tokens": 2})
    C.check((r.status == 200) == (o.status == 200), "repetition_penalty: generate/ %d vs completions %d"
            % (r.status, o.status))


def main():
    C = T.Checker("dialect_trl")
    binary = T.gs_bin(C)
    tmp = T.scratch("dialect_trl")
    model = T.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = T.Server(C, binary, model)
    try:
        test_generate(C, srv)
        test_chat(C, srv)
        test_routes_errors(C, srv)
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
