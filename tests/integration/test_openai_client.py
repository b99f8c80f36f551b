#!/usr/bin/env python3
"""The official openai Python client, unmodified, against `graphswap serve` of the shipped default
target (an absolute --model path: the default model id, as in vLLM).

The client comes from PyPI into a test-only venv (cached in GS_TEST_TMP/../venv-openai); where it
cannot be installed (no network) the test is SKIPPED (exit 77) with the reason.

- models.list() holds the id; models.retrieve(id) with the absolute id (the client quotes every "/",
  GET /v1/models/%2F...) answers that id; an unknown id raises openai.NotFoundError.
- completions.create and chat.completions.create (temperature 0) answer text and usage; the streamed
  chat's deltas join to the same text; a bad max_tokens raises openai.BadRequestError.
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_http_basic as H  # noqa: E402

CHILD = r'''
import json, sys
import openai
url, mid = sys.argv[1], sys.argv[2]
c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
out = {"version": openai.__version__}
out["list"] = [m.id for m in c.models.list().data]
out["retrieve"] = c.models.retrieve(mid).id
try:
    c.models.retrieve("no-such-model")
    out["notfound"] = "no error"
except openai.NotFoundError as e:
    out["notfound"] = "NotFoundError %d" % e.status_code
r = c.completions.create(model=mid, prompt="The capital of France is", max_tokens=8, temperature=0)
out["completion"] = [r.choices[0].text, r.usage.completion_tokens]
msgs = [{"role": "user", "content": "Say hello."}]
r = c.chat.completions.create(model=mid, messages=msgs, max_tokens=8, temperature=0)
out["chat"] = [r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens]
parts = []
for ch in c.chat.completions.create(model=mid, messages=msgs, max_tokens=8, temperature=0, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        parts.append(ch.choices[0].delta.content)
out["stream"] = "".join(parts)
try:
    c.completions.create(model=mid, prompt="x", max_tokens=-1)
    out["bad"] = "no error"
except openai.BadRequestError as e:
    out["bad"] = "BadRequestError %d" % e.status_code
print(json.dumps(out))
'''


def venv_python(C):
    base = os.environ.get("GS_TEST_TMP") or "/tmp/gs-openai"
    venv = os.path.join(os.path.dirname(os.path.abspath(base)), "venv-openai")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        p = subprocess.run(["/usr/bin/python3", "-m", "venv", venv], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print("SKIP: cannot make a venv: %s" % p.stderr.strip()[-300:])
            sys.exit(77)
    p = subprocess.run([py, "-c", "import openai"], capture_output=True)
    if p.returncode != 0:
        p = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "openai"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print("SKIP: the openai package cannot be installed from PyPI here: %s" % p.stderr.strip()[-300:])
            sys.exit(77)
    return py


def main():
    C = H.Checker("openai_client")
    binary = H.gs_bin(C)
    src = os.environ.get("GS_SOURCE_DIR") or os.path.join(HERE, "..", "..")
    model = os.path.abspath(os.path.join(src, "artifacts", "default", "target"))
    py = venv_python(C)
    try:
        srv = H.Server(C, binary, model)
        try:
            p = subprocess.run([py, "-c", CHILD, "http://127.0.0.1:%d" % srv.port, model], capture_output=True,
                               text=True, timeout=600)
            if not C.check(p.returncode == 0, "the openai client script failed:\n%s" % p.stderr[-2000:]):
                return C.finish()
            out = json.loads(p.stdout.strip().splitlines()[-1])
            print("openai %s" % out["version"])
            C.check(model in out["list"], "models.list: %r" % out["list"])
            C.check(out["retrieve"] == model, "models.retrieve(%r) -> %r" % (model, out["retrieve"]))
            C.check(out["notfound"] == "NotFoundError 404", "unknown model: %r" % out["notfound"])
            txt, n = out["completion"]
            C.check(isinstance(txt, str) and txt and n == 8, "completion: %r" % out["completion"])
            ctext, fin, cn = out["chat"]
            C.check(isinstance(ctext, str) and fin in ("stop", "length") and 0 < cn <= 8, "chat: %r" % out["chat"])
            C.check(out["stream"] == ctext, "streamed chat %r != chat %r" % (out["stream"], ctext))
            C.check(out["bad"] == "BadRequestError 400", "bad max_tokens: %r" % out["bad"])
        finally:
            H.stop_clean(C, srv)
    finally:
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
