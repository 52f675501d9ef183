#!/usr/bin/env bash
# Serving throughput, anelm against llama.cpp's `llama-server`, on the same GGUF and threads:
# both servers run as their own processes with 4 slots (`anelm serve --sessions 4`,
# `llama-server -np 4`), and the same client (`anelm bench --url`, streaming /v1/completions with
# ignore_eos, temperature 0) measures each at concurrency 1 and 4, one round of each engine after
# the other, so a shared host's drift hits both alike. Prints per-round figures, then the medians
# (with ranges) and the median of the per-round ratios.
#
#   scripts/bench-serve-vs-llama-server.sh [--model GGUF] [--threads 2] [--rounds 3]
#                                          [--requests 16] [--tokens 128] [--json-out FILE]
#
# llama-server is built once from the llama-cpp-python sdist (scripts/lib/llama-cpp.sh), as for
# llama-bench. Needs python3 for the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="" THREADS=2 ROUNDS=3 REQUESTS=16 TOKENS=128 JSON_OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --json-out) JSON_OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$MODEL" ]] || MODEL="$(scripts/fetch-default-model.sh | tail -n 1)"
[[ -f "$MODEL" ]] || { echo "no model file at $MODEL" >&2; exit 1; }
# shellcheck source=lib/llama-cpp.sh
. scripts/lib/llama-cpp.sh
SERVER="$LLAMA_CPP_BUILD/bin/llama-server"
[[ -x "$SERVER" ]] || llama_cpp_build llama-server
cargo build --release -q -p anelm-cli
ANELM="${CARGO_TARGET_DIR:-target}/release/anelm"
CTX=$((TOKENS + 256))
LP=18471
AP=18472
pids=()
tmp=$(mktemp -d)
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
wait_up() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "nothing healthy on port $1" >&2
  exit 1
}
"$SERVER" -m "$MODEL" --port "$LP" -t "$THREADS" -np 4 -c $((4 * CTX)) >"$tmp/llama-server.log" 2>&1 &
pids+=($!)
"$ANELM" serve --model "$MODEL" --port "$AP" -t "$THREADS" --sessions 4 --ctx-size "$CTX" >"$tmp/anelm.log" 2>&1 &
pids+=($!)
wait_up "$LP"
wait_up "$AP"
for r in $(seq 1 "$ROUNDS"); do
  for engine in llama-server anelm; do
    port=$LP
    [[ "$engine" == anelm ]] && port=$AP
    echo "round $r/$ROUNDS: $engine" >&2
    "$ANELM" bench --url "127.0.0.1:$port" --concurrency 1,4 --requests "$REQUESTS" --tokens "$TOKENS" \
      --json-out "$tmp/$engine-$r.json" >/dev/null
  done
done
python3 - "$tmp" "$ROUNDS" "$MODEL" "$THREADS" "$JSON_OUT" <<'PYEOF'
import json, statistics, sys
tmp, rounds, model, threads, json_out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def level(engine, r, c):
    d = json.load(open(f"{tmp}/{engine}-{r}.json"))
    return next(l["aggregate_tok_s"] for l in d["levels"] if l["concurrency"] == c and not l.get("json_schema"))
out = {"model": model, "threads": int(threads), "rounds": rounds, "levels": []}
print(f"model {model}, {threads} threads, {rounds} rounds (engines alternating per round)\n")
print("| concurrency | llama-server tok/s | anelm tok/s | anelm / llama-server (median of per-round ratios) |")
print("| ---: | ---: | ---: | ---: |")
for c in (1, 4):
    l = [level("llama-server", r, c) for r in range(1, rounds + 1)]
    a = [level("anelm", r, c) for r in range(1, rounds + 1)]
    ratio = statistics.median(x / y for x, y in zip(a, l))
    out["levels"].append({"concurrency": c, "llama_server_tok_s": l, "anelm_tok_s": a, "ratio": ratio})
    print(f"| {c} | {statistics.median(l):.1f} ({min(l):.0f}–{max(l):.0f}) "
          f"| {statistics.median(a):.1f} ({min(a):.0f}–{max(a):.0f}) | {ratio:.2f}× |")
if json_out:
    json.dump(out, open(json_out, "w"), indent=1)
PYEOF
