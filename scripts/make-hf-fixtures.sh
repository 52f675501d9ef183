#!/usr/bin/env bash
# Regenerate the Hugging Face transformers reference fixtures under
# crates/anelm-engine/tests/fixtures/hf/ (tiny random-weight models + fp32 logits).
#
# Creates (once) a virtualenv under the user cache with pinned CPU-only torch and transformers
# from PyPI, then runs scripts/make-hf-fixtures.py in it. Arguments are passed to the script
# (e.g. `scripts/make-hf-fixtures.sh llama qwen3`).
#
# The PyPI torch wheel for Linux is a CUDA build: `import torch` preloads the CUDA runtime
# libraries, so they must be installed even though only the CPU is used (about 2.8 GB in all;
# installing torch with --no-deps fails at import with "libcublasLt.so not found"). The forward
# passes run on the CPU in fp32. The CI never runs this: the fixtures are committed.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.15.0"
# 5.25 needs a package the registry here does not serve; 5.24.0 has qwen3_5 and gemma3.
TRANSFORMERS_VERSION="5.24.0"

if [ -n "${XDG_CACHE_HOME:-}" ]; then
  cache="$XDG_CACHE_HOME/anelm"
elif [ "$(uname -s)" = "Darwin" ]; then
  cache="$HOME/Library/Caches/anelm"
else
  cache="$HOME/.cache/anelm"
fi
venv="$cache/venv-fixtures"
stamp="$venv/.anelm-torch-$TORCH_VERSION-transformers-$TRANSFORMERS_VERSION"

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || { echo "error: python3 (>= 3.10) is needed (set PYTHON=...)" >&2; exit 1; }

if [ ! -f "$stamp" ]; then
  echo "creating $venv (torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION; about 2.8 GB) ..." >&2
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
  "${pip[@]}" "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" numpy
  touch "$stamp"
fi

exec "$venv/bin/python" scripts/make-hf-fixtures.py "$@"
