#!/usr/bin/env python3
"""Write a random-weight mixture-of-experts model with Qwen3-30B-A3B's layer shapes and fewer
layers, for benchmarks against llama.cpp on the same file: a GGUF in llama.cpp's `qwen3moe` layout.

  make-qwen3moe-bench.py --out PATH [--layers 4] [--type Q8_0|Q4_0|F16] [--seed N]

Shapes (Qwen3-30B-A3B's config.json): hidden 2048, 32 query and 4 KV heads of 128 with q/k
RMSNorm, every layer a mixture of 128 experts of width 768 with 8 used per token (probabilities
renormalised, as llama.cpp's qwen3moe does), vocabulary 151,936, untied LM head, RoPE base 1e6.
Only the layer count differs (48 in the real model).

Weights: every matrix N(0, 1/fan_in) (activations keep their scale through the layers, and the
router's logits spread so different tokens pick different experts), RMSNorm weights near 1. The
matrices are stored in `--type` (quantised by the PyPI `gguf` package), norms and the router in
F32. Each tensor comes from its own seeded generator and is written as soon as it is made, so
memory stays near the largest tensor (one stacked expert projection, 128 × 768 × 2048).
The vocabulary is the placeholder of scripts/qwen35_gguf.py.
"""

import argparse
import sys
import zlib
from pathlib import Path

import gguf
import gguf.quants
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen35_gguf  # noqa: E402

ARCH = "qwen3moe"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, USED, EXPERT_FFN, VOCAB = 128, 8, 768, 151_936


def plan(layers):
    """(name, numpy shape, kind) in file order; kind is "matrix", "norm" or "router"."""
    t = [("token_embd.weight", (VOCAB, HIDDEN), "matrix")]
    for i in range(layers):
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", (HIDDEN,), "norm"),
            (b + "attn_q.weight", (HEADS * HEAD_DIM, HIDDEN), "matrix"),
            (b + "attn_k.weight", (KV_HEADS * HEAD_DIM, HIDDEN), "matrix"),
            (b + "attn_v.weight", (KV_HEADS * HEAD_DIM, HIDDEN), "matrix"),
            (b + "attn_q_norm.weight", (HEAD_DIM,), "norm"),
            (b + "attn_k_norm.weight", (HEAD_DIM,), "norm"),
            (b + "attn_output.weight", (HIDDEN, HEADS * HEAD_DIM), "matrix"),
            (b + "ffn_norm.weight", (HIDDEN,), "norm"),
            (b + "ffn_gate_inp.weight", (EXPERTS, HIDDEN), "router"),
            (b + "ffn_gate_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), "matrix"),
            (b + "ffn_up_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), "matrix"),
            (b + "ffn_down_exps.weight", (EXPERTS, HIDDEN, EXPERT_FFN), "matrix"),
        ]
    t += [("output_norm.weight", (HIDDEN,), "norm"), ("output.weight", (VOCAB, HIDDEN), "matrix")]
    return t


def values(name, shape, kind, seed):
    g = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if kind == "norm":
        return (1.0 + 0.1 * g.standard_normal(shape)).astype(np.float32)
    return (g.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", default="Q8_0", choices=["Q8_0", "Q4_0", "F16"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    qtype = getattr(gguf.GGMLQuantizationType, a.type)
    w = gguf.GGUFWriter(a.out, ARCH)
    w.add_type("model")
    w.add_name(f"qwen3moe-30b-a3b-shaped-L{a.layers}-random")
    u32 = lambda key, v: w.add_uint32(f"{ARCH}.{key}", int(v))
    u32("block_count", a.layers)
    u32("context_length", 4096)
    u32("embedding_length", HIDDEN)
    u32("feed_forward_length", 6144)
    u32("attention.head_count", HEADS)
    u32("attention.head_count_kv", KV_HEADS)
    u32("attention.key_length", HEAD_DIM)
    u32("attention.value_length", HEAD_DIM)
    u32("expert_count", EXPERTS)
    u32("expert_used_count", USED)
    u32("expert_feed_forward_length", EXPERT_FFN)
    w.add_float32(f"{ARCH}.rope.freq_base", 1_000_000.0)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    qwen35_gguf.add_placeholder_vocabulary(w, VOCAB)
    tensors = plan(a.layers)

    def stored(kind):
        return qtype if kind == "matrix" else gguf.GGMLQuantizationType.F32

    for name, shape, kind in tensors:
        t = stored(kind)
        block, size = gguf.GGML_QUANT_SIZES[t]
        n = int(np.prod(shape))
        w.add_tensor_info(name, shape, np.float32, n // block * size, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (name, shape, kind) in enumerate(tensors):
        v = values(name, shape, kind, a.seed)
        t = stored(kind)
        if t == gguf.GGMLQuantizationType.F32:
            data = v
        elif t == gguf.GGMLQuantizationType.F16:
            data = v.astype(np.float16)
        else:
            data = gguf.quants.quantize(v.reshape(-1, shape[-1]), t)
        w.write_tensor_data(np.ascontiguousarray(data))
        print(f"[{k + 1}/{len(tensors)}] {name}", file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()
