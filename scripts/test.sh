#!/usr/bin/env bash
# The whole test suite: fetch the default model the end-to-end tests need, then run every test
# of the workspace (release mode: the model tests run real forwards).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh >/dev/null
cargo test --workspace --release "$@"
