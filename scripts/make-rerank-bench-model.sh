#!/usr/bin/env bash
# Make the MiniLM-sized cross-encoder `anelm bench --rerank` measures (all-MiniLM-L6-v2's
# encoder under a random classifier head; scripts/make-rerank-bench-model.py) in the model cache,
# with the fixture scripts' virtualenv (scripts/lib/venv-embeddings.sh, created if missing). Prints the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/venv-embeddings.sh
. scripts/lib/venv-embeddings.sh
minilm="$(scripts/fetch-minilm.sh)"
out="$ANELM_MODELS_DIR/bench/minilm-cross-encoder"
mkdir -p "$out"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-rerank-bench-model.py "$minilm" "$out" 2>/dev/null | tail -n 1
