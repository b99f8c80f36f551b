#!/usr/bin/env python3
"""scripts/check_layers.py — the source folders must form layers (docs/DESIGN.md, "Source layout").

Two graphs, each of which must have no circle between folders:
  includes  folder A -> folder B when a file of A has `#include "B/..."` (read from the sources);
  names     folder A -> folder B when an object file compiled from A uses a symbol that an object
            compiled from B defines (read with `nm` from a build folder, when one is given): a
            function declared in one folder's header but defined in another's counts too.
And one rule: no file includes another folder's *_internal.h (what a folder keeps to itself).

A folder is a directory holding sources (server/http and server/core are two folders). tests/ is
not checked (tests may reach anything). Exit 0 when clean, 1 with each circle and the lines that
make it, 2 on bad use.

  scripts/check_layers.py [--root DIR] [--build BUILD_DIR]
"""
import argparse
import os
import re
import subprocess
import sys

SRC_DIRS = ("kernels", "models", "engine", "spec_decode", "server", "bench")
EXTS = (".c", ".h", ".cu", ".cuh", ".inc", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def sources(root):
    for top in SRC_DIRS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(d, f), root)


def resolve(root, src, inc):
    """The repository path an #include "inc" in src names, or None (a system or generated file)."""
    for cand in (os.path.join(os.path.dirname(src), inc), inc):
        if os.path.isfile(os.path.join(root, cand)):
            return os.path.normpath(cand)
    return None


def circles(edges):
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    nodes = set(edges) | {b for a in edges for b in edges[a]}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(edges.get(nxt, ())))))
            elif nxt in on:
                low[v] = min(low[v], index[nxt])
    return out


def report(kind, edges, why):
    bad = circles(edges)
    for comp in bad:
        print(f"{kind} circle between folders: {' <-> '.join(comp)}")
        for a in comp:
            for b in sorted(edges.get(a, ())):
                if b in comp:
                    for line in why[(a, b)][:4]:
                        print(f"    {a} -> {b}: {line}")
    return len(bad)


def include_graph(root):
    edges, why, problems = {}, {}, []
    for src in sources(root):
        with open(os.path.join(root, src), encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                tgt = resolve(root, src, m.group(1))
                if tgt is None:
                    continue
                a, b = os.path.dirname(src), os.path.dirname(tgt)
                if a == b:
                    continue
                if os.path.basename(tgt).endswith("_internal.h"):
                    problems.append(f"{src}:{n} includes another folder's internal header {tgt}")
                edges.setdefault(a, set()).add(b)
                why.setdefault((a, b), []).append(f"{src}:{n} #include \"{m.group(1)}\"")
    return edges, why, problems


def object_source(obj, build):
    """CMake names objects <build>/CMakeFiles/<target>.dir/<source path relative to the root>.o."""
    rel = os.path.relpath(obj, build).split(os.sep)
    if len(rel) < 4 or rel[0] != "CMakeFiles" or not rel[1].endswith(".dir"):
        return None
    src = os.path.join(*rel[2:])[: -len(".o")]
    return src if src.split(os.sep)[0] in SRC_DIRS else None


def name_graph(root, build):
    defs, uses = {}, {}
    for d, _, files in os.walk(os.path.join(build, "CMakeFiles")):
        for f in files:
            if not f.endswith(".o"):
                continue
            obj = os.path.join(d, f)
            src = object_source(obj, build)
            if src is None or not os.path.isfile(os.path.join(root, src)):
                continue
            out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True)
            if out.returncode != 0:
                continue
            folder = os.path.dirname(src)
            for line in out.stdout.splitlines():
                p = line.split()
                if len(p) < 2:
                    continue
                sym, t = p[0], p[1]
                if t == "U":
                    uses.setdefault(folder, {}).setdefault(sym, src)
                elif t in "TDBR":  # global text, data, bss, read-only data
                    defs.setdefault(sym, folder)
    edges, why = {}, {}
    for a, syms in uses.items():
        for sym, src in syms.items():
            b = defs.get(sym)
            if b is None or b == a:
                continue
            edges.setdefault(a, set()).add(b)
            why.setdefault((a, b), []).append(f"{src} uses {sym}")
    return edges, why, len(defs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--build", help="a build folder: also check the symbol graph of its object files")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    edges, why, problems = include_graph(root)
    if not edges:
        print(f"no project includes found under {root}: wrong --root?")
        return 2
    bad = report("include", edges, why)
    for p in problems:
        print(p)
    n_folders = len(set(edges) | {b for v in edges.values() for b in v})
    msg = f"{n_folders} folders, {sum(len(v) for v in edges.values())} include edges"
    if a.build:
        nedges, nwhy, n_defs = name_graph(root, os.path.abspath(a.build))
        if n_defs == 0:
            print(f"no object files of the sources found under {a.build}/CMakeFiles: build first")
            return 2
        bad += report("name", nedges, nwhy)
        msg += f", {sum(len(v) for v in nedges.values())} symbol edges ({n_defs} symbols)"
    if bad or problems:
        print(f"FAILED: {bad} circle(s), {len(problems)} internal-header include(s); {msg}")
        return 1
    print(f"layers ok: {msg}, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
