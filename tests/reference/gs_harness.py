"""Shared helpers for the Python tests that drive the graphswap binary (reference + integration).

Environment (set by ctest): GS_BIN (graphswap binary), GS_TEST_TMP (scratch dir), GS_SOURCE_DIR.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

DEFAULT_TIMEOUT = 180


class Checker:
    """Counts checks; prints a clear message per failure; finish() prints 'N passed, M failed'."""

    MAX_PRINTED = 300

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0

    def check(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            if self.failed <= self.MAX_PRINTED:
                print("FAIL: " + msg, flush=True)
            elif self.failed == self.MAX_PRINTED + 1:
                print("FAIL: ... further failure messages suppressed (counted below)", flush=True)
        return bool(cond)

    def fail(self, msg):
        return self.check(False, msg)

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        return 1 if self.failed else 0


def write_tree(files, prefix):
    """A fresh temporary folder holding files ({relative path: text}); returns its path."""
    root = tempfile.mkdtemp(prefix=prefix)
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as fh:
            fh.write(text)
    return root


def scratch_dir(name):
    base = os.environ.get("GS_TEST_TMP")
    if base:
        d = os.path.join(base, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        return d
    return tempfile.mkdtemp(prefix="gs_%s_" % name)


def gs_bin():
    b = os.environ.get("GS_BIN")
    if not b:
        src = os.environ.get("GS_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
        cand = os.path.join(src, "build", "graphswap")
        if os.path.exists(cand):
            b = cand
    return b


def require_bin(checker):
    b = gs_bin()
    if not b or not os.access(b, os.X_OK):
        checker.fail("graphswap binary not found (GS_BIN=%r)" % os.environ.get("GS_BIN"))
        sys.exit(checker.finish())
    return b


class Result:
    def __init__(self, args, rc, stdout, stderr):
        self.args = args
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr

    def cmd(self):
        return " ".join(self.args)


def run(args, timeout=DEFAULT_TIMEOUT):
    try:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        return Result(args, p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        err = (e.stderr or b"").decode("utf-8", "replace")
        return Result(args, "timeout", out, err + "\n[timed out after %ds]" % timeout)


def mkmodel(binary, out, arch, hidden, layers, heads, kv_heads, head_dim, inter, vocab, tie=True,
            dtype="bf16", shards=1, seed=0, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    args = [binary, "mkmodel", "--arch", arch, "--out", out, "--hidden", str(hidden), "--layers", str(layers),
            "--heads", str(heads), "--kv-heads", str(kv_heads), "--head-dim", str(head_dim),
            "--intermediate", str(inter), "--vocab", str(vocab), "--tie" if tie else "--no-tie",
            "--dtype", dtype, "--shards", str(shards), "--seed", str(seed)] + list(extra)
    return run(args)


def accept_all_drafter(src, dst):
    """A copy of drafter folder src at dst whose config sets the TEST-ONLY switch
    graphswap_test_accept_drafts (every draft accepted whatever the target says); returns dst."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["graphswap_test_accept_drafts"] = True
    with open(path, "w") as f:
        json.dump(cfg, f)
    return dst


def generate_args(binary, model, prompt_ids=None, max_tokens=12, temperature=None, top_k=None, top_p=None,
                  min_p=None, seed=None, logprobs=None, ignore_eos=True, threads=None, prefill_chunk=None,
                  eager=False, batch_file=None, extra=()):
    a = [binary, "generate", "--model", model]
    if batch_file is not None:
        a += ["--batch-file", batch_file]
    else:
        a += ["--prompt-ids", ",".join(str(int(t)) for t in prompt_ids), "--max-tokens", str(max_tokens)]
    for flag, v in (("--temperature", temperature), ("--top-k", top_k), ("--top-p", top_p),
                    ("--min-p", min_p), ("--seed", seed), ("--logprobs", logprobs), ("--threads", threads),
                    ("--prefill-chunk", prefill_chunk)):
        if v is not None:
            a += [flag, str(v)]
    if ignore_eos and batch_file is None:
        a.append("--ignore-eos")
    if eager:
        a.append("--eager")
    a += list(extra)
    return a


def parse_objects(text):
    """Parses stdout into a list of JSON objects (one per non-empty line that looks like JSON).
    Floats are kept as the exact text printed (str), so comparisons can be bitwise."""
    objs = []
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("{"):
            continue
        objs.append(json.loads(s, parse_float=str))
    if not objs and text.strip().startswith("{"):
        objs.append(json.loads(text, parse_float=str))  # a pretty-printed single object
    return objs


def generate(checker, what, *args, **kw):
    """Runs generate (single prompt); returns the parsed object (floats as printed text) or None."""
    res = run(generate_args(*args, **kw))
    if res.rc != 0:
        checker.fail("%s: generate exited %s: %s\n  cmd: %s" % (what, res.rc, res.stderr.strip()[-2000:], res.cmd()))
        return None
    try:
        objs = parse_objects(res.stdout)
    except ValueError as e:
        checker.fail("%s: stdout is not JSON (%s): %r" % (what, e, res.stdout[-500:]))
        return None
    if len(objs) != 1:
        checker.fail("%s: expected one JSON object on stdout, got %d: %r" % (what, len(objs), res.stdout[-500:]))
        return None
    return objs[0]


def generate_batch(checker, what, binary, model, requests, path, **kw):
    """Writes requests as JSONL to path, runs generate --batch-file; returns list of parsed objects."""
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    res = run(generate_args(binary, model, batch_file=path, **kw))
    if res.rc != 0:
        checker.fail("%s: generate --batch-file exited %s: %s\n  cmd: %s"
                     % (what, res.rc, res.stderr.strip()[-2000:], res.cmd()))
        return None
    try:
        objs = parse_objects(res.stdout)
    except ValueError as e:
        checker.fail("%s: batch stdout is not JSONL (%s): %r" % (what, e, res.stdout[-500:]))
        return None
    if len(objs) != len(requests):
        checker.fail("%s: %d requests but %d output objects" % (what, len(requests), len(objs)))
        return None
    return objs


def num(x):
    """A number parsed with parse_float=str (or an int) -> float."""
    return float(x)


def validate_shape(checker, what, obj, n_tokens=None, k=None):
    """Checks the output object's fields and shapes. Returns True when usable."""
    ok = True
    ok &= checker.check(isinstance(obj.get("token_ids"), list), "%s: token_ids missing" % what)
    if not ok:
        return False
    n = len(obj["token_ids"])
    if n_tokens is not None:
        ok &= checker.check(n == n_tokens, "%s: %d tokens, expected %d" % (what, n, n_tokens))
    ok &= checker.check(isinstance(obj.get("logprobs"), list) and len(obj["logprobs"]) == n,
                        "%s: logprobs missing or length != %d" % (what, n))
    ok &= checker.check(obj.get("finish_reason") in ("length", "stop"),
                        "%s: bad finish_reason %r" % (what, obj.get("finish_reason")))
    if k:
        tl = obj.get("top_logprobs")
        ok &= checker.check(isinstance(tl, list) and len(tl) == n,
                            "%s: top_logprobs missing or length != %d" % (what, n))
        if ok:
            for i, row in enumerate(tl):
                good = isinstance(row, list) and len(row) == k and all(
                    isinstance(e, list) and len(e) == 2 and isinstance(e[0], int) for e in row)
                if not checker.check(good, "%s: top_logprobs[%d] is not %d [id, logprob] pairs: %r"
                                     % (what, i, k, row)):
                    ok = False
                    break
    return ok
