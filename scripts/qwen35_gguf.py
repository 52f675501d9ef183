"""Qwen3.5 in llama.cpp's GGUF `qwen35` layout: the metadata and the tensor mapping from a Hugging
Face checkpoint, written one tensor at a time.

Shared by scripts/qwen35-to-gguf.py (a safetensors directory, all F32) and
scripts/make-qwen35-bench.py (random weights with real shapes, F16), so both lay a model out the
same way. The layout follows llama.cpp's converter (convert_hf_to_gguf.py, Qwen3_5TextModel):

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

With `float_type="f16"` the tensors llama.cpp's converter keeps in F32 (1-D tensors, norms,
`ssm_conv1d`, names not ending in `.weight`) stay F32 and every other matrix is F16, as
`convert_hf_to_gguf.py --outtype f16` writes them.
"""

import numpy as np

import gguf

ARCH = "qwen35"


def text_config(cfg):
    return cfg.get("text_config", cfg)


def layer_types(cfg):
    """The per-layer kinds, from `layer_types` or every `full_attention_interval`-th layer."""
    n_layers = cfg["num_hidden_layers"]
    interval = cfg.get("full_attention_interval", 4)
    kinds = cfg.get("layer_types")
    if kinds is None:
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if len(kinds) != n_layers:
        raise ValueError(f"layer_types has {len(kinds)} entries, num_hidden_layers is {n_layers}")
    return kinds


def placeholder_vocabulary(vocab):
    """A byte-level BPE vocabulary of `vocab` tokens for a checkpoint without a tokenizer: GPT-2's
    256 byte symbols first (so any text tokenizes), then the one merge's result `Ġt`, then `<tN>`
    placeholders. Returns (tokens, merges).
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



def add_placeholder_vocabulary(w, vocab):
    """Write the placeholder vocabulary of `vocab` tokens as a GPT-2 BPE tokenizer (the fixtures
    carry no tokenizer of their own; the tests feed token ids)."""
    tokens, merges = placeholder_vocabulary(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * vocab)
    w.add_token_merges(merges)

def tiled(x, axis, n_k, per_k, width):
    """Value heads along `axis` from grouped-by-key-head to tiled order."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [n_k, per_k, width] + shape[axis + 1:])
    x = np.swapaxes(x, axis, axis + 1)
    return np.ascontiguousarray(x).reshape(shape)


def hf_tensor_shapes(cfg, tied):
    """{name without the `model.` prefix: shape} of a Qwen3.5 text checkpoint in Hugging Face's
    layout (for making one from nothing; `lm_head.weight` keeps its own name)."""
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n_heads, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", h // n_heads)
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, kernel = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv = 2 * n_k * dk + n_v * dv
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,)}
    if not tied:
        shapes["lm_head.weight"] = (v, h)
    for i, kind in enumerate(layer_types(cfg)):
        lp = f"layers.{i}."
        shapes[lp + "input_layernorm.weight"] = (h,)
        shapes[lp + "post_attention_layernorm.weight"] = (h,)
        shapes[lp + "mlp.gate_proj.weight"] = (f, h)
        shapes[lp + "mlp.up_proj.weight"] = (f, h)
        shapes[lp + "mlp.down_proj.weight"] = (h, f)
        if kind == "linear_attention":
            la = lp + "linear_attn."
            shapes[la + "in_proj_qkv.weight"] = (conv, h)
            shapes[la + "in_proj_z.weight"] = (n_v * dv, h)
            shapes[la + "in_proj_b.weight"] = (n_v, h)
            shapes[la + "in_proj_a.weight"] = (n_v, h)
            shapes[la + "A_log"] = (n_v,)
            shapes[la + "dt_bias"] = (n_v,)
            shapes[la + "conv1d.weight"] = (conv, 1, kernel)
            shapes[la + "norm.weight"] = (dv,)
            shapes[la + "out_proj.weight"] = (h, n_v * dv)
        else:
            sa = lp + "self_attn."
            # q_proj yields the query and the output gate of every head.
            shapes[sa + "q_proj.weight"] = (2 * n_heads * hd, h)
            shapes[sa + "k_proj.weight"] = (n_kv * hd, h)
            shapes[sa + "v_proj.weight"] = (n_kv * hd, h)
            shapes[sa + "o_proj.weight"] = (h, n_heads * hd)
            shapes[sa + "q_norm.weight"] = (hd,)
            shapes[sa + "k_norm.weight"] = (hd,)
    return shapes


def _plan(cfg, has_output):
    """[(gguf name, Hugging Face name, convert(f32 array) -> f32 array)] in file order (Hugging
    Face names without the `model.` prefix)."""
    n_k = cfg["linear_num_key_heads"]
    n_v = cfg["linear_num_value_heads"]
    dv = cfg["linear_value_head_dim"]
    qk = 2 * n_k * cfg["linear_key_head_dim"]
    if n_v % n_k:
        raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
    per_k = n_v // n_k

    def same(t):
        return t

    def plus1(t):
        return t + 1

    def heads(axis, width):
        return lambda t: tiled(t, axis, n_k, per_k, width)

    def qkv_rows(t):
        t = t.reshape(t.shape[0], -1)
        return np.concatenate([t[:qk], tiled(t[qk:], 0, n_k, per_k, dv)])

    def neg_exp(t):
        # exp in f64, then rounded to f32: the correctly rounded value torch computes.
        return tiled(-np.exp(t.astype(np.float64)), 0, n_k, per_k, 1)

    plan = [("token_embd.weight", "embed_tokens.weight", same)]
    if has_output:
        plan.append(("output.weight", "lm_head.weight", same))
    plan.append(("output_norm.weight", "norm.weight", plus1))
    for i, kind in enumerate(layer_types(cfg)):
        lp, b = f"layers.{i}.", f"blk.{i}."
        plan.append((b + "attn_norm.weight", lp + "input_layernorm.weight", plus1))
        plan.append((b + "post_attention_norm.weight", lp + "post_attention_layernorm.weight", plus1))
        for hf, gg in [("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")]:
            plan.append((b + gg + ".weight", lp + f"mlp.{hf}.weight", same))
        if kind == "linear_attention":
            la = lp + "linear_attn."
            plan += [
                (b + "attn_qkv.weight", la + "in_proj_qkv.weight", qkv_rows),
                (b + "attn_gate.weight", la + "in_proj_z.weight", heads(0, dv)),
                (b + "ssm_beta.weight", la + "in_proj_b.weight", heads(0, 1)),
                (b + "ssm_alpha.weight", la + "in_proj_a.weight", heads(0, 1)),
                (b + "ssm_a", la + "A_log", neg_exp),
                (b + "ssm_dt.bias", la + "dt_bias", heads(0, 1)),
                (b + "ssm_conv1d.weight", la + "conv1d.weight", qkv_rows),
                (b + "ssm_norm.weight", la + "norm.weight", same),
                (b + "ssm_out.weight", la + "out_proj.weight", heads(1, dv)),
            ]
        else:
            sa = lp + "self_attn."
            for hf, gg in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")]:
                plan.append((b + gg + ".weight", sa + hf + ".weight", same))
            plan.append((b + "attn_q_norm.weight", sa + "q_norm.weight", plus1))
            plan.append((b + "attn_k_norm.weight", sa + "k_norm.weight", plus1))
    return plan


def _stored_dtype(name, shape, float_type):
    """The numpy type a tensor is written in (llama.cpp's converter rules for `--outtype`)."""
    if float_type == "f32":
        return np.float32
    keep_f32 = len(shape) <= 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name or not name.endswith(".weight")
    return np.float32 if keep_f32 else np.float16


def write(out, cfg, model_name, shapes, get, has_output, float_type="f32", progress=None):
    """Write the GGUF file `out`. `shapes[name]` is the Hugging Face shape of a tensor and
    `get(name)` its values (called once per tensor, in file order, so a caller can stream
    tensors it makes or reads one at a time)."""
    cfg = text_config(cfg)
    kinds = layer_types(cfg)
    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim", hidden // n_heads)
    n_v = cfg["linear_num_value_heads"]
    rope = cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10_000_000.0))
    sections = list(rope.get("mrope_section", [11, 11, 10]))
    sections += [0] * (4 - len(sections))
    vocab = cfg["vocab_size"]

    # Keys and value types as llama.cpp's converter writes them (spelled out: the PyPI `gguf`
    # package's writer lacks helpers for some of them).
    w = gguf.GGUFWriter(out, ARCH)
    w.add_type("model")
    w.add_name(model_name)
    u32 = lambda key, v: w.add_uint32(f"{ARCH}.{key}", int(v))
    u32("block_count", cfg["num_hidden_layers"])
    u32("context_length", cfg.get("max_position_embeddings", 262144))
    u32("embedding_length", hidden)
    u32("feed_forward_length", cfg["intermediate_size"])
    u32("attention.head_count", n_heads)
    u32("attention.head_count_kv", cfg.get("num_key_value_heads", n_heads))
    w.add_array(f"{ARCH}.rope.dimension_sections", [int(x) for x in sections])
    w.add_float32(f"{ARCH}.rope.freq_base", float(theta))
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-6)))
    u32("attention.key_length", head_dim)
    u32("attention.value_length", head_dim)
    file_type = gguf.LlamaFileType.ALL_F32 if float_type == "f32" else gguf.LlamaFileType.MOSTLY_F16
    w.add_uint32("general.file_type", int(file_type))
    u32("ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    u32("ssm.state_size", cfg["linear_key_head_dim"])
    u32("ssm.group_count", cfg["linear_num_key_heads"])
    u32("ssm.time_step_rank", n_v)
    u32("ssm.inner_size", cfg["linear_value_head_dim"] * n_v)
    w.add_array(f"{ARCH}.attention.recurrent_layers", [t == "linear_attention" for t in kinds])
    u32("full_attention_interval", cfg.get("full_attention_interval", 4))
    u32("rope.dimension_count", int(head_dim * partial))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    add_placeholder_vocabulary(w, vocab)

    plan = _plan(cfg, has_output)
    for name, hf_name, _ in plan:
        shape = tuple(shapes[hf_name])
        if name.endswith(".ssm_conv1d.weight"):
            shape = (shape[0], int(np.prod(shape[1:])))
        dtype = np.dtype(_stored_dtype(name, shape, float_type))
        w.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for n, (name, hf_name, convert) in enumerate(plan):
        data = np.asarray(convert(np.asarray(get(hf_name), dtype=np.float32)), dtype=np.float32)
        dtype = _stored_dtype(name, data.shape, float_type)
        w.write_tensor_data(np.ascontiguousarray(data, dtype=dtype))
        if progress:
            progress(n + 1, len(plan), name)
    w.close()

