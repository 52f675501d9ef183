#!/usr/bin/env python3
"""Convert a (tiny) EmbeddingGemma sentence-transformers directory to a GGUF file in llama.cpp's
`gemma-embedding` layout.

Lays the tensors out as llama.cpp's converter (convert_hf_to_gguf.py: EmbeddingGemma, run with
--sentence-transformers-dense-modules) does: Gemma 3's names with every RMSNorm weight stored as
`1 + w`, the sliding window as config.json gives it (llama.cpp's symmetric window reaches half of
it either side), which layers slide as `attention.sliding_window_pattern` flags, mean pooling as
`pooling_type` 1, and the Dense modules `2_Dense` / `3_Dense` as `dense_2.weight` /
`dense_3.weight` with their `dense_{2,3}_feat_{in,out}` widths. All tensors are written as F32;
the vocabulary is the placeholder of scripts/qwen35_gguf.py (the tests feed token ids).

Usage: python scripts/embeddinggemma-to-gguf.py <sentence-transformers dir> <out.gguf>
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

ARCH = "gemma-embedding"

LAYER = {
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


def gguf_name(hf):
    hf = hf.removeprefix("model.")
    if hf == "embed_tokens.weight":
        return "token_embd.weight"
    if hf == "norm.weight":
        return "output_norm.weight"
    parts = hf.split(".")
    if parts[0] == "layers":
        return f"blk.{parts[1]}.{LAYER['.'.join(parts[2:])]}"
    raise KeyError(f"unexpected tensor {hf}")


def main(src, out):
    src = Path(src)
    cfg = json.loads((src / "config.json").read_text())
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    if pooling.get("pooling_mode") != "mean" and not pooling.get("pooling_mode_mean_tokens"):
        sys.exit("error: only mean pooling is converted (llama.cpp's EmbeddingGemma pools by mean)")
    tensors = load_file(str(src / "model.safetensors"))
    n_layers = cfg["num_hidden_layers"]
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out, ARCH)
    w.add_type("model")
    w.add_name(src.name)
    u32 = lambda key, v: w.add_uint32(f"{ARCH}.{key}", int(v))
    f32 = lambda key, v: w.add_float32(f"{ARCH}.{key}", float(v))
    u32("block_count", n_layers)
    u32("context_length", cfg.get("max_position_embeddings", 2048))
    u32("embedding_length", cfg["hidden_size"])
    u32("feed_forward_length", cfg["intermediate_size"])
    u32("attention.head_count", cfg["num_attention_heads"])
    u32("attention.head_count_kv", cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    u32("attention.key_length", cfg["head_dim"])
    u32("attention.value_length", cfg["head_dim"])
    f32("attention.layer_norm_rms_epsilon", cfg.get("rms_norm_eps", 1e-6))
    f32("rope.freq_base", rope.get("full_attention", {}).get("rope_theta", 1e6))
    f32("rope.freq_base_swa", rope.get("sliding_attention", {}).get("rope_theta", 1e4))
    u32("attention.sliding_window", cfg["sliding_window"])
    w.add_array(f"{ARCH}.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg["layer_types"]])
    u32("pooling_type", 1)
    for i, module in enumerate(["2_Dense", "3_Dense"]):
        dense_cfg = json.loads((src / module / "config.json").read_text())
        if dense_cfg.get("bias"):
            sys.exit(f"error: {module} has a bias, which llama.cpp's Dense layers do not take")
        name = f"dense_{i + 2}"
        u32(f"{name}_feat_in", dense_cfg["in_features"])
        u32(f"{name}_feat_out", dense_cfg["out_features"])
        tensors[f"@{name}.weight"] = load_file(str(src / module / "model.safetensors"))["linear.weight"]
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    vocab = cfg["vocab_size"]
    tokens, merges = qwen35_gguf.placeholder_vocabulary(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * vocab)
    w.add_token_merges(merges)
    for hf in sorted(tensors):
        name = hf[1:] if hf.startswith("@") else gguf_name(hf)
        value = tensors[hf].astype(np.float32)
        if name.endswith("norm.weight"):
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
