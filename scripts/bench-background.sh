#!/usr/bin/env bash
# What `anelm serve --background` leaves to the user's foreground work: the throughput of a
# foreground CPU job (one busy loop per core, counting iterations) measured alone, beside
# `anelm serve` under a steady load at normal priority, and beside it with --background.
# Each phase runs SECONDS seconds; phases alternate over ROUNDS rounds and the script prints
# the median per phase with the range.
#
#   scripts/bench-background.sh [--seconds S] [--rounds K]
#
# Builds target/release/anelm if needed and uses the default model. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_PHASE=10
ROUNDS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_PER_PHASE="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
scripts/fetch-default-model.sh >/dev/null
cargo build --release -q -p anelm-cli
ANELM=target/release/anelm
CORES=$(nproc)
PORT=18431

# The foreground job: CORES busy processes for S seconds; prints total iterations per second.
foreground() {
  python3 - "$CORES" "$SECONDS_PER_PHASE" <<'PYEOF'
import multiprocessing as mp, sys, time
cores, secs = int(sys.argv[1]), float(sys.argv[2])
def work(q):
    n, end = 0, time.monotonic() + secs
    while time.monotonic() < end:
        for _ in range(10000):
            n += 1
    q.put(n)
q = mp.Queue()
ps = [mp.Process(target=work, args=(q,)) for _ in range(cores)]
[p.start() for p in ps]
total = sum(q.get() for _ in ps)
[p.join() for p in ps]
print(f"{total / secs:.0f}")
PYEOF
}

# Start a server (with the given extra flags) and a load generator against it; echo their pids.
start_loaded() {
  "$ANELM" serve --port "$PORT" --sessions 4 -t "$CORES" "$@" >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  ( while true; do "$ANELM" bench --url "http://127.0.0.1:$PORT" --concurrency 4 --requests 8 --tokens 64 \
      >/dev/null 2>&1 || true; done ) &
  local load=$!
  sleep 2
  echo "$server $load"
}

# Stop the load generator, then the server, and wait until the server is gone (at most 30 s).
stop() {
  kill "$2" 2>/dev/null || true
  pkill -P "$2" 2>/dev/null || true
  kill "$1" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$1" 2>/dev/null || true
}

declare -a alone normal background
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS: alone" >&2
  alone+=("$(foreground)")
  echo "round $r/$ROUNDS: beside anelm serve (normal priority)" >&2
  read -r s l < <(start_loaded)
  normal+=("$(foreground)")
  stop "$s" "$l"
  echo "round $r/$ROUNDS: beside anelm serve --background" >&2
  read -r s l < <(start_loaded --background)
  background+=("$(foreground)")
  stop "$s" "$l"
done

stats() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {printf "%d (%d–%d)", a[int((NR+1)/2)], a[1], a[NR]}'; }
base=$(printf '%s\n' "${alone[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo
echo "foreground job: $CORES busy processes, ${SECONDS_PER_PHASE} s per phase, medians of $ROUNDS rounds (range)"
echo
echo "| phase | iterations/s | × alone |"
echo "| --- | ---: | ---: |"
for phase in alone normal background; do
  declare -n v=$phase
  med=$(printf '%s\n' "${v[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  label=$phase
  [[ $phase == normal ]] && label="beside anelm serve"
  [[ $phase == background ]] && label="beside anelm serve --background"
  printf '| %s | %s | %s |\n' "$label" "$(stats "${v[@]}")" "$(awk -v m="$med" -v b="$base" 'BEGIN {printf "%.2f", m / b}')"
done
