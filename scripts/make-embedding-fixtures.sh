#!/usr/bin/env bash
# Regenerate crates/anelm-engine/tests/fixtures/embeddings/minilm.json: sentence-transformers'
# embeddings and Hugging Face tokenizers' token ids of all-MiniLM-L6-v2 for a set of texts
# (scripts/make-embedding-fixtures.py), the reference crates/anelm-engine/tests/minilm.rs checks
# anelm against; and crates/anelm-engine/tests/fixtures/embeddings/qwen3-embedder/, a tiny
# random-weight Qwen3 decoder embedder with its reference.json
# (scripts/make-decoder-embedder-fixture.py, checked by tests/decoder_embedder.rs), and the same
# model as a GGUF in llama.cpp's layout with its pooling type (qwen3-embedder.gguf,
# scripts/make-decoder-embedder-gguf.py); and embeddinggemma/, a tiny random-weight EmbeddingGemma
# (bidirectional Gemma 3, mean pooling, two Dense modules; scripts/make-encoder-embedder-fixtures.py,
# and in llama.cpp's gemma-embedding GGUF layout as fixtures/gguf/embeddinggemma.gguf by
# scripts/embedder-to-gguf.py;
# checked by tests/embeddinggemma.rs); and modernbert/, a tiny random-weight ModernBERT embedder
# (the same script, checked by tests/modernbert.rs; its modern-bert GGUF by the same converter).
#
# Creates (once) a virtualenv under the user cache with pinned sentence-transformers, transformers
# and torch from PyPI. The PyPI torch wheel for Linux is a CUDA build whose import needs the CUDA
# runtime packages, so they come along (about 3 GB); everything runs on the CPU in fp32. The tests
# read the committed fixture and need none of this.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/venv-embeddings.sh
. scripts/lib/venv-embeddings.sh

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
gemma=crates/anelm-engine/tests/fixtures/embeddings/embeddinggemma
rm -rf "$gemma"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-encoder-embedder-fixtures.py embeddinggemma "$gemma"
"$venv/bin/python" scripts/embedder-to-gguf.py "$gemma" crates/anelm-engine/tests/fixtures/gguf/embeddinggemma.gguf
modern=crates/anelm-engine/tests/fixtures/embeddings/modernbert
rm -rf "$modern"
HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/make-encoder-embedder-fixtures.py modernbert "$modern"
"$venv/bin/python" scripts/embedder-to-gguf.py "$modern" crates/anelm-engine/tests/fixtures/gguf/modernbert.gguf
