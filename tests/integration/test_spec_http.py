#!/usr/bin/env python3
"""Speculative decoding over HTTP: `serve --draft`.

- greedy completions with a drafter equal `graphswap generate` without one (lossless, I9), and their
  usage.spec equals `generate --draft`'s spec counts for the same request;
- /metrics spec_decode_* counters equal the sum of usage.spec over the requests served;
- streaming with a drafter gives the same tokens as non-streaming.
"""
import os
import sys

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
        for ids in prompts:
            r = H.post(srv, "/v1/completions", {"prompt": ids, "max_tokens": 24, "temperature": 0,
                                                "ignore_eos": True, "return_token_ids": True})
            if not C.check(r.status == 200, "completion: %r" % r):
                continue
            o = r.json
            toks = o["choices"][0]["token_ids"]
            plain = H.generate_cli(binary, T, ids, 24)
            C.check(plain is not None and toks == plain["token_ids"], "HTTP with drafter differs from plain generate")
            spec = H.generate_cli(binary, T, ids, 24, extra=["--draft", D])
            us = o["usage"].get("spec")
            C.check(us is not None, "usage.spec missing with a drafter")
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
        H.sanitizer_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
