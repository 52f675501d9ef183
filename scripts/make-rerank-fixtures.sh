#!/usr/bin/env bash
# Regenerate crates/anelm-engine/tests/fixtures/rerank/: a tiny random-weight cross-encoder
# (BertForSequenceClassification, one label) with sentence-transformers' CrossEncoder scores, a
# 3-label sequence classifier with transformers' probabilities, and a tiny random Qwen3 yes/no
# reranker with transformers' P(yes) in Qwen3-Reranker's prompt format, and the same two
# sequence classifiers on a ModernBERT trunk (scripts/make-rerank-fixtures.py; checked by crates/anelm-engine/tests/rerank.rs).
#
# Uses the virtualenv of scripts/make-embedding-fixtures.sh (pinned torch, transformers and
# sentence-transformers from PyPI), creating it once. The tests read the committed fixtures and
# need none of this.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/venv-embeddings.sh
. scripts/lib/venv-embeddings.sh

out=crates/anelm-engine/tests/fixtures/rerank
rm -rf "$out"
mkdir -p "$out"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-rerank-fixtures.py "$out"
# Files the loaders do not read (generation defaults, model cards).
rm -f "$out"/*/generation_config.json "$out"/*/README.md
