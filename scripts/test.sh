#!/usr/bin/env bash
# The whole test suite: fetch the default model, Gemma 3 270M and all-MiniLM-L6-v2 (about 330 MB,
# once; the cache keeps them) that the end-to-end tests need, set up the Python virtualenv with
# the official `openai` and `ollama` clients (server tests), then run every test of the workspace
# (release mode: the model tests run real forwards).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh >/dev/null
scripts/fetch-gemma3.sh >/dev/null
scripts/fetch-minilm.sh >/dev/null
ANELM_TEST_PYTHON="$(scripts/setup-test-env.sh | tail -n 1)"
export ANELM_TEST_PYTHON
cargo test --workspace --release "$@"
