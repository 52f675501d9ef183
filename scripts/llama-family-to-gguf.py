#!/usr/bin/env python3
"""Convert a (tiny) Qwen2, Qwen3-MoE, LFM2 or Phi-3 safetensors directory to a GGUF file in
llama.cpp's `qwen2`, `qwen3moe`, `lfm2` or `phi3` layout.

Lays the tensors out as llama.cpp's converter (convert_hf_to_gguf.py: Qwen2Model, Qwen3MoeModel)
does — no permutation of the q/k rows (both run NeoX rope), Qwen2's q/k/v biases as
`attn_{q,k,v}.bias`, Qwen3's q/k norms as `attn_{q,k}_norm`, LFM2's short convolutions as
`shortconv.{in_proj,conv,out_proj}` (the conv squeezed to [hidden, taps]), its per-layer KV head
counts with 0 for a conv layer and its final norm as `token_embd_norm`, Phi-3's fused projections
as `attn_qkv` and `ffn_up` (gate ‖ up), its rotated width as `rope.dimension_count`, its sliding
window, and its long-RoPE factors as the `rope_factors_{long,short}` tensors with
`rope.scaling.{original_context_length,attn_factor}` (Phi3MiniModel), each MoE layer's router as
`ffn_gate_inp` and its experts stacked into 3-D `ffn_{gate,up,down}_exps` tensors, the LM head
omitted when the embedding is tied — so anelm's GGUF path is tested against the same transformers
reference as the safetensors one. A layer with a dense FFN (`mlp_only_layers`) keeps
`ffn_{gate,up,down}` (llama.cpp's own qwen3moe has none). All tensors are written as F32; the
fixtures have no tokenizer, so the placeholder vocabulary of scripts/qwen35_gguf.py is written.

Usage: python scripts/llama-family-to-gguf.py <safetensors dir> <out.gguf>
Needs numpy, safetensors and gguf, e.g. the fixtures virtualenv of scripts/make-hf-fixtures.sh.
"""

import json
import math
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen35_gguf  # noqa: E402

ARCHES = {"qwen2": "qwen2", "qwen3_moe": "qwen3moe", "lfm2": "lfm2", "phi3": "phi3"}

LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    # Phi-3
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    # LFM2
    "operator_norm.weight": "attn_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
    "conv.conv.weight": "shortconv.conv.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf):
    if hf.startswith("@"):
        return hf[1:]
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "model.embedding_norm.weight":
        return "token_embd_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[:2] == ["model", "layers"]:
        return f"blk.{parts[2]}.{LAYER['.'.join(parts[3:])]}"
    raise KeyError(f"unexpected tensor {hf}")


def stack_experts(tensors, n_layers, n_experts):
    """Each MoE layer's per-expert matrices stacked into one [experts, rows, cols] tensor."""
    for i in range(n_layers):
        for proj, name in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            keys = [f"model.layers.{i}.mlp.experts.{e}.{proj}.weight" for e in range(n_experts)]
            if keys[0] not in tensors:
                continue
            tensors[f"@blk.{i}.{name}.weight"] = np.stack([tensors.pop(k) for k in keys])


def phi3_rope(w, cfg, rope, u32):
    """Phi3MiniModel's metadata and long-RoPE tensors."""
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head
    orig = cfg.get("original_max_position_embeddings") or rope["original_max_position_embeddings"]
    u32("rope.dimension_count", rope_dims)
    u32("rope.scaling.original_context_length", orig)
    u32("attention.sliding_window", cfg.get("sliding_window") or 0)
    long, short = rope.get("long_factor"), rope.get("short_factor")
    if not long:
        return
    scale = cfg["max_position_embeddings"] / orig
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    w.add_float32("phi3.rope.scaling.attn_factor", attn_factor)
    w.add_tensor("rope_factors_long.weight", np.asarray(long, dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.asarray(short, dtype=np.float32))


def main(src, out):
    src = Path(src)
    cfg = json.loads((src / "config.json").read_text())
    ARCH = ARCHES[cfg["model_type"]]
    tensors = load_file(str(src / "model.safetensors"))
    if cfg.get("tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    rope = cfg.get("rope_parameters") or {}
    n_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if n_experts:
        stack_experts(tensors, cfg["num_hidden_layers"], n_experts)
    w = gguf.GGUFWriter(out, ARCH)
    w.add_type("model")
    # llama.cpp gives a model named like Phi-3 the special tokens of Phi-3's own vocabulary
    # (`</s>`, ...), which the placeholder one lacks.
    w.add_name("tiny-random-phi" if ARCH == "phi3" else src.name)
    u32 = lambda key, v: w.add_uint32(f"{ARCH}.{key}", int(v))
    u32("block_count", cfg["num_hidden_layers"])
    u32("context_length", cfg.get("max_position_embeddings", 32768))
    u32("embedding_length", cfg["hidden_size"])
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    if ARCH != "lfm2":
        u32("feed_forward_length", cfg["intermediate_size"])
    u32("attention.head_count", cfg["num_attention_heads"])
    if ARCH == "lfm2":
        ffn = cfg["intermediate_size"]
        if cfg.get("block_auto_adjust_ff_dim", True):
            ffn = int(2 * ffn / 3)
            if cfg.get("block_ffn_dim_multiplier") is not None:
                ffn = int(cfg["block_ffn_dim_multiplier"] * ffn)
                m = cfg.get("block_multiple_of", 256)
                ffn = m * ((ffn + m - 1) // m)
        u32("feed_forward_length", ffn)
        w.add_array(f"{ARCH}.attention.head_count_kv",
                    [0 if t == "conv" else kv_heads for t in cfg["layer_types"]])
        u32("shortconv.l_cache", cfg.get("conv_L_cache", 3))
        u32("vocab_size", cfg["vocab_size"])
        tensors = {k: (v.reshape(v.shape[0], -1) if k.endswith("conv.conv.weight") else v) for k, v in tensors.items()}
    else:
        u32("attention.head_count_kv", kv_heads)
    w.add_float32(f"{ARCH}.rope.freq_base", float(rope.get("rope_theta", cfg.get("rope_theta", 1e6))))
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", cfg.get("norm_eps", 1e-6))))
    if "head_dim" in cfg:
        u32("attention.key_length", cfg["head_dim"])
        u32("attention.value_length", cfg["head_dim"])
    if ARCH == "phi3":
        phi3_rope(w, cfg, rope, u32)
    if n_experts:
        u32("expert_count", n_experts)
        u32("expert_used_count", cfg["num_experts_per_tok"])
        u32("expert_feed_forward_length", cfg["moe_intermediate_size"])
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    vocab = cfg["vocab_size"]
    qwen35_gguf.add_placeholder_vocabulary(w, vocab)
    for hf in sorted(tensors):
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(tensors[hf], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
