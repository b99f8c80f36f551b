"""generation_config.json, as vLLM reads it (--generation-config auto):
  - its eos_token_id ids stop generation (merged with config.json's), `generate` and `serve` alike;
    --ignore-eos ignores them too
  - temperature / top_p / top_k / min_p are the defaults of requests that do not set them (here
    temperature 0: a request without temperature is greedy), max_new_tokens caps max_tokens
  - --generation-config vllm: OpenAI's defaults (no cap), eos ids still merged
  - repetition_penalty is a default too (Qwen2.5-Instruct ships 1.05): a request without one is
    penalized as a request that sets it on a server without the file; one that sets it wins
  - a bad eos id stops the load naming the field
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""

import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as T  # noqa: E402

PROMPT = [5, 17, 230, 41, 9]


def gen_cli(binary, model, n, ignore_eos=True):
    a = [binary, "generate", "--model", model, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(n)]
    if ignore_eos:
        a.append("--ignore-eos")
    p = subprocess.run(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    out = None
    if p.returncode == 0:
        out = [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip().startswith("{")][0]
    return p.returncode, out, p.stderr.decode(errors="replace")


def write_gen(model, d):
    with open(os.path.join(model, "generation_config.json"), "w") as f:
        json.dump(d, f)


def main():
    C = T.Checker("generation_config")
    binary = T.gs_bin(C)
    tmp = T.scratch("generation_config")
    base = T.mkmodel(C, binary, os.path.join(tmp, "base"), extra=["--seed", "1"])
    with open(os.path.join(base, "config.json")) as f:
        cfg_eos = json.load(f)["eos_token_id"]
    rc, ref, err = gen_cli(binary, base, 8)
    if not C.check(rc == 0, "generate on the base model failed: %s" % err):
        return C.finish()
    greedy = ref["token_ids"]
    # an id the greedy path reaches at step 2 and not before: the generation_config eos
    k = next((i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i] and greedy[i] != cfg_eos), None)
    if not C.check(k is not None, "TEST SETUP PROBLEM: greedy path %s has no fresh id after step 2" % greedy):
        return C.finish()
    eos = greedy[k]

    model = os.path.join(tmp, "model")
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(base, model)
    write_gen(model, {"bos_token_id": 1, "do_sample": True, "eos_token_id": [cfg_eos, eos], "temperature": 0.0,
                      "top_k": 50, "max_new_tokens": 6, "transformers_version": "4.51.0"})
    rc, out, err = gen_cli(binary, model, 8, ignore_eos=False)
    if C.check(rc == 0, "generate with generation_config.json failed: %s" % err):
        C.check(out["finish_reason"] == "stop" and out["token_ids"][:k] == greedy[:k] and len(out["token_ids"]) <= k + 1,
                "generation_config eos %d did not stop generate: %s (greedy %s)" % (eos, out, greedy))
    rc, out, err = gen_cli(binary, model, 8, ignore_eos=True)
    if C.check(rc == 0, "generate --ignore-eos failed: %s" % err):
        C.check(out["token_ids"] == greedy, "--ignore-eos: %s != %s" % (out["token_ids"], greedy))

    srv = T.Server(C, binary, model)
    try:
        C.check("request defaults from generation_config.json: temperature=0 max_new_tokens=6" in srv.stderr_text(),
                "start-up does not report the defaults: %s" % srv.stderr_text()[-1500:])
        r = T.post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "seed": 3,
                                            "logprobs": 1})
        if C.check(r.status == 200, "completion: %r" % r):
            lp = r.json["choices"][0]["logprobs"]
            toks = lp["tokens"]
            C.check(len(toks) == 6, "max_new_tokens 6 did not cap max_tokens 10: %d tokens" % len(toks))
            # temperature 0 by default: greedy, i.e. every chosen token is the top-1
            C.check(all(abs(a - max(t.values())) < 1e-6 for a, t in zip(lp["token_logprobs"], lp["top_logprobs"])),
                    "a request without temperature was not greedy (generation_config temperature 0): %s" % lp)
        r = T.post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "seed": 3})
        if C.check(r.status == 200, "completion: %r" % r):
            C.check(r.json["choices"][0]["finish_reason"] == "stop", "server did not stop on the generation_config "
                    "eos: %s" % r.json)
    finally:
        T.stop_clean(C, srv)
    srv = T.Server(C, binary, model, args=["--generation-config", "vllm"])
    try:
        C.check("request defaults" not in srv.stderr_text(), "vllm mode reported defaults")
        r = T.post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "seed": 3})
        if C.check(r.status == 200, "completion: %r" % r):
            C.check(r.json["usage"]["completion_tokens"] == 10, "vllm mode capped max_tokens: %s" % r.json["usage"])
    finally:
        T.stop_clean(C, srv)
        T._kill_all()

    # refusals
    write_gen(model, {"eos_token_id": 151645, "repetition_penalty": 1.05})
    rc, _, err = gen_cli(binary, model, 2)
    C.check(rc != 0 and "generation_config.json: field eos_token_id" in err, "bad eos id not refused: rc %d %s" % (rc, err))
    # repetition_penalty as a default (strong enough that the greedy path changes)
    write_gen(model, {"eos_token_id": eos, "repetition_penalty": 3.0, "temperature": 0.0})
    body = {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    srv = T.Server(C, binary, model, args=["--generation-config", "vllm"])
    try:
        r0 = T.post(srv, "/v1/completions", dict(body, return_token_ids=True))
        r1 = T.post(srv, "/v1/completions", dict(body, repetition_penalty=3.0, return_token_ids=True))
        plain = r0.json["choices"][0]["token_ids"] if r0.status == 200 else None
        pen = r1.json["choices"][0]["token_ids"] if r1.status == 200 else None
        C.check(plain is not None and pen is not None and plain != pen,
                "TEST SETUP PROBLEM: repetition_penalty 3 does not change the greedy path: %s / %s" % (plain, pen))
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    srv = T.Server(C, binary, model)
    try:
        C.check("repetition_penalty=3" in srv.stderr_text(), "start-up does not report repetition_penalty: %s"
                % srv.stderr_text()[-1500:])
        r = T.post(srv, "/v1/completions", dict(body, return_token_ids=True))
        got = r.json["choices"][0]["token_ids"] if r.status == 200 else r
        C.check(got == pen, "a request without repetition_penalty did not take the file's 3.0: %s, want %s" % (got, pen))
        r = T.post(srv, "/v1/completions", dict(body, repetition_penalty=1.0, return_token_ids=True))
        got = r.json["choices"][0]["token_ids"] if r.status == 200 else r
        C.check(got == plain, "an explicit repetition_penalty 1 did not win over the file's: %s, want %s" % (got, plain))
    finally:
        T.stop_clean(C, srv)
        T._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
