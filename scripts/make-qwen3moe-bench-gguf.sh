#!/usr/bin/env bash
# Make a random-weight mixture-of-experts GGUF with Qwen3-30B-A3B's layer shapes (128 experts of
# 768, 8 used, hidden 2048, 32/4 heads of 128) and fewer layers, in llama.cpp's `qwen3moe`
# layout, for scripts/bench-vs-llamacpp.sh. Prints the path on its last line.
#
#   scripts/make-qwen3moe-bench-gguf.sh [--layers 4] [--type Q8_0|Q4_0|F16] [--seed N]
#
# Files go to ~/.cache/anelm/models/bench/qwen3moe-30b-a3b-shaped-LN-random-TYPE.gguf and are
# reused when present (4 layers Q8_0: ~3.3 GB). Made by scripts/make-qwen3moe-bench.py in a cache
# virtualenv with numpy and gguf. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS=4
TYPE=Q8_0
SEED=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layers) LAYERS="$2"; shift 2 ;;
    --type) TYPE="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ "$LAYERS" =~ ^[1-9][0-9]*$ ]] || { echo "--layers must be a positive integer" >&2; exit 2; }
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "--seed must be a non-negative integer" >&2; exit 2; }
case "$TYPE" in Q8_0|Q4_0|F16) ;; *) echo "--type must be Q8_0, Q4_0 or F16" >&2; exit 2 ;; esac
# shellcheck source=lib/model-cache.sh
. scripts/lib/model-cache.sh
BENCH="$ANELM_MODELS_DIR/bench"
mkdir -p "$BENCH"
SUFFIX=""
[[ "$SEED" == 0 ]] || SUFFIX="-seed$SEED"
OUT="$BENCH/qwen3moe-30b-a3b-shaped-L$LAYERS-random$SUFFIX-$TYPE.gguf"
if [[ ! -f "$OUT" ]]; then
  GGUF_VERSION="0.19.0"
  venv="$ANELM_CACHE_DIR/venv-gguf"
  if ! [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("gguf"))' 2>/dev/null)" = "$GGUF_VERSION" ]; then
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==$GGUF_VERSION" numpy
  fi
  "$venv/bin/python" scripts/make-qwen3moe-bench.py --out "$OUT.tmp" --layers "$LAYERS" --type "$TYPE" --seed "$SEED"
  mv "$OUT.tmp" "$OUT"
fi
echo "$OUT"
