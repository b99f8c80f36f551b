#!/usr/bin/env python3
"""The source folders form layers (scripts/check_layers.py, docs/DESIGN.md "Source layout").

1. The checker on this tree: no include circle and no symbol circle between folders (the symbol
   graph from the object files of the build that made GS_BIN), no other folder's *_internal.h.
2. The checker can fail: small trees with an include circle, a symbol circle (a function declared
   in one folder's header, defined in another folder that uses the first), and an internal-header
   include, each exit 1 naming the folders and the line.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gs_harness  # noqa: E402

SRC = os.environ.get("GS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("GS_BIN")
CHECK = os.path.join(SRC, "scripts", "check_layers.py")
failures = []


def run(*args):
    p = subprocess.run([sys.executable, CHECK, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def expect(name, cond, out):
    print(("ok   " if cond else "FAIL ") + name)
    if not cond:
        print(out)
        failures.append(name)


def tree(files):
    return gs_harness.write_tree(files, "gs-layers-")


# 1. this tree
args = ["--root", SRC]
if BIN:
    args += ["--build", os.path.dirname(os.path.abspath(BIN))]
rc, out = run(*args)
expect("this tree has no circle between folders" + (" (includes and symbols)" if BIN else " (includes)"),
       rc == 0 and "layers ok" in out and ("symbol edges" in out or not BIN), out)

# 2a. an include circle: engine/a.c -> models/b.h, models/b.c -> engine/a.h
root = tree({
    "engine/a.h": "int a(void);\n",
    "engine/a.c": '#include "engine/a.h"\n#include "models/b.h"\nint a(void) { return b(); }\n',
    "models/b.h": "int b(void);\n",
    "models/b.c": '#include "models/b.h"\n#include "engine/a.h"\nint b(void) { return 1; }\n',
})
rc, out = run("--root", root)
expect("an include circle fails", rc == 1 and "include circle between folders: engine <-> models" in out
       and "models/b.c:2" in out, out)

# 2b. an internal header of another folder
shutil.rmtree(root)
root = tree({
    "engine/e_internal.h": "int e(void);\n",
    "engine/e.c": '#include "engine/e_internal.h"\nint e(void) { return 0; }\n',
    "server/s.c": '#include "engine/e_internal.h"\nint s(void) { return e(); }\n',
})
rc, out = run("--root", root)
expect("another folder's internal header fails", rc == 1 and "server/s.c:1 includes another folder's internal header" in out,
       out)

# 2c. a symbol circle with an acyclic include graph: both headers in engine/, but engine/e.c calls
# server_hook(), which server/s.c defines (and s.c calls e()).
shutil.rmtree(root)
root = tree({
    "engine/e.h": "int e(void);\nint server_hook(void);\n",
    "engine/e.c": '#include "engine/e.h"\nint e(void) { return server_hook(); }\n',
    "server/s.c": '#include "engine/e.h"\nint server_hook(void) { return 1; }\nint s(void) { return e(); }\n',
})
build = os.path.join(root, "build")
cc = shutil.which("cc") or shutil.which("gcc")
if cc and shutil.which("nm"):
    for src in ("engine/e.c", "server/s.c"):
        obj = os.path.join(build, "CMakeFiles", "t.dir", src + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        subprocess.run([cc, "-c", "-I", root, os.path.join(root, src), "-o", obj], check=True)
    rc, out = run("--root", root)
    expect("the same tree passes on includes alone", rc == 0, out)
    rc, out = run("--root", root, "--build", build)
    expect("a symbol circle fails", rc == 1 and "name circle between folders: engine <-> server" in out
           and "engine/e.c uses server_hook" in out, out)
else:
    print("(no cc / nm: the symbol-circle case is not run)")
shutil.rmtree(root)

print(f"{5 - len(failures) if cc else 3 - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
