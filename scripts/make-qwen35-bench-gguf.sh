#!/usr/bin/env bash
# Make a random-weight Qwen3.5 with a real model's shapes for benchmarks (the mission's
# architecture without downloading a model): a GGUF in llama.cpp's `qwen35` layout in the requested
# type, or a Hugging Face directory of bf16 safetensors. Prints the path on its last line.
#
#   scripts/make-qwen35-bench-gguf.sh [--size 0.8b|4b] [--type Q4_K_M] [--seed N]
#
#   --size  0.8b (default): Qwen3.5-0.8B's shapes (hidden 1024, 24 layers, FFN 3584, 16+16
#           linear heads of 128, 8/2 attention heads of 256, vocabulary 248,320, tied);
#           4b: crates/anelm-cli/tests/fixtures/qwen3_5_4b/config.json.
#   --type  F16, or any type llama.cpp's llama-quantize takes (Q8_0, Q4_K_M, Q4_0, Q6_K, ...),
#           or hf-bf16 for a safetensors directory (the same weights as the GGUFs of that seed).
#
# Files go to ~/.cache/anelm/models/bench/ (qwen3.5-SIZE-shaped-random-TYPE.gguf) and are reused
# when present. A quantised type is made from the F16 GGUF by llama-quantize, built from the same
# llama-cpp-python sdist as llama-bench (scripts/lib/llama-cpp.sh); the F16 file is removed
# afterwards unless it was there before (make it first with --type F16 to keep it). Sizes: 0.8b
# F16 1.5 GB, Q8_0 0.8 GB, Q4_K_M 0.5 GB; 4b F16 ~8.5 GB. Weights are made and written one tensor
# at a time (scripts/make-qwen35-bench.py) in a cache virtualenv with numpy and gguf.
# Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=0.8b
TYPE=Q4_K_M
SEED=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) SIZE="$2"; shift 2 ;;
    --type) TYPE="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$SIZE" in
  0.8b) F16_GB=2 ;;
  4b) F16_GB=9 ;;
  *) echo "unknown size $SIZE (0.8b or 4b)" >&2; exit 2 ;;
esac
[[ "$SEED" =~ ^[0-9]+$ ]] || { echo "--seed must be a non-negative integer" >&2; exit 2; }

# shellcheck source=lib/model-cache.sh
. scripts/lib/model-cache.sh
# shellcheck source=lib/llama-cpp.sh
. scripts/lib/llama-cpp.sh
BENCH="$ANELM_MODELS_DIR/bench"
mkdir -p "$BENCH"
SUFFIX=""
[[ "$SEED" == 0 ]] || SUFFIX="-seed$SEED"
BASE="$BENCH/qwen3.5-$SIZE-shaped-random$SUFFIX"

# numpy and gguf, pinned, in their own small virtualenv.
VENV="$ANELM_CACHE_DIR/venv-gguf"
STAMP="$VENV/.anelm-numpy-2.4.6-gguf-0.19.0"
if [[ ! -f "$STAMP" ]]; then
  echo "creating $VENV (numpy, gguf)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "numpy==2.4.6" "gguf==0.19.0" >&2
  touch "$STAMP"
fi

# need_disk GB: refuse to start when the cache's file system has less free space than that.
need_disk() {
  local free
  free="$(df --output=avail -B1G "$BENCH" | tail -n 1 | tr -d ' ')"
  if (( free < $1 )); then
    echo "not enough disk space in $BENCH: ${free} GB free, ~$1 GB needed (df -h $BENCH)" >&2
    exit 1
  fi
}

# generate FORMAT OUT: run the generator into OUT.partial, then move it into place.
generate() {
  rm -rf "$2.partial"
  "$VENV/bin/python" scripts/make-qwen35-bench.py --size "$SIZE" --format "$1" --seed "$SEED" --out "$2.partial"
  mv "$2.partial" "$2"
}

if [[ "$TYPE" == hf-bf16 ]]; then
  OUT="$BASE-bf16"
  if [[ ! -d "$OUT" ]]; then
    need_disk $((F16_GB + 1))
    generate hf-bf16 "$OUT"
  fi
  echo "$OUT"
  exit 0
fi

F16="$BASE-F16.gguf"
OUT="$BASE-$TYPE.gguf"
if [[ -f "$OUT" ]]; then
  echo "$OUT"
  exit 0
fi
if [[ "$TYPE" == F16 ]]; then
  need_disk $((F16_GB + 1))
  generate gguf-f16 "$F16"
  echo "$OUT"
  exit 0
fi

QUANTIZE="$LLAMA_CPP_BUILD/bin/llama-quantize"
[[ -x "$QUANTIZE" ]] || llama_cpp_build llama-quantize
SOURCE="$F16"
if [[ ! -f "$F16" ]]; then
  need_disk $((2 * F16_GB + 1))
  SOURCE="$BASE-F16.gguf.tmp"
  rm -f "$SOURCE"
  generate gguf-f16 "$SOURCE"
  trap 'rm -f "$SOURCE"' EXIT
else
  need_disk $((F16_GB + 1))
fi
echo "quantising to $TYPE with $QUANTIZE" >&2
"$QUANTIZE" "$SOURCE" "$OUT.partial" "$TYPE" >"$OUT.log" 2>&1 || {
  echo "llama-quantize failed (log: $OUT.log)" >&2
  rm -f "$OUT.partial"
  exit 1
}
rm -f "$OUT.log"
mv "$OUT.partial" "$OUT"
echo "$OUT"
