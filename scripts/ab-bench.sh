#!/usr/bin/env bash
# Two anelm binaries on the same model, alternating single `anelm bench` runs (A, B, A, B, ...),
# so that a shared host's state changes hit both sides alike; prints each side's figures and
# median, and the median (with range) of the per-pair ratios B / A. For A/B-testing a change:
# build the binary before and after, copy each out of target/, then
#
#   scripts/ab-bench.sh --pairs 8 --model M.gguf A_BINARY B_BINARY [-- extra anelm bench args]
#
# Extra arguments default to `-p 0 -n 128` (single-stream decode); `-t 2 -r 1` are always passed
# and the last figure of each run is used.
set -euo pipefail
PAIRS=8 MODEL=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pairs) PAIRS="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] || { echo "usage: $0 [--pairs N] --model M A_BINARY B_BINARY [-- bench args]" >&2; exit 2; }
A="$1" B="$2"; shift 2
[[ "${1:-}" == "--" ]] && shift
EXTRA=("$@")
[[ ${#EXTRA[@]} -gt 0 ]] || EXTRA=(-p 0 -n 128)
[[ -f "$MODEL" ]] || { echo "no model file at '$MODEL' (--model)" >&2; exit 1; }
for bin in "$A" "$B"; do [[ -x "$bin" ]] || { echo "not an executable: $bin" >&2; exit 1; }; done
rate() {
  "$1" bench --model "$MODEL" -t 2 -r 1 --json "${EXTRA[@]}" | python3 -c 'import json,sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(rows[-1]["tok_s_median"])'
}
ra=() rb=()
for i in $(seq "$PAIRS"); do
  ra+=("$(rate "$A")")
  rb+=("$(rate "$B")")
  echo "pair $i/$PAIRS: ${ra[-1]} ${rb[-1]}" >&2
done
python3 - "${ra[*]}" "${rb[*]}" <<'PY'
import statistics as st, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
r = [y / x for x, y in zip(a, b)]
print("A tok/s:", ", ".join(f"{x:.1f}" for x in a), f"(median {st.median(a):.1f})")
print("B tok/s:", ", ".join(f"{x:.1f}" for x in b), f"(median {st.median(b):.1f})")
print(f"B / A per pair: median {st.median(r):.3f}, range {min(r):.3f}-{max(r):.3f}")
PY
