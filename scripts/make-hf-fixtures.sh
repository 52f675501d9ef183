#!/usr/bin/env bash
# Regenerate the Hugging Face transformers reference fixtures under
# crates/anelm-engine/tests/fixtures/hf/ (tiny random-weight models + fp32 logits).
#
# Creates (once) a virtualenv under the user cache with pinned CPU-only torch and transformers
# from PyPI, then runs scripts/make-hf-fixtures.py in it. Arguments are passed to the script
# (e.g. `scripts/make-hf-fixtures.sh llama qwen3`). Afterwards the Qwen3.5 fixtures are also
# converted to llama.cpp's GGUF `qwen35` layout (scripts/qwen35-to-gguf.py) and the Qwen2 and
# Qwen3-MoE, LFM2 and Phi-3 ones to their `qwen2` / `qwen3moe` / `lfm2` / `phi3` layouts (scripts/llama-family-to-gguf.py), with the
# PyPI `gguf` package, under
# crates/anelm-engine/tests/fixtures/gguf/.
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

# shellcheck source=lib/model-cache.sh
. scripts/lib/model-cache.sh
cache="$ANELM_CACHE_DIR"
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

GGUF_VERSION="0.19.0"
if ! [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("gguf"))' 2>/dev/null)" = "$GGUF_VERSION" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==$GGUF_VERSION"
fi

"$venv/bin/python" scripts/make-hf-fixtures.py "$@"
hf=crates/anelm-engine/tests/fixtures/hf
mkdir -p crates/anelm-engine/tests/fixtures/gguf
for name in qwen3_5_text qwen3_5; do
  "$venv/bin/python" scripts/qwen35-to-gguf.py "$hf/$name" "crates/anelm-engine/tests/fixtures/gguf/$name.gguf"
done
for name in qwen2 qwen3_moe lfm2 phi3; do
  "$venv/bin/python" scripts/llama-family-to-gguf.py "$hf/$name" "crates/anelm-engine/tests/fixtures/gguf/$name.gguf"
done
