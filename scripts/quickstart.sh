#!/usr/bin/env bash
# One command from a fresh clone to generated text: fetch the default model, build anelm,
# and ask it a question. Extra arguments replace the prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh >/dev/null
cargo build --release --quiet -p anelm-cli
prompt="${*:-Why is the sky blue?}"
exec target/release/anelm generate "$prompt"
