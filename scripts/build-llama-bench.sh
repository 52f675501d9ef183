#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` (CPU only) from the source vendored in the PyPI sdist
# llama-cpp-python==0.3.36, into a cache directory. Idempotent: prints the binary's path.
# Needs python3 + pip, a C++ compiler and CMake (installed from Debian's packages if missing).
# Not part of CI; used by scripts/bench-vs-llamacpp.sh.
set -euo pipefail
VERSION=0.3.36
CACHE="${ANELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/anelm}/llama.cpp-$VERSION"
BIN="$CACHE/build/bin/llama-bench"
if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
if ! command -v cmake >/dev/null; then
  echo "installing cmake from Debian's packages" >&2
  if [[ $(id -u) -eq 0 ]]; then apt-get install -y -q cmake >&2; else sudo apt-get install -y -q cmake >&2; fi
fi
if [[ ! -d "$CACHE/src" ]]; then
  echo "downloading llama-cpp-python==$VERSION source from PyPI" >&2
  python3 -m pip download --quiet --no-deps --no-binary=llama-cpp-python "llama-cpp-python==$VERSION" -d "$CACHE/dl" >&2
  rm -rf "$CACHE/unpack" && mkdir -p "$CACHE/unpack"
  tar -xzf "$CACHE"/dl/llama_cpp_python-"$VERSION".tar.gz -C "$CACHE/unpack"
  mv "$CACHE/unpack/llama_cpp_python-$VERSION/vendor/llama.cpp" "$CACHE/src"
  rm -rf "$CACHE/unpack"
fi
echo "building llama-bench (CPU, Release) in $CACHE/build" >&2
cmake -S "$CACHE/src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$CACHE/build" --target llama-bench -j "$(nproc)" >&2
echo "$BIN"
