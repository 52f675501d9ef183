#!/usr/bin/env python3
"""Convert a (tiny) Qwen3.5 safetensors directory to a GGUF file in llama.cpp's `qwen35` layout.

Lays the tensors out as llama.cpp's converter (convert_hf_to_gguf.py, Qwen3_5TextModel) does, so
anelm's GGUF path for Qwen3.5 can be tested without downloading a real model:

- llama.cpp's tensor names (`blk.N.attn_qkv`, `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`,
  `ssm_dt.bias`, `ssm_conv1d`, `ssm_norm`, `ssm_out`; `attn_q` … for the attention layers);
- the value heads of the linear-attention layers in *tiled* order: Hugging Face groups them by
  key head (`[g0v0, g0v1, …, g1v0, …]`), llama.cpp tiles them (`[g0v0, g1v0, …, g0v1, g1v1, …]`)
  in the V rows of `attn_qkv` and the V channels of `ssm_conv1d`, the rows of `attn_gate`,
  `ssm_alpha` and `ssm_beta`, the entries of `ssm_a` and `ssm_dt`, and the columns of `ssm_out`;
- `ssm_a = −exp(A_log)`; the conv weight squeezed to `[channels, kernel]`;
- every RMSNorm weight stored as `1 + w` except the gated norm of the linear-attention layers;
- `qwen35.*` metadata (layer kinds as `attention.recurrent_layers`, ssm sizes, partial RoPE
  dimension count, MRoPE sections).

All tensors are written as F32 (llama.cpp's `--outtype f32`). The fixtures have no tokenizer, so a
placeholder vocabulary (GPT-2's 256 byte symbols, then `<tN>`, one merge) is written to keep the
file complete and loadable by llama.cpp and anelm.
Multimodal checkpoints: the text model under `model.language_model.` is converted; vision and
`mtp.*` tensors are skipped (llama.cpp's `--no-mtp`).

Usage: python scripts/qwen35-to-gguf.py <safetensors dir> <out.gguf>
Needs numpy, safetensors and gguf (`pip install gguf`), e.g. the fixtures virtualenv of
scripts/make-hf-fixtures.sh.
"""

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

import gguf


def placeholder_vocabulary(vocab):
    """A byte-level BPE vocabulary of `vocab` tokens for a checkpoint without a tokenizer: GPT-2's
    256 byte symbols first (so any text tokenizes), then the one merge's result `Ġt`, then `<tN>`
    placeholders.
    llama.cpp refuses a gpt2 vocabulary without merges, and the `gguf` package silently drops an
    empty merges array, so at least one must be written."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    # The merge's result is a token too (tokenizers' BPE requires it).
    tokens = (symbols + ["Ġt"] + [f"<t{i}>" for i in range(257, max(vocab, 257))])[:vocab]
    return tokens, ["Ġ t"] if vocab > 256 else []


def text_config(cfg):
    return cfg.get("text_config", cfg)


def tiled(x, axis, n_k, per_k, width):
    """Value heads along `axis` from grouped-by-key-head to tiled order."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [n_k, per_k, width] + shape[axis + 1:])
    x = np.swapaxes(x, axis, axis + 1)
    return np.ascontiguousarray(x).reshape(shape)


def main(src, out):
    src = Path(src)
    cfg = text_config(json.loads((src / "config.json").read_text()))
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in tensors else "model."

    n_layers = cfg["num_hidden_layers"]
    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim", hidden // n_heads)
    layer_types = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval", 4)
    if layer_types is None:
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if len(layer_types) != n_layers:
        sys.exit(f"layer_types has {len(layer_types)} entries, num_hidden_layers is {n_layers}")
    n_k = cfg["linear_num_key_heads"]
    n_v = cfg["linear_num_value_heads"]
    dk = cfg["linear_key_head_dim"]
    dv = cfg["linear_value_head_dim"]
    if n_v % n_k:
        sys.exit("linear_num_value_heads must be a multiple of linear_num_key_heads")
    per_k = n_v // n_k
    rope = cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10_000_000.0))
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    sections += [0] * (4 - len(sections))
    vocab = cfg["vocab_size"]

    # Keys and value types as llama.cpp's converter writes them (spelled out: the PyPI `gguf`
    # package's writer lacks helpers for some of them).
    arch = "qwen35"
    w = gguf.GGUFWriter(out, arch)
    w.add_type("model")
    w.add_name(src.name)
    u32 = lambda key, v: w.add_uint32(f"{arch}.{key}", int(v))
    u32("block_count", n_layers)
    u32("context_length", cfg.get("max_position_embeddings", 262144))
    u32("embedding_length", hidden)
    u32("feed_forward_length", cfg["intermediate_size"])
    u32("attention.head_count", n_heads)
    u32("attention.head_count_kv", cfg.get("num_key_value_heads", n_heads))
    w.add_array(f"{arch}.rope.dimension_sections", [int(x) for x in sections])
    w.add_float32(f"{arch}.rope.freq_base", float(theta))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-6)))
    u32("attention.key_length", head_dim)
    u32("attention.value_length", head_dim)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    u32("ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    u32("ssm.state_size", dk)
    u32("ssm.group_count", n_k)
    u32("ssm.time_step_rank", n_v)
    u32("ssm.inner_size", dv * n_v)
    w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in layer_types])
    u32("full_attention_interval", interval)
    u32("rope.dimension_count", int(head_dim * partial))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    tokens, merges = placeholder_vocabulary(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * vocab)
    w.add_token_merges(merges)

    def get(name):
        t = tensors.get(prefix + name)
        if t is None:
            sys.exit(f"missing tensor {prefix + name}")
        return t.astype(np.float32)

    def put(name, data):
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))

    put("token_embd.weight", get("embed_tokens.weight"))
    if "lm_head.weight" in tensors and not cfg.get("tie_word_embeddings", False):
        put("output.weight", tensors["lm_head.weight"].astype(np.float32))
    put("output_norm.weight", get("norm.weight") + 1)
    for i, kind in enumerate(layer_types):
        lp = f"layers.{i}."
        b = f"blk.{i}."
        put(b + "attn_norm.weight", get(lp + "input_layernorm.weight") + 1)
        put(b + "post_attention_norm.weight", get(lp + "post_attention_layernorm.weight") + 1)
        for hf, gg in [("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")]:
            put(b + gg + ".weight", get(lp + f"mlp.{hf}.weight"))
        if kind == "linear_attention":
            la = lp + "linear_attn."
            qkv = get(la + "in_proj_qkv.weight")
            qk = 2 * n_k * dk
            put(b + "attn_qkv.weight", np.concatenate([qkv[:qk], tiled(qkv[qk:], 0, n_k, per_k, dv)]))
            put(b + "attn_gate.weight", tiled(get(la + "in_proj_z.weight"), 0, n_k, per_k, dv))
            put(b + "ssm_beta.weight", tiled(get(la + "in_proj_b.weight"), 0, n_k, per_k, 1))
            put(b + "ssm_alpha.weight", tiled(get(la + "in_proj_a.weight"), 0, n_k, per_k, 1))
            # exp in f64, then rounded to f32: the correctly rounded value torch computes.
            neg_a = -np.exp(get(la + "A_log").astype(np.float64))
            put(b + "ssm_a", tiled(neg_a, 0, n_k, per_k, 1))
            put(b + "ssm_dt.bias", tiled(get(la + "dt_bias"), 0, n_k, per_k, 1))
            conv = get(la + "conv1d.weight").reshape(qkv.shape[0], -1)
            put(b + "ssm_conv1d.weight", np.concatenate([conv[:qk], tiled(conv[qk:], 0, n_k, per_k, dv)]))
            put(b + "ssm_norm.weight", get(la + "norm.weight"))
            put(b + "ssm_out.weight", tiled(get(la + "out_proj.weight"), 1, n_k, per_k, dv))
        else:
            sa = lp + "self_attn."
            for hf, gg in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
                put(b + gg + ".weight", get(sa + hf + ".weight"))
            put(b + "attn_q_norm.weight", get(sa + "q_norm.weight") + 1)
            put(b + "attn_k_norm.weight", get(sa + "k_norm.weight") + 1)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
