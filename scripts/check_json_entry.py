#!/usr/bin/env python3
"""scripts/check_json_entry.py — every parse of JSON text goes through mdl_json_parse (issue 23).

models/format/json_guard.h: cJSON parses recursively, and a deeply nested text (~900 levels)
overflows a civetweb worker's stack; mdl_json_parse scans the depth (and NUL) first. So no source
file but models/format/json_guard.c may name cJSON's parsers (cJSON_Parse, cJSON_ParseWithLength,
cJSON_ParseWithOpts, cJSON_ParseWithLengthOpts, or any later cJSON_Parse*): not as a call, and not
as a function pointer or through a macro either. Mentions inside comments and string literals are
ignored.

Scanned: server/ models/ engine/ kernels/ spec_decode/ bench/ tests/fuzz/ (*.c *.h *.cu *.cuh
*.inc *.cpp). Exit 0 with "json entry ok: N files", 1 with one "path:line: ..." per offender, 2 on
bad use.

  scripts/check_json_entry.py [--root DIR]
"""
import argparse
import os
import re
import sys

SRC_DIRS = ("server", "models", "engine", "kernels", "spec_decode", "bench", os.path.join("tests", "fuzz"))
EXTS = (".c", ".h", ".cu", ".cuh", ".inc", ".cpp")
ALLOWED = {os.path.join("models", "format", "json_guard.c")}
PARSER = re.compile(r"\bcJSON_Parse\w*")


def sources(root):
    for top in SRC_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(d, f), root)


def code_only(text):
    """text with comments and string / character literals blanked (newlines kept, so line numbers
    stay): a small C lexer, enough for // and /* */ comments, "..." and '...' with escapes, and
    backslash-newline continuations."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            # to the end of the line, a backslash-newline continues the comment
            while i < n and text[i] != "\n":
                if text[i] == "\\" and text.startswith("\n", i + 1):
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            # a literal (raw string literals R"(...)" do not occur in C)
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def offenders(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    code = code_only(text)
    for ln, line in enumerate(code.split("\n"), 1):
        for m in PARSER.finditer(line):
            yield ln, m.group(0)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="the source tree (default: this script's repository)")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    if not os.path.isdir(root):
        print("check_json_entry: no folder %s" % root, file=sys.stderr)
        return 2
    bad, n = [], 0
    for rel in sources(root):
        n += 1
        if rel in ALLOWED:
            continue
        for ln, name in offenders(root, rel):
            bad.append("%s:%d: %s outside models/format/json_guard.c: parse through mdl_json_parse "
                       "(models/format/json_guard.h)" % (rel, ln, name))
    if bad:
        for b in bad:
            print(b)
        print("json entry: %d raw cJSON parse call(s) in %d files" % (len(bad), n))
        return 1
    print("json entry ok: %d files" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
