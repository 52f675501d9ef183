"""Write a sentence-transformers decoder embedder (a Qwen3Model with last-token pooling, such as
crates/anelm-engine/tests/fixtures/embeddings/qwen3-embedder) as a GGUF in llama.cpp's `qwen3`
layout, the way llama.cpp's converter writes embedding models: the trunk's tensors under llama.cpp's
names (no `output.weight`), the byte-level BPE tokenizer (`gpt2` model, `gpt-2` pre-tokenizer,
`add_eos_token` when the tokenizer's post-processor appends a token), and
`qwen3.pooling_type` from `1_Pooling/config.json` in llama.cpp's numbering
(1 mean, 2 cls, 3 last).

Run in a virtualenv with numpy and gguf (scripts/make-embedding-fixtures.sh does).
Usage: make-decoder-embedder-gguf.py MODEL_DIR OUT.gguf
"""

import json
import os
import struct
import sys

import numpy as np

import gguf

ARCH = "qwen3"

# llama.cpp's `enum llama_pooling_type` (gguf.PoolingType), by sentence-transformers' mode name.
POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}

LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def read_safetensors(path):
    """name -> float32 array, from a safetensors file of F32 tensors (no torch needed)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            sys.exit(f"error: {name} is {meta['dtype']}; this script writes F32 models only")
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype="<f4").reshape(meta["shape"])
    return out


def gguf_name(hf):
    name = hf.removeprefix("model.")
    if name == "embed_tokens.weight":
        return "token_embd.weight"
    if name == "norm.weight":
        return "output_norm.weight"
    parts = name.split(".")
    if parts[0] != "layers" or parts[-1] != "weight":
        sys.exit(f"error: unexpected tensor {hf}")
    inner = ".".join(parts[2:-1])
    if inner not in LAYER_NAMES:
        sys.exit(f"error: unexpected tensor {hf}")
    return f"blk.{parts[1]}.{LAYER_NAMES[inner]}.weight"


def pooling_type(model_dir):
    with open(os.path.join(model_dir, "1_Pooling", "config.json")) as f:
        cfg = json.load(f)
    # sentence-transformers 5+ writes `pooling_mode: "lasttoken"`; older versions one boolean
    # `pooling_mode_<name>` (`_tokens`/`_token` suffixed for mean and cls) per mode.
    if isinstance(cfg.get("pooling_mode"), str):
        modes = [cfg["pooling_mode"]]
    else:
        modes = [
            k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
            for k, v in cfg.items()
            if k.startswith("pooling_mode_") and v is True
        ]
    if len(modes) != 1 or modes[0] not in POOLING:
        sys.exit(f"error: GGUF carries one pooling type (mean, cls or last); the model pools with {cfg}")
    return POOLING[modes[0]]


def write_tokenizer(w, model_dir):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tk = json.load(f)
    model = tk["model"]
    if model["type"] != "BPE" or tk["pre_tokenizer"].get("type") != "ByteLevel":
        sys.exit("error: this script writes byte-level BPE tokenizers only")
    vocab = model["vocab"]
    for t in tk["added_tokens"]:
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for piece, i in vocab.items():
        tokens[i] = piece
        types[i] = gguf.TokenType.NORMAL
    for t in tk["added_tokens"]:
        types[t["id"]] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    # The post-processor's appended token (Qwen3-Embedding's <|endoftext|>) is the EOS llama.cpp
    # appends when add_eos_token is set.
    post = tk.get("post_processor") or {}
    appended = [p["SpecialToken"]["id"] for p in post.get("single", []) if "SpecialToken" in p]
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        eos_piece = json.load(f).get("eos_token")
    eos = vocab.get(eos_piece) if isinstance(eos_piece, str) else None
    if appended:
        eos = vocab[appended[-1]]
    if eos is not None:
        w.add_eos_token_id(eos)
        w.add_pad_token_id(eos)
    w.add_add_bos_token(False)
    w.add_add_eos_token(bool(appended))


def main(model_dir, out):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg["model_type"] != "qwen3":
        sys.exit(f"error: model_type {cfg['model_type']}; this script writes qwen3 trunks")
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out, ARCH)
    w.add_name("tiny random-weight Qwen3 decoder embedder")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_pooling_type(gguf.PoolingType(pooling_type(model_dir)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    write_tokenizer(w, model_dir)
    for name in sorted(tensors):
        w.add_tensor(gguf_name(name), np.ascontiguousarray(tensors[name], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
