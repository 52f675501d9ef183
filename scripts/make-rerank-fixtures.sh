#!/usr/bin/env bash
# Regenerate crates/anelm-engine/tests/fixtures/rerank/: a tiny random-weight cross-encoder
# (BertForSequenceClassification, one label) with sentence-transformers' CrossEncoder scores, a
# 3-label sequence classifier with transformers' probabilities, and a tiny random Qwen3 yes/no
# reranker with transformers' P(yes) in Qwen3-Reranker's prompt format
# (scripts/make-rerank-fixtures.py; checked by crates/anelm-engine/tests/rerank.rs).
#
# Uses the virtualenv of scripts/make-embedding-fixtures.sh (pinned torch, transformers and
# sentence-transformers from PyPI), creating it once. The tests read the committed fixtures and
# need none of this.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.15.0"
TRANSFORMERS_VERSION="5.24.0"
ST_VERSION="6.2.0"
GGUF_VERSION="0.19.0"

# shellcheck source=lib/model-cache.sh
. scripts/lib/model-cache.sh
venv="$ANELM_CACHE_DIR/venv-embeddings"
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

out=crates/anelm-engine/tests/fixtures/rerank
rm -rf "$out"
mkdir -p "$out"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-rerank-fixtures.py "$out"
# Files the loaders do not read (generation defaults, model cards).
rm -f "$out"/*/generation_config.json "$out"/*/README.md
