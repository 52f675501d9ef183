#!/usr/bin/env bash
# The whole test suite: fetch the default model the end-to-end tests need, set up the Python
# virtualenv with the official `openai` client (server tests), then run every test of the
# workspace (release mode: the model tests run real forwards).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh >/dev/null
ANELM_TEST_PYTHON="$(scripts/setup-test-env.sh | tail -n 1)"
export ANELM_TEST_PYTHON
cargo test --workspace --release "$@"
