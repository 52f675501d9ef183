#!/usr/bin/env bash
# Speculative decoding by prompt lookup against plain decoding, on real prompts of the kinds the
# background workload runs (rewriting, extraction, code edits, summaries, classification):
# `anelm generate --temp 0` per prompt with `--speculate off` and `--speculate lookup`, the two
# alternating (off, lookup, off, lookup, ...) so a shared host's state changes hit both alike.
# Prints per prompt the median generation tokens/s of each side with its range, the ratio, the
# acceptance rate and tokens per pass, and fails if the greedy texts ever differ.
#
#   scripts/bench-speculate.sh [--model M.gguf] [--rounds N] [--tokens N] [--threads N] [-- extra generate args]
#   scripts/bench-speculate.sh [--model M.gguf] [--rounds N] --server
#
# With --server the same prompts go through `anelm serve` (one session, streamed, greedy), each
# request choosing `"speculate": "off"` or `"lookup"`, alternating; tokens/s from the first
# streamed token to the last, texts compared, and the server's draft counters printed.
#
# Defaults: the default model (scripts/fetch-default-model.sh), 5 rounds, 128 tokens, 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="" ROUNDS=5 TOKENS=128 THREADS=2 SERVER=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --server) SERVER=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$MODEL" ]] || MODEL="$(scripts/fetch-default-model.sh)"
[[ -f "$MODEL" ]] || { echo "no model file at '$MODEL' (--model)" >&2; exit 1; }
cargo build --release -q -p anelm-cli
if [[ "$SERVER" == 1 ]]; then
  exec python3 scripts/bench-speculate/run.py ./target/release/anelm "$MODEL" "$ROUNDS" "$TOKENS" "$THREADS" --server
fi
exec python3 scripts/bench-speculate/run.py ./target/release/anelm "$MODEL" "$ROUNDS" "$TOKENS" "$THREADS" "$@"
