#!/usr/bin/env python3
"""One guarded JSON entry point (scripts/check_json_entry.py, models/format/json_guard.h, issue 23).

1. The checker on this tree: no raw cJSON_Parse* outside models/format/json_guard.c.
2. The checker can fail: small trees with a raw cJSON_Parse call (server/), cJSON_ParseWithLength
   (models/), cJSON_ParseWithOpts (tests/fuzz/, a .h macro), cJSON_ParseWithLengthOpts (engine/, a
   .cu file) and a function pointer to cJSON_Parse, each exit 1 naming path:line.
3. It does not fail on what is no call: mentions in // and /* */ comments (also spanning lines),
   in string literals, models/format/json_guard.c itself, and folders it does not scan (tests/unit).
Environment (ctest): GS_SOURCE_DIR.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gs_harness  # noqa: E402

SRC = os.environ.get("GS_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CHECK = os.path.join(SRC, "scripts", "check_json_entry.py")
failures = []
passed = [0]


def run(*args):
    p = subprocess.run([sys.executable, CHECK, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def expect(name, cond, out):
    print(("ok   " if cond else "FAIL ") + name)
    if cond:
        passed[0] += 1
    else:
        print(out)
        failures.append(name)


def tree(files):
    return gs_harness.write_tree(files, "gs-json-entry-")


GUARD = {"models/format/json_guard.c":
         "#include <cjson/cJSON.h>\n"
         "cJSON *mdl_json_parse(const char *t, unsigned long n) {\n"
         "    return cJSON_ParseWithLengthOpts(t, n, 0, 0);\n}\n"}

# 1. this tree
rc, out = run("--root", SRC)
expect("this tree parses JSON only through mdl_json_parse", rc == 0 and "json entry ok:" in out, out)

# 2. offenders, one tree each: (files, the path:line that must be named)
bad = [
    ("cJSON_Parse in server/", {"server/a.c": "#include <cjson/cJSON.h>\n\nvoid f(const char *b) {\n"
                                "    cJSON *o = cJSON_Parse(b);\n    cJSON_Delete(o);\n}\n"}, "server/a.c:4"),
    ("cJSON_ParseWithLength in models/", {"models/m.c": "void g(const char *b, unsigned n) "
                                          "{ cJSON_Delete(cJSON_ParseWithLength (b, n)); }\n"}, "models/m.c:1"),
    ("cJSON_ParseWithOpts in a tests/fuzz/ header macro",
     {"tests/fuzz/h.h": "/* a helper */\n#define PARSE(b) cJSON_ParseWithOpts((b), 0, 1)\n"}, "tests/fuzz/h.h:2"),
    ("cJSON_ParseWithLengthOpts in an engine/ .cu file",
     {"engine/k.cu": "// kernel host side\nstatic void h(const char *b) {\n  const char *e;\n"
      "  cJSON_Delete(cJSON_ParseWithLengthOpts(b, 3, &e, 0));\n}\n"}, "engine/k.cu:4"),
    ("a function pointer to cJSON_Parse in bench/",
     {"bench/p.c": "typedef void *(*pf)(const char *);\nstatic pf parse_fn = (pf)cJSON_Parse;\n"}, "bench/p.c:2"),
    ("a call after a comment on the same line in spec_decode/",
     {"spec_decode/s.c": "/* x */ void s(const char *b) { cJSON_Delete(cJSON_Parse(b)); } // cJSON_Parse\n"},
     "spec_decode/s.c:1"),
    ("a call after a string holding a quote in kernels/",
     {"kernels/q.c": 'static const char *q = "a \\" b";\nstatic char c = \'"\';\nvoid k(void) '
      '{ cJSON_Delete(cJSON_Parse(q)); }\n'}, "kernels/q.c:3"),
]
for name, files, where in bad:
    files = dict(GUARD, **files)
    root = tree(files)
    rc, out = run("--root", root)
    expect(name + " fails, naming " + where, rc == 1 and (where + ":") in out and "json entry ok" not in out, out)
    shutil.rmtree(root)

# two offenders in two files: both named
root = tree(dict(GUARD, **{"server/x.c": "void x(void) { cJSON_Parse(\"{}\"); }\n",
                            "server/y/z.h": "\n\n#define Z cJSON_ParseWithLength\n"}))
rc, out = run("--root", root)
expect("every offender is named", rc == 1 and "server/x.c:1:" in out and "server/y/z.h:3:" in out, out)
shutil.rmtree(root)

# 3. what is no call passes
good = dict(GUARD, **{
    "server/c.c": ("// cJSON_Parse(body) used to be here\n"
                   "/* cJSON_ParseWithLength(b, n) and\n   cJSON_ParseWithOpts(b, 0, 1) were replaced */\n"
                   "static const char *msg = \"never call cJSON_Parse(x) here\";\n"
                   "static const char *esc = \"\\\" cJSON_ParseWithLengthOpts(\";\n"
                   "int c(void) { return msg[0] + esc[0]; } /* cJSON_Parse */\n"
                   "// a continued comment \\\n   cJSON_Parse(b)\n"),
    "models/format/json_guard.h": "/* cJSON_Parse recurses: see mdl_json_parse */\n",
    "tests/unit/t.c": "void t(void) { cJSON_Delete(cJSON_Parse(\"{}\")); }\n",  # not scanned
    "server/cJSON_Parse_notes.txt": "cJSON_Parse(b)\n",  # not a source file
    "server/d.c": "int mdl_cJSON_Parsed = 0; int not_cJSON_Parse(void);\n",  # other identifiers
})
root = tree(good)
rc, out = run("--root", root)
expect("comments, strings, json_guard.c and unscanned files pass", rc == 0 and "json entry ok: 4 files" in out, out)
shutil.rmtree(root)

# bad use
rc, out = run("--root", os.path.join(tempfile.gettempdir(), "gs-json-entry-no-such-dir"))
expect("a missing --root exits 2", rc == 2, out)

print("%d passed, %d failed" % (passed[0], len(failures)))
sys.exit(1 if failures else 0)
