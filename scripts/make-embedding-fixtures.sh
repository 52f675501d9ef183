#!/usr/bin/env bash
# Regenerate crates/anelm-engine/tests/fixtures/embeddings/minilm.json: sentence-transformers'
# embeddings and Hugging Face tokenizers' token ids of all-MiniLM-L6-v2 for a set of texts
# (scripts/make-embedding-fixtures.py), the reference crates/anelm-engine/tests/minilm.rs checks
# anelm against; and crates/anelm-engine/tests/fixtures/embeddings/qwen3-embedder/, a tiny
# random-weight Qwen3 decoder embedder with its reference.json
# (scripts/make-decoder-embedder-fixture.py, checked by tests/decoder_embedder.rs), and the same
# model as a GGUF in llama.cpp's layout with its pooling type (qwen3-embedder.gguf,
# scripts/make-decoder-embedder-gguf.py).
#
# Creates (once) a virtualenv under the user cache with pinned sentence-transformers, transformers
# and torch from PyPI. The PyPI torch wheel for Linux is a CUDA build whose import needs the CUDA
# runtime packages, so they come along (about 3 GB); everything runs on the CPU in fp32. The tests
# read the committed fixture and need none of this.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.15.0"
TRANSFORMERS_VERSION="5.24.0"
ST_VERSION="6.2.0"
GGUF_VERSION="0.19.0"

# shellcheck source=lib/model-cache.sh
. scripts/lib/model-cache.sh
cache="$ANELM_CACHE_DIR"
venv="$cache/venv-embeddings"
stamp="$venv/.anelm-torch-$TORCH_VERSION-transformers-$TRANSFORMERS_VERSION-st-$ST_VERSION-gguf-$GGUF_VERSION"

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || { echo "error: python3 (>= 3.10) is needed (set PYTHON=...)" >&2; exit 1; }

if [ ! -f "$stamp" ]; then
  echo "creating $venv (torch $TORCH_VERSION, sentence-transformers $ST_VERSION; about 3 GB) ..." >&2
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check \
    "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" "sentence-transformers==$ST_VERSION" "gguf==$GGUF_VERSION" >&2
  touch "$stamp"
fi

model="$(scripts/fetch-minilm.sh)"
out=crates/anelm-engine/tests/fixtures/embeddings/minilm.json
mkdir -p "$(dirname "$out")"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-embedding-fixtures.py "$model" "$out"
qwen=crates/anelm-engine/tests/fixtures/embeddings/qwen3-embedder
rm -rf "$qwen"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-decoder-embedder-fixture.py "$qwen"
# sentence-transformers writes a model card; the fixture does not need it.
rm -f "$qwen/README.md"
"$venv/bin/python" scripts/make-decoder-embedder-gguf.py "$qwen" "$qwen.gguf"
