#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` (CPU only) from the source vendored in the PyPI sdist
# llama-cpp-python==0.3.36, into a cache directory. Idempotent: prints the binary's path.
# Needs python3 + pip, a C++ compiler and CMake (installed from Debian's packages if missing).
# Not part of CI; used by scripts/bench-vs-llamacpp.sh.
#
#   scripts/build-llama-bench.sh [--variant native|noamx]
#
# `native` (the default) is GGML_NATIVE=ON; `noamx` the same instruction sets without AMX
# (scripts/lib/llama-cpp.sh says why both exist).
set -euo pipefail
# shellcheck source=lib/llama-cpp.sh
. "$(dirname "$0")/lib/llama-cpp.sh"
VARIANT=native
while [[ $# -gt 0 ]]; do
  case "$1" in
    --variant) VARIANT="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
DIR="$(llama_cpp_build_dir "$VARIANT")"
BIN="$DIR/bin/llama-bench"
if [[ ! -x "$BIN" ]]; then llama_cpp_build_variant "$VARIANT" llama-bench; fi
echo "$BIN"
