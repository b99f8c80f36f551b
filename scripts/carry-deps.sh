#!/usr/bin/env bash
# scripts/carry-deps.sh — fetch the Debian packages the build needs (civetweb, cJSON, cmocka, PCRE2 and
# pkgconf: headers, libraries, pkg-config files) with `apt-get download` and unpack them under
# .deps/root, for a machine that has the CUDA toolkit, a compiler and CMake but no such -dev packages
# and no network (the GPU machine of scripts/device-check.sh). Run it here, on a Debian machine, then
# carry .deps with the tree (it is a few MB). On the other machine, `source .deps/env.sh` points
# CMake, pkg-config and the dynamic loader at it; scripts/device-check.sh does that by itself.
#
# The libraries are Debian bookworm's x86-64 builds: they need glibc >= 2.34 and libstdc++ on the
# machine that runs them (any current Ubuntu or Debian CUDA image has both).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS="$ROOT/.deps"
PKGS=(libcivetweb-dev libcivetweb1 libcjson-dev libcjson1 libcmocka-dev libcmocka0
      libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
      pkgconf pkgconf-bin libpkgconf3)

rm -rf "$DEPS"
mkdir -p "$DEPS/debs" "$DEPS/root"
cd "$DEPS/debs"
if ! apt-get download "${PKGS[@]}" >/dev/null 2>&1; then
  echo "carry-deps: apt-get download failed; running apt-get update once and retrying" >&2
  apt-get update -qq
  apt-get download "${PKGS[@]}"
fi
for f in "$DEPS"/debs/*.deb; do dpkg-deb -x "$f" "$DEPS/root"; done
ls "$DEPS"/debs > "$DEPS/packages.txt"
rm -rf "$DEPS/debs" "$DEPS/root/usr/share/doc" "$DEPS/root/usr/share/man" "$DEPS/root/usr/share/lintian"

cat > "$DEPS/env.sh" <<'EOF'
# source .deps/env.sh: use the packages unpacked by scripts/carry-deps.sh (paths relative to this file)
GS_DEPS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/root"
GS_DEPS_LIB="$GS_DEPS_ROOT/usr/lib/x86_64-linux-gnu"
export GS_DEPS_ROOT
export CMAKE_PREFIX_PATH="$GS_DEPS_ROOT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_LIBDIR="$GS_DEPS_LIB/pkgconfig:$GS_DEPS_ROOT/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$GS_DEPS_ROOT"
export LD_LIBRARY_PATH="$GS_DEPS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# a pkg-config for CMake's FindPkgConfig when the machine has none
if ! command -v pkg-config >/dev/null 2>&1; then
  export PKG_CONFIG="$GS_DEPS_ROOT/usr/bin/pkgconf"
fi
EOF
echo "carry-deps: $(wc -l < "$DEPS/packages.txt") packages unpacked under $DEPS ($(du -sh "$DEPS" | cut -f1))"
echo "carry-deps: on the device: source .deps/env.sh (scripts/device-check.sh does it)"
