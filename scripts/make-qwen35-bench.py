#!/usr/bin/env python3
"""Write a random-weight Qwen3.5 with a real model's shapes, for benchmarks: as an F16 GGUF in
llama.cpp's `qwen35` layout (then `llama-quantize` makes any other type), or as a Hugging Face
directory with bf16 safetensors (how Qwen3.5 ships).

  make-qwen35-bench.py --size 0.8b|4b --format gguf-f16|hf-bf16 --out PATH [--seed N]

Shapes: `4b` is crates/anelm-cli/tests/fixtures/qwen3_5_4b/config.json (Qwen3.5-4B's text config);
`0.8b` is that config with Qwen3.5-0.8B's sizes (hidden 1024, 24 layers, FFN 3584, 16 key and 16
value heads of 128 in the linear-attention layers, 8 query and 2 KV heads of 256 in the attention
layers, every 4th layer full attention, vocabulary 248,320, tied embeddings).

Weights: every matrix N(0, 1/fan_in) (so activations keep their scale through the layers and the
quantisers see the value spread of trained weights), the short conv N(0, 1/kernel), RMSNorm
weights near their neutral value, `A_log` = log U(1, 16) and `dt_bias` = 1 (transformers'
initialisation). Each tensor comes from its own seeded generator and is rounded to bf16, so the
GGUF and the safetensors directory made with the same seed hold the same values (bf16 values are
exact in f16 down to f16's subnormal range). Tensors are made and written one at a time, so memory
stays near the largest tensor (the embedding) whatever the model's size.

The vocabulary is the placeholder of scripts/qwen35_gguf.py (GPT-2's 256 byte symbols, one merge,
then `<tN>`); the directory gets the same vocabulary as a byte-level BPE tokenizer.json.
Needs numpy and gguf (scripts/make-qwen35-bench-gguf.sh installs them in a cache virtualenv).
"""

import argparse
import json
import sys
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen35_gguf  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG_4B = REPO / "crates/anelm-cli/tests/fixtures/qwen3_5_4b/config.json"
SIZES_0_8B = {
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
}


def config(size):
    """The text config of the requested size, in the shape transformers' Qwen3_5TextConfig reads."""
    cfg = dict(qwen35_gguf.text_config(json.loads(CONFIG_4B.read_text())))
    if size == "0.8b":
        cfg.update(SIZES_0_8B)
    elif size != "4b":
        raise SystemExit(f"unknown size {size!r} (0.8b or 4b)")
    cfg["model_type"] = "qwen3_5_text"
    cfg["architectures"] = ["Qwen3_5ForCausalLM"]
    cfg["layer_types"] = qwen35_gguf.layer_types(cfg)
    cfg["rope_parameters"] = {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "partial_rotary_factor": cfg.pop("partial_rotary_factor", 0.25),
        "rope_theta": cfg.pop("rope_theta", 10_000_000.0),
        "rope_type": "default",
    }
    cfg["tie_word_embeddings"] = True
    cfg["hidden_act"] = "silu"
    cfg["dtype"] = "bfloat16"
    return cfg


def to_bf16_bits(x):
    """f32 → bf16 bit patterns, rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def random_tensor(name, shape, seed):
    """One tensor of the random model (f32 holding bf16 values); the same name and seed always
    give the same values."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("A_log"):
        x = np.log(rng.uniform(1.0, 16.0, size=shape)).astype(np.float32)
    elif name.endswith("dt_bias"):
        x = np.ones(shape, dtype=np.float32)
    elif name.endswith("linear_attn.norm.weight"):
        # The gated norm multiplies by w itself.
        x = 1 + 0.02 * rng.standard_normal(shape, dtype=np.float32)
    elif len(shape) == 1:
        # Every other RMSNorm multiplies by (1 + w).
        x = 0.02 * rng.standard_normal(shape, dtype=np.float32)
    else:
        fan_in = shape[-1]
        x = rng.standard_normal(shape, dtype=np.float32)
        x *= np.float32(1 / np.sqrt(fan_in))
    return bf16_bits_to_f32(to_bf16_bits(x))


def tokenizer_json(vocab):
    tokens, merges = qwen35_gguf.placeholder_vocabulary(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }


def write_safetensors(path, shapes, make):
    """A bf16 safetensors file, written tensor by tensor (header first: every size is known)."""
    header, offset = {}, 0
    names = sorted(shapes)
    for name in names:
        nbytes = int(np.prod(shapes[name])) * 2
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for i, name in enumerate(names):
            f.write(to_bf16_bits(make(name)).tobytes())
            if (i + 1) % 50 == 0 or i + 1 == len(names):
                print(f"{i + 1}/{len(names)} tensors written", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", required=True, choices=["0.8b", "4b"])
    ap.add_argument("--format", required=True, choices=["gguf-f16", "hf-bf16"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = config(a.size)
    shapes = qwen35_gguf.hf_tensor_shapes(cfg, tied=True)
    make = lambda name: random_tensor(name, shapes[name], a.seed)
    name = f"Qwen3.5-{a.size}-shaped-random"
    if a.format == "gguf-f16":
        def progress(i, n, t):
            if i == n or t.endswith(".attn_norm.weight"):
                print(f"{i}/{n} tensors written ({t})", file=sys.stderr)

        qwen35_gguf.write(a.out, cfg, name, shapes, make, has_output=False, float_type="f16", progress=progress)
    else:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(cfg["vocab_size"]), ensure_ascii=False))
        prefixed = {f"model.{k}": v for k, v in shapes.items()}
        write_safetensors(out / "model.safetensors", prefixed, lambda n: random_tensor(n[len("model."):], prefixed[n], a.seed))


if __name__ == "__main__":
    main()
