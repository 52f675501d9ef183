#!/usr/bin/env python3
"""Convert a (tiny) EmbeddingGemma or ModernBERT sentence-transformers directory to a GGUF file in
llama.cpp's `gemma-embedding` or `modern-bert` layout.

Lays the tensors out as llama.cpp's converter (convert_hf_to_gguf.py: EmbeddingGemma, run with
--sentence-transformers-dense-modules; ModernBertModel) does. EmbeddingGemma: Gemma 3's names with
every RMSNorm weight stored as `1 + w`, the sliding window as config.json gives it (llama.cpp's
symmetric window reaches half of it either side), which layers slide as
`attention.sliding_window_pattern` flags, and the Dense modules `2_Dense` / `3_Dense` as
`dense_2.weight` / `dense_3.weight` with their `dense_{2,3}_feat_{in,out}` widths. ModernBERT:
`local_attention` as the sliding window, `global_attn_every_n_layers` as the pattern (a global
layer every n-th from the first), the two RoPE bases, the fused `attn_qkv` and `ffn_up` (GeGLU's
input ‖ gate), the embeddings' LayerNorm as `token_embd_norm`, `hidden_activation`. Both
bidirectional (`attention.causal` false) with mean pooling as `pooling_type` 1. All tensors are
written as F32; the vocabulary is the placeholder of scripts/qwen35_gguf.py (the tests feed token
ids).

Usage: python scripts/embedder-to-gguf.py <sentence-transformers dir> <out.gguf>
Needs numpy, safetensors and gguf, e.g. the virtualenv of scripts/lib/venv-embeddings.sh.
"""

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen35_gguf  # noqa: E402

GEMMA_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


MODERNBERT_LAYER = {
    "attn_norm.weight": "attn_norm.weight",
    "attn.Wqkv.weight": "attn_qkv.weight",
    "attn.Wo.weight": "attn_output.weight",
    "mlp_norm.weight": "ffn_norm.weight",
    "mlp.Wi.weight": "ffn_up.weight",
    "mlp.Wo.weight": "ffn_down.weight",
}

TOP = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embeddings.tok_embeddings.weight": "token_embd.weight",
    "embeddings.norm.weight": "token_embd_norm.weight",
    "final_norm.weight": "output_norm.weight",
}


def gguf_name(hf, layer):
    hf = hf.removeprefix("model.")
    if hf in TOP:
        return TOP[hf]
    parts = hf.split(".")
    if parts[0] == "layers":
        return f"blk.{parts[1]}.{layer['.'.join(parts[2:])]}"
    raise KeyError(f"unexpected tensor {hf}")


def gemma_parameters(w, src, cfg, tensors, u32, f32):
    """EmbeddingGemma's metadata and Dense modules."""
    rope = cfg.get("rope_parameters") or {}
    u32("attention.head_count_kv", cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    u32("attention.key_length", cfg["head_dim"])
    u32("attention.value_length", cfg["head_dim"])
    f32("attention.layer_norm_rms_epsilon", cfg.get("rms_norm_eps", 1e-6))
    f32("rope.freq_base", rope.get("full_attention", {}).get("rope_theta", 1e6))
    f32("rope.freq_base_swa", rope.get("sliding_attention", {}).get("rope_theta", 1e4))
    u32("attention.sliding_window", cfg["sliding_window"])
    w.add_array(f"{w.arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg["layer_types"]])
    for i, module in enumerate(["2_Dense", "3_Dense"]):
        dense_cfg = json.loads((src / module / "config.json").read_text())
        if dense_cfg.get("bias"):
            sys.exit(f"error: {module} has a bias, which llama.cpp's Dense layers do not take")
        name = f"dense_{i + 2}"
        u32(f"{name}_feat_in", dense_cfg["in_features"])
        u32(f"{name}_feat_out", dense_cfg["out_features"])
        tensors[f"@{name}.weight"] = load_file(str(src / module / "model.safetensors"))["linear.weight"]


def modernbert_parameters(w, cfg, u32, f32):
    """ModernBERT's metadata (ModernBertModel, BertModel)."""
    rope = cfg.get("rope_parameters") or {}
    f32("attention.layer_norm_epsilon", cfg.get("norm_eps", 1e-5))
    f32("rope.freq_base", rope.get("full_attention", {}).get("rope_theta", cfg.get("global_rope_theta", 160000.0)))
    f32("rope.freq_base_swa", rope.get("sliding_attention", {}).get("rope_theta", cfg.get("local_rope_theta", 10000.0)))
    u32("attention.sliding_window", cfg["local_attention"])
    u32("attention.sliding_window_pattern", cfg.get("global_attn_every_n_layers", 3))
    u32("vocab_size", cfg["vocab_size"])
    w.add_string(f"{w.arch}.hidden_activation", cfg.get("hidden_activation", "gelu"))
    for key in ("norm_bias", "attention_bias", "mlp_bias"):
        if cfg.get(key):
            sys.exit(f"error: {key} is true; the converter writes ModernBERT without biases")


def main(src, out):
    src = Path(src)
    cfg = json.loads((src / "config.json").read_text())
    kind = cfg["model_type"]
    if kind not in ("gemma3_text", "modernbert"):
        sys.exit(f"error: model_type {kind!r}: EmbeddingGemma (gemma3_text) or ModernBERT (modernbert)")
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    if pooling.get("pooling_mode") != "mean" and not pooling.get("pooling_mode_mean_tokens"):
        sys.exit("error: only mean pooling is converted")
    tensors = load_file(str(src / "model.safetensors"))
    arch = "modern-bert" if kind == "modernbert" else "gemma-embedding"
    w = gguf.GGUFWriter(out, arch)
    w.add_type("model")
    w.add_name(src.name)
    u32 = lambda key, v: w.add_uint32(f"{arch}.{key}", int(v))
    f32 = lambda key, v: w.add_float32(f"{arch}.{key}", float(v))
    u32("block_count", cfg["num_hidden_layers"])
    u32("context_length", cfg.get("max_position_embeddings", 2048))
    u32("embedding_length", cfg["hidden_size"])
    u32("feed_forward_length", cfg["intermediate_size"])
    u32("attention.head_count", cfg["num_attention_heads"])
    w.add_bool(f"{arch}.attention.causal", False)
    u32("pooling_type", 1)
    if kind == "modernbert":
        modernbert_parameters(w, cfg, u32, f32)
        layer = MODERNBERT_LAYER
    else:
        gemma_parameters(w, src, cfg, tensors, u32, f32)
        layer = GEMMA_LAYER
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    vocab = cfg["vocab_size"]
    qwen35_gguf.add_placeholder_vocabulary(w, vocab)
    for hf in sorted(tensors):
        name = hf[1:] if hf.startswith("@") else gguf_name(hf, layer)
        value = tensors[hf].astype(np.float32)
        if kind == "gemma3_text" and name.endswith("norm.weight"):
            value = value + 1.0  # Gemma3RMSNorm scales by (1 + w): llama.cpp stores 1 + w
        w.add_tensor(name, np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
