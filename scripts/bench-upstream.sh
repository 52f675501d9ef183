#!/usr/bin/env bash
# What anelm's forwarding adds to an upstream: the serving benchmark (`anelm bench
# --concurrency`) against an upstream engine directly and through `anelm serve --upstream`,
# alternating per round, same machine. The upstream is a second `anelm serve` on loopback
# (point UPSTREAM_URL at another engine, e.g. llama-server or vLLM, to measure that instead).
#
#   scripts/bench-upstream.sh [--rounds K] [--concurrency 1,4] [--tokens N]
#
# Prints, per concurrency, TTFT p50 and aggregate tok/s direct and through anelm (medians of
# the rounds) and their ratio. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
CONC=1,4
TOKENS=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --concurrency) CONC="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
scripts/fetch-default-model.sh >/dev/null
cargo build --release -q -p anelm-cli
ANELM=target/release/anelm
UP_PORT=18441
FRONT_PORT=18442
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
wait_healthy() { for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "server on $1 not healthy" >&2; exit 1; }
UPSTREAM_URL="${UPSTREAM_URL:-}"
if [[ -z "$UPSTREAM_URL" ]]; then
  "$ANELM" serve --port "$UP_PORT" --sessions 4 --model-id up >/dev/null 2>&1 &
  pids+=($!)
  wait_healthy "$UP_PORT"
  UPSTREAM_URL="http://127.0.0.1:$UP_PORT/v1"
fi
"$ANELM" serve --port "$FRONT_PORT" --sessions 1 -t 1 --upstream "big=$UPSTREAM_URL" >/dev/null 2>&1 &
pids+=($!)
wait_healthy "$FRONT_PORT"
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS: direct" >&2
  "$ANELM" bench --url "$UPSTREAM_URL" --concurrency "$CONC" --tokens "$TOKENS" --json-out "$tmp/direct-$r.json" >/dev/null
  echo "round $r/$ROUNDS: through anelm" >&2
  "$ANELM" bench --url "http://127.0.0.1:$FRONT_PORT" --request-model big --concurrency "$CONC" --tokens "$TOKENS" \
    --json-out "$tmp/through-$r.json" >/dev/null
done
python3 - "$tmp" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def load(kind):
    return [json.load(open(f"{tmp}/{kind}-{r}.json"))["levels"] for r in range(1, rounds + 1)]
direct, through = load("direct"), load("through")
print(f"medians of {rounds} alternating rounds\n")
print("| concurrency | TTFT p50 direct | through anelm | + ms | aggregate tok/s direct | through anelm | × |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for i, lvl in enumerate(direct[0]):
    med = lambda runs, key: statistics.median(run[i][key] for run in runs)
    td, tt = med(direct, "ttft_p50_s") * 1e3, med(through, "ttft_p50_s") * 1e3
    ad, at = med(direct, "aggregate_tok_s"), med(through, "aggregate_tok_s")
    print(f"| {lvl['concurrency']} | {td:.1f} ms | {tt:.1f} ms | {tt - td:+.1f} | {ad:.1f} | {at:.1f} | {at / ad:.3f} |")
PYEOF
