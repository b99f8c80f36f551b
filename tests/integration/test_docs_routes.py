#!/usr/bin/env python3
"""The docs cannot go stale on routes, and the front page stays a front page.

  - docs/HTTP-API.md's route index (`| METHOD | `/path` | page |` rows) equals the set of routes the
    code registers (every srv_route_add(&s->http, "METHOD", "/path", ...) under server/): a route
    added without its line, or a line left after its route went, fails.
  - At least 30 routes are read (so an empty parse cannot pass), and each one, sent with its
    documented method to a server on a small model (an empty JSON body; `*` replaced by the served
    model id), answers something other than 404 and 405: a bad body is 400, a GPU-only route 501.
  - README.md has at most 300 lines, links every docs/*.md page, and neither README.md nor docs/
    sends a reader outside the repository (no "../shared").
Environment (ctest): GS_BIN, GS_TEST_TMP, GS_SOURCE_DIR.
"""
import glob
import os
import re
import sys
import urllib.parse

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import test_http_basic as H  # noqa: E402

SRC = os.environ.get("GS_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
ROW = re.compile(r"^\| (GET|POST|PUT|DELETE) \| `(/[^`]*)` \|")
ADD = re.compile(r'srv_route_add\(&s->http, "([A-Z]+)", "([^"]+)"')


def doc_routes():
    with open(os.path.join(SRC, "docs", "HTTP-API.md"), encoding="utf-8") as f:
        return {(m.group(1), m.group(2)) for m in (ROW.match(l) for l in f) if m}


def code_routes():
    out = set()
    for p in glob.glob(os.path.join(SRC, "server", "**", "*.c"), recursive=True):
        with open(p, encoding="utf-8") as f:
            out |= set(ADD.findall(f.read()))
    return out


def test_pages(C):
    with open(os.path.join(SRC, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    n = readme.count("\n")
    C.check(n <= 300, "README.md has %d lines (at most 300)" % n)
    for p in sorted(glob.glob(os.path.join(SRC, "docs", "*.md"))):
        name = os.path.basename(p)
        C.check("](docs/%s" % name in readme, "README.md links docs/%s" % name)
        with open(p, encoding="utf-8") as f:
            C.check("../shared" not in f.read(), "docs/%s names no path outside the repository" % name)
    C.check("../shared" not in readme, "README.md names no path outside the repository")


def test_routes(C, srv, model):
    docs, code = doc_routes(), code_routes()
    C.check(len(docs) >= 30, "the route index lists %d routes (at least 30)" % len(docs))
    C.check(not (code - docs), "routes the code registers but docs/HTTP-API.md does not list: %s"
            % sorted(code - docs))
    C.check(not (docs - code), "routes docs/HTTP-API.md lists but the code does not register: %s"
            % sorted(docs - code))
    # weight sessions and pauses a route opens are closed after each one, so the next is not 409'd
    # into hiding a 404; sleep is undone by its wake-up (both in the list), run last
    order = sorted(docs, key=lambda r: (r[1] in ("/sleep", "/release_memory_occupation"), r[1], r[0]))
    for method, path in order:
        p = path.replace("*", urllib.parse.quote(model, safe=""))
        r = H.request(srv, method, p, None if method == "GET" else {}, timeout=60)
        C.check(r.status not in (404, 405), "%s %s answers %d (documented)" % (method, path, r.status))
        H.request(srv, "POST", "/v1/weights/abort", {}, timeout=60)
        H.request(srv, "POST", "/resume", {}, timeout=60)
    for w in ("/wake_up", "/resume_memory_occupation"):
        H.request(srv, "POST", w, {}, timeout=60)
    # a misspelt route is a 404: the check above can fail
    r = H.request(srv, "GET", "/get_laod")
    C.check(r.status == 404, "an undocumented route is 404: %r" % r)


def main():
    C = H.Checker("docs_routes")
    test_pages(C)
    binary = H.gs_bin(C)
    tmp = H.scratch("docs_routes")
    model = H.mkmodel(C, binary, os.path.join(tmp, "model"))
    srv = H.Server(C, binary, model, ["--weights-root", tmp])
    try:
        test_routes(C, srv, model)
    finally:
        H.stop_clean(C, srv)
        H._kill_all()
    return C.finish()


if __name__ == "__main__":
    sys.exit(main())
