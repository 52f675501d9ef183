#!/usr/bin/env bash
# Issue 35's benchmarks: interactive time to first token idle vs during a full batch, a batch
# through the Batch API vs the same lines from a client at full concurrency, and time to first
# token for a long shared system prompt cold / warm / after a restart (with and without the
# on-disk prompt cache). Medians with ranges over the rounds.
#
#   scripts/bench-batch.sh [--model PATH] [--json-out FILE] [bench_batch.py options]
#
# Default model: SmolLM2-135M-Instruct Q4_1 (fetched if needed). For a Qwen3.5 GGUF, make one with
# scripts/make-qwen35-bench-gguf.sh and pass it with --model. Builds target/release/anelm; uses
# the test virtualenv's openai client. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=""
PASS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
if [[ -z "$MODEL" ]]; then
  MODEL=$(scripts/fetch-default-model.sh | tail -n 1)
fi
PY=$(scripts/setup-test-env.sh | tail -n 1)
cargo build --release -q -p anelm-cli
exec "$PY" scripts/bench_batch.py target/release/anelm "$MODEL" "${PASS[@]}"
