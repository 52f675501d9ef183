#!/usr/bin/env bash
# anelm vs llama.cpp on the same GGUF, same thread count, pp128 and tg128, 5 repetitions each,
# run alternately (llama.cpp, anelm, llama.cpp, anelm, ...) so both see the same machine state.
# Prints one markdown table with the ratio anelm / llama.cpp per figure, then anelm's tg figure
# against the memory-bandwidth bound: weight bytes streamed per token (the GGUF's matrices, as
# `anelm bench --json` reports them in `weight_bytes_per_token`) ÷ the
# streaming-read bandwidth, measured with the same thread count in every round
# (`cargo bench -p anelm-kernels --bench matmul -- --bandwidth-only`).
#
#   scripts/bench-vs-llamacpp.sh [--model M.gguf | --moe] [--threads N] [--rounds K] [--pp P] [--tg T]
#
# --pp / --tg set the prompt and generation lengths (default 128 each; 0 skips that test).
#
# --moe benchmarks the mixture-of-experts shape: a random-weight GGUF with Qwen3-30B-A3B's layer
# shapes and 4 layers, made (once) by scripts/make-qwen3moe-bench-gguf.sh.
#
# Builds llama-bench first if needed (scripts/build-llama-bench.sh; not part of CI). On a CPU with
# AMX (or with ANELM_LLAMACPP_BOTH_BUILDS=1) it builds and runs two llama.cpp builds, `native`
# (AMX on) and `noamx`, in every round: llama.cpp's AMX prefill crashes on some models, and its
# AMX decode is faster where it runs. A build that crashes on a test is noted, not fatal; each
# figure is the faster build's median, and the table names the build.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=""
THREADS=2
ROUNDS=3
PP=128
TG=128
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --moe) MODEL="$(scripts/make-qwen3moe-bench-gguf.sh | tail -n 1)"; shift ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --pp) PP="$2"; shift 2 ;;
    --tg) TG="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [[ -z "$MODEL" ]]; then
  MODEL="$(scripts/fetch-default-model.sh | tail -n 1)"
fi
[[ -f "$MODEL" ]] || { echo "no model file at $MODEL" >&2; exit 1; }
# shellcheck source=lib/llama-cpp.sh
. scripts/lib/llama-cpp.sh
VARIANTS=(native)
if llama_cpp_has_amx; then VARIANTS=(native noamx); fi
declare -A LLAMA_BENCH
for v in "${VARIANTS[@]}"; do
  LLAMA_BENCH[$v]="$(scripts/build-llama-bench.sh --variant "$v" | tail -n 1)"
done
cargo build --release --quiet -p anelm-cli
ANELM="${CARGO_TARGET_DIR:-target}/release/anelm"
BANDWIDTH="$(cargo bench --quiet -p anelm-kernels --bench matmul --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "matmul" and m.get("executable"):
        print(m["executable"])')"
[[ -x "$BANDWIDTH" ]] || { echo "could not build the bandwidth bench (cargo bench -p anelm-kernels --no-run)" >&2; exit 1; }
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    # pp and tg separately, so a crash in one leaves the other's figure.
    tests=()
    [[ "$PP" -gt 0 ]] && tests+=("-p $PP -n 0")
    [[ "$TG" -gt 0 ]] && tests+=("-p 0 -n $TG")
    for test in "${tests[@]}"; do
      echo "round $round/$ROUNDS: llama.cpp ($v build) $test" >&2
      # shellcheck disable=SC2086
      if ! "${LLAMA_BENCH[$v]}" -m "$MODEL" -t "$THREADS" $test -r 5 -o jsonl > "$OUT/run.jsonl" 2> "$OUT/run.err"; then
        echo "llama.cpp ($v build) failed on $test: $(tail -n 1 "$OUT/run.err")" >&2
        echo "$v $test" >> "$OUT/failed.txt"
      fi
      sed "s/^{/{\"anelm_build\": \"$v\", /" "$OUT/run.jsonl" >> "$OUT/llama.jsonl"
    done
  done
  echo "round $round/$ROUNDS: anelm" >&2
  "$ANELM" bench --model "$MODEL" -t "$THREADS" -p "$PP" -n "$TG" -r 5 --json >> "$OUT/anelm.jsonl"
  echo "round $round/$ROUNDS: streaming-read bandwidth" >&2
  "$BANDWIDTH" --threads "$THREADS" --bandwidth-only >> "$OUT/bandwidth.txt"
done
touch "$OUT/failed.txt"
python3 - "$OUT/llama.jsonl" "$OUT/anelm.jsonl" "$MODEL" "$THREADS" "$OUT/bandwidth.txt" "$OUT/failed.txt" "${VARIANTS[*]}" <<'PY'
import json, statistics, sys, platform, os
llama, anelm, model, threads, bandwidth, failed, variants = sys.argv[1:8]
variants = variants.split()
def collect(path, key):
    figs = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        test = key(r)
        rates = r.get("samples_ts") or r.get("tok_s") or []
        figs.setdefault(test, []).extend(rates)
    return figs
def llama_key(r):
    test = f"pp{r['n_prompt']}" if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0 else f"tg{r['n_gen']}"
    return (test, r.get("anelm_build", "native"))
by_build = collect(llama, llama_key)
# Each figure from the build that gives the higher median.
L, build_of = {}, {}
for (test, build), rates in by_build.items():
    if rates and (test not in L or statistics.median(rates) > statistics.median(L[test])):
        L[test], build_of[test] = rates, build
A = collect(anelm, lambda r: r["test"])
# Only the plain ppN/tgN figures (not "tgN xB" or "tgN generate"), which llama-bench has too.
A = {t: r for t, r in A.items() if " " not in t}
cpu = "unknown CPU"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip(); break
except OSError:
    pass
print(f"model: {os.path.basename(model)}, threads: {threads}, machine: {cpu} ({os.cpu_count()} logical CPUs), {platform.system()}")
print()
if len(variants) > 1:
    print(f"llama.cpp builds: {', '.join(variants)} (each figure from the faster one that ran)")
    for line in filter(str.strip, open(failed)):
        print(f"- llama.cpp's {line.split()[0]} build failed on `{' '.join(line.split()[1:])}`")
    for (test, build), rates in sorted(by_build.items()):
        if rates:
            print(f"- {build} build {test}: median {statistics.median(rates):.1f} t/s ({len(rates)} runs)")
    print()
print("| test | llama.cpp t/s (median, n, build) | anelm t/s (median, n) | anelm / llama.cpp |")
print("| --- | ---: | ---: | ---: |")
for test in sorted(set(L) | set(A)):
    l, a = L.get(test, []), A.get(test, [])
    lm = statistics.median(l) if l else float("nan")
    am = statistics.median(a) if a else float("nan")
    print(f"| {test} | {lm:.1f} ({len(l)}, {build_of.get(test, '-')}) | {am:.1f} ({len(a)}) | {am / lm:.2f}× |")

bws = [float(x) for x in open(bandwidth) if x.strip()]
tg = [t for t in A if t.startswith("tg")]
if bws and tg:
    bw = statistics.median(bws)
    per_token = next((r["weight_bytes_per_token"] for r in map(json.loads, filter(str.strip, open(anelm)))
                      if r.get("weight_bytes_per_token")), None)
    assert per_token, "anelm bench did not report weight_bytes_per_token (a GGUF model is needed)"
    rate = statistics.median(A[tg[0]])
    print()
    print(f"Bandwidth bound: {per_token / 1e6:.1f} MB of weights per token, streaming read {bw:.1f} GB/s "
          f"(median of {len(bws)}: {', '.join(f'{x:.1f}' for x in bws)}) -> {bw * 1e9 / per_token:.0f} tok/s; "
          f"anelm {tg[0]} {rate:.1f} tok/s = {rate * per_token / 1e9:.1f} GB/s = "
          f"{100 * rate * per_token / (bw * 1e9):.0f} % of the bound")
    # The host's bandwidth can change between rounds (a shared VM): each round's tg median
    # against the streaming read measured right after it, too.
    rounds = [statistics.median(r.get("samples_ts") or r.get("tok_s") or [0])
              for r in map(json.loads, filter(str.strip, open(anelm))) if r.get("test") == tg[0]]
    per_round = [100 * t * per_token / (b * 1e9) for t, b in zip(rounds, bws)]
    if per_round:
        print(f"Per round (tg median / that round's bound): {', '.join(f'{x:.0f} %' for x in per_round)}; "
              f"median {statistics.median(per_round):.0f} %")
PY
