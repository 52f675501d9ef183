#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` (CPU only) from the source vendored in the PyPI sdist
# llama-cpp-python==0.3.36, into a cache directory. Idempotent: prints the binary's path.
# Needs python3 + pip, a C++ compiler and CMake (installed from Debian's packages if missing).
# Not part of CI; used by scripts/bench-vs-llamacpp.sh.
set -euo pipefail
# shellcheck source=lib/llama-cpp.sh
. "$(dirname "$0")/lib/llama-cpp.sh"
BIN="$LLAMA_CPP_BUILD/bin/llama-bench"
if [[ ! -x "$BIN" ]]; then llama_cpp_build llama-bench; fi
echo "$BIN"
