#!/usr/bin/env python3
"""Speculative decoding over HTTP: `serve --draft`.

- greedy completions with a drafter equal `graphswap generate` without one (lossless, I9), and their
  usage.spec equals `generate --draft`'s spec counts for the same request;
- /metrics spec_decode_* counters equal the sum of usage.spec over the requests served;
- streaming with a drafter gives the same tokens as non-streaming;
- "speculative": false decodes without the drafter on the same server (usage.spec.drafts 0, the
  same tokens), also while speculative requests share its batch, and the prefix-cache blocks it
  leaves (without drafter context) do not change the drafting of later speculative requests with the
  same prompts (usage.spec still equals `generate --draft`'s); a non-boolean is a 400 naming the
  field; usage.spec.accepted_per_position has one count per draft position, non-increasing, summing
  to accepted_tokens.
"""
import os
import sys
import threading

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_basic as H  # noqa: E402


def main():
    C = H.Checker("spec_http")
    binary = H.gs_bin(C)
    tmp = H.scratch("spec_http")
    T = H.mkmodel(C, binary, os.path.join(tmp, "T"), vocab=1024, extra=["--layers", "3", "--seed", "21"])
    D = os.path.join(tmp, "D")
    p = H.subprocess.run([binary, "mkmodel", "--arch", "dspark", "--target", T, "--out", D, "--block-size", "5",
                          "--markov-rank", "8", "--seed", "22"], capture_output=True)
    if not C.check(p.returncode == 0, "mkmodel dspark: %s" % p.stderr):
        return C.finish()
    srv = H.Server(C, binary, T, args=["--draft", D])
    try:
        prompts = [[5, 6, 7, 8], [100, 200, 300], [42] * 20, list(range(50, 90))]
        tot = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
        # "speculative": false first: its KV blocks lack the drafter's context K/V, so they must not
        # reach the prefix cache, or the speculative requests below would inherit them and draft
        # worse than `generate --draft` (their usage.spec is compared with it below)
        first = [H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                                                 "return_token_ids": True, "speculative": False}) for ids in prompts]
        for ids, f in zip(prompts, first):
            r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 24, "temperature": 0,
                                                "ignore_eos": True, "return_token_ids": True})
            if not C.check(r.status == 200, "completion: %r" % r):
                continue
            o = r.json
            toks = o["choices"][0]["token_ids"]
            C.check(f.status == 200 and f.json["choices"][0]["token_ids"] == toks and f.json["usage"]["spec"]["drafts"] == 0,
                    "\"speculative\": false before any speculative request: %r" % f)
            plain = H.generate_cli(binary, T, ids, 24)
            C.check(plain is not None and toks == plain["token_ids"], "HTTP with drafter differs from plain generate")
            spec = H.generate_cli(binary, T, ids, 24, extra=["--draft", D])
            us = o["usage"].get("spec")
            C.check(us is not None, "usage.spec missing with a drafter")
            if us:
                ap = us.get("accepted_per_position", [])
                C.check(len(ap) == 5 and sum(ap) == us["accepted_tokens"] and
                        all(ap[i] >= ap[i + 1] for i in range(len(ap) - 1)) and all(x <= us["drafts"] for x in ap),
                        "accepted_per_position %r vs usage.spec %r (DSpark b5: 5 positions)" % (ap, us))
            if us and spec:
                for k in tot:
                    C.check(int(us[k]) == int(spec["spec"][k]), "usage.spec.%s %s vs generate %s" % (k, us[k], spec["spec"][k]))
                    tot[k] += int(us[k])
            st, evs, _ = H.stream_all(srv, "/v1/completions", {"prompt": ids, "max_tokens": 24, "temperature": 0,
                                                               "ignore_eos": True, "return_token_ids": True,
                                                               "stream": True})
            got = H.collect_stream(evs).get(0, {}).get("token_ids", [])
            C.check(got == toks, "streamed tokens differ with a drafter: %r vs %r" % (got[:8], toks[:8]))
        # the streamed requests drafted too: compare metrics with 2x the non-streamed sums
        m = H.metrics(srv)
        C.check(int(m.get("graphswap:spec_decode_num_drafts_total", -1)) == 2 * tot["drafts"],
                "metrics drafts %s vs usage %d" % (m.get("graphswap:spec_decode_num_drafts_total"), 2 * tot["drafts"]))
        C.check(int(m.get("graphswap:spec_decode_num_accepted_tokens_total", -1)) == 2 * tot["accepted_tokens"],
                "metrics accepted tokens vs usage")
        C.check(int(m.get("graphswap:spec_decode_num_draft_tokens_total", -1)) == 2 * tot["draft_tokens"],
                "metrics draft tokens vs usage")
        # "speculative": false: plain decoding on the drafter's server, alone and in a mixed batch
        body = {"max_tokens": 24, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        res = {}

        def one(i, ids, spec):
            res[(i, spec)] = H.post(srv, "/v1/completions", dict(body, prompt=ids, speculative=spec))

        th = [threading.Thread(target=one, args=(i, ids, spec)) for i, ids in enumerate(prompts) for spec in (True, False)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        nospec_tokens, new_drafts = 0, 0
        for i, ids in enumerate(prompts):
            a, b = res.get((i, True)), res.get((i, False))
            if not C.check(a is not None and b is not None and a.status == 200 and b.status == 200,
                           "mixed batch: %r %r" % (a, b)):
                continue
            C.check(b.json["choices"][0]["token_ids"] == a.json["choices"][0]["token_ids"],
                    "prompt %d: \"speculative\": false gives other tokens than speculative" % i)
            C.check(b.json["usage"]["spec"]["drafts"] == 0 and a.json["usage"]["spec"]["drafts"] > 0,
                    "prompt %d: drafts with speculative false %r, true %r" % (i, b.json["usage"]["spec"], a.json["usage"]["spec"]))
            nospec_tokens += b.json["usage"]["completion_tokens"]
            new_drafts += a.json["usage"]["spec"]["drafts"]
        C.check(nospec_tokens == 24 * len(prompts), "speculative false: %d tokens" % nospec_tokens)
        m2 = H.metrics(srv)
        C.check(int(m2.get("graphswap:spec_decode_num_drafts_total", -1)) == 2 * tot["drafts"] + new_drafts,
                "metrics count drafts of \"speculative\": false requests")
        r = H.post(srv, "/v1/completions", dict(body, prompt=[5, 6], speculative="no"))
        C.check(r.status == 400 and r.json["error"]["param"] == "speculative" and "boolean" in r.json["error"]["message"],
                "speculative \"no\": %r" % r)
        H.sanitizer_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
