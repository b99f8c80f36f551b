#!/usr/bin/env bash
# Makes the bench-only Python venv for bench/llamacpp (gguf, numpy, llama-cpp-python built for this
# CPU). Not part of `make check`; nothing in the build or the tests uses it.
#
#   bench/llamacpp/setup.sh            # venv at $VENV (default /tmp/llvenv); reused when complete
#   bench/llamacpp/setup.sh --force    # rebuild llama-cpp-python even if the venv works
#
# llama-cpp-python is compiled from source (10-15 minutes on 2 cores) with GGML_NATIVE=ON, so
# llama.cpp uses this machine's AVX2 / AVX-512 / AVX512-BF16. Needs a C/C++ compiler; cmake comes
# from PyPI when the system has none. Extra CMake flags: CMAKE_ARGS="..." bench/llamacpp/setup.sh
set -euo pipefail

VENV="${VENV:-/tmp/llvenv}"
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    for c in python3.11 python3.12 python3.10 python3; do
        if command -v "$c" >/dev/null 2>&1; then PY="$c"; break; fi
    done
fi
[ -n "$PY" ] || { echo "setup.sh: no python3 found (set PYTHON=...)" >&2; exit 1; }

if [ "$FORCE" = 0 ] && [ -x "$VENV/bin/python" ] &&
   "$VENV/bin/python" -c "import llama_cpp, gguf, numpy" >/dev/null 2>&1; then
    echo "setup.sh: $VENV already has llama-cpp-python $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)'), gguf and numpy (--force to rebuild)"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup.sh: creating $VENV with $PY"
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install gguf numpy

JOBS="$(nproc 2>/dev/null || echo 2)"
echo "setup.sh: building llama-cpp-python (GGML_NATIVE=ON, $JOBS jobs); this takes a while"
# --no-cache-dir: never reuse a wheel built elsewhere or with other flags
CMAKE_ARGS="-DGGML_NATIVE=ON ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    "$VENV/bin/pip" install --no-cache-dir --force-reinstall --no-deps llama-cpp-python
# its pure-Python dependencies (typing-extensions, diskcache, jinja2, numpy) without rebuilding it
"$VENV/bin/pip" install llama-cpp-python

"$VENV/bin/python" - <<'EOF'
import llama_cpp
print("setup.sh: llama-cpp-python", llama_cpp.__version__)
print("setup.sh:", llama_cpp.llama_print_system_info().decode().strip())
EOF
echo "setup.sh: done; run: $VENV/bin/python bench/llamacpp/compare.py --out bench/llamacpp/results"
