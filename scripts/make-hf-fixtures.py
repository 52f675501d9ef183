#!/usr/bin/env python3
"""Build tiny random-weight Hugging Face models and record transformers' fp32 logits for them.

Run through scripts/make-hf-fixtures.sh (it creates the virtualenv with the pinned torch and
transformers). Output, per architecture, under crates/anelm-engine/tests/fixtures/hf/<name>/:

  config.json, model.safetensors   the model, as `save_pretrained` writes it (fp32 weights;
                                   no tokenizer: the fixtures are driven by token ids)
  reference.json                   token ids and transformers' logits (6 significant digits):
    "sequence":     {"tokens": [...], "logits": [[vocab] per position]}   one full forward pass
    "incremental":  {"prompt": [...], "tokens": [...], "logits": [...]}   (hybrid models) the
                    prompt prefilled, then `tokens` fed one at a time through the cache; logits
                    of each fed token
    "greedy":       {"prompt": [...], "tokens": [16 greedy continuation tokens]}
    "versions":     {"torch": ..., "transformers": ...}

Every weight is re-drawn from a fixed seed with a scale that keeps activations O(1) (transformers'
own init, std 0.02, would make every logit ~0 and the test blind). Fixtures are committed; CI
never runs this. Usage: make-hf-fixtures.py [name ...]   (default: all)
"""

import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "anelm-engine" / "tests" / "fixtures" / "hf"

VOCAB = 512
SEQ_LEN = 32
GREEDY_PROMPT = 8
GREEDY_NEW = 16


def sig6(x: float) -> float:
    return float(f"{x:.6g}")


def rows(t: torch.Tensor) -> list:
    return [[sig6(v) for v in r] for r in t.tolist()]


def tokens(seed: int, n: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Redraw every parameter: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 0.25²) (larger ones
    dominate the residual stream, and with a tied head every model then just repeats its input),
    norm weights near their neutral value, DeltaNet decay parameters in a useful range."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("A_log"):
                # A in [0.5, 4): g = exp(-A·softplus(a + dt_bias)) spreads over (0, 1).
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 3.5 + 0.5))
            elif name.endswith("dt_bias"):
                p.copy_(normal(p.shape, 0.5, -1.0))
            elif "conv1d" in name:
                p.copy_(normal(p.shape, 0.5))
            elif "embed_tokens" in name:
                p.copy_(normal(p.shape, 0.25))
            elif p.dim() == 1:
                # `(1 + w)` norms are stored around 0, plain norms around 1 (both mean ~1 in use).
                neutral = 1.0 if float(p.detach().mean()) > 0.5 else 0.0
                p.copy_(normal(p.shape, 0.1, neutral))
            else:
                p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[-1])))


@torch.no_grad()
def full_logits(model, ids: list) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def incremental_logits(model, prompt: list, cont: list) -> torch.Tensor:
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    cache = out.past_key_values
    got = []
    for t in cont:
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        got.append(out.logits[0, -1].float())
    return torch.stack(got)


@torch.no_grad()
def greedy(model, prompt: list) -> list:
    out = model.generate(
        input_ids=torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=GREEDY_NEW,
        min_new_tokens=GREEDY_NEW,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out[0, len(prompt) :].tolist()


def save(model, name: str, reference: dict, rename=None, config_rewrite=None) -> None:
    dest = OUT / name
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        dest.mkdir(parents=True)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
        if rename is not None:
            tensors = {rename(k): v for k, v in tensors.items()}
        save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, dest / "model.safetensors")
        config = json.loads(Path(tmp, "config.json").read_text())
        if config_rewrite is not None:
            config = config_rewrite(config)
        (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    reference["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    (dest / "reference.json").write_text(json.dumps(reference, separators=(",", ":")) + "\n")
    sizes = {p.name: p.stat().st_size for p in dest.iterdir()}
    print(f"{name}: {sizes}", file=sys.stderr)


def reference_for(model, seed: int, incremental: bool) -> dict:
    seq = tokens(seed, SEQ_LEN)
    ref = {"sequence": {"tokens": seq, "logits": rows(full_logits(model, seq))}}
    if incremental:
        prompt, cont = seq[:20], seq[20:]
        ref["incremental"] = {"prompt": prompt, "tokens": cont, "logits": rows(incremental_logits(model, prompt, cont))}
    ref["greedy"] = {"prompt": seq[:GREEDY_PROMPT], "tokens": greedy(model, seq[:GREEDY_PROMPT])}
    return ref


def build(config, cls, seed: int):
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).eval().float()
    randomize(model, seed)
    return model


def make_llama():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    model = build(cfg, transformers.LlamaForCausalLM, 1)
    save(model, "llama", reference_for(model, 101, incremental=True))


def make_qwen3():
    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # not hidden/heads: the explicit head_dim must be honoured
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    model = build(cfg, transformers.Qwen3ForCausalLM, 2)
    save(model, "qwen3", reference_for(model, 102, incremental=True))


def make_qwen2():
    # Qwen2 / Qwen2.5: Llama with biases on the q, k and v projections.
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    model = build(cfg, transformers.Qwen2ForCausalLM, 6)
    save(model, "qwen2", reference_for(model, 106, incremental=True))


def make_lfm2():
    # LFM2: gated short convolutions (conv layers) beside GQA attention with QK-norm; the FFN
    # width is adjusted from intermediate_size as transformers does (2/3, multiplier, rounding).
    cfg = transformers.Lfm2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        conv_L_cache=3,
        block_multiple_of=32,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True,
        layer_types=["conv", "full_attention", "conv", "conv"],
        tie_word_embeddings=True,
    )
    model = build(cfg, transformers.Lfm2ForCausalLM, 7)
    save(model, "lfm2", reference_for(model, 107, incremental=True))


def make_qwen3_moe():
    # Qwen3-MoE: Qwen3 attention, every layer routing each token to 2 of 8 experts with
    # renormalised probabilities (as llama.cpp's qwen3moe has them all, so its GGUF copy loads
    # there too).
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    model = build(cfg, transformers.Qwen3MoeForCausalLM, 8)
    save(model, "qwen3_moe", reference_for(model, 108, incremental=True))


def make_phi3():
    # Phi-3 / Phi-4-mini: fused qkv and gate-up projections, three quarters of each head rotated,
    # long-RoPE frequency factors (the short ones up to original_max_position_embeddings, as far
    # as llama.cpp's 1024-token reference context reaches too) with their attention scaling, and
    # Phi-3-mini's sliding window, shorter than the sequence so that it matters.
    half_rotary = int(16 * 0.75) // 2
    cfg = transformers.Phi3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        original_max_position_embeddings=1024,
        sliding_window=16,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.25 * i for i in range(half_rotary)],
            "long_factor": [2.0 + 0.5 * i for i in range(half_rotary)],
        },
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    model = build(cfg, transformers.Phi3ForCausalLM, 9)
    ref = reference_for(model, 109, incremental=True)
    # Past the original context transformers rotates every position with the long factors:
    # one forward of 1100 tokens, a few rows kept (early ones too, rotated with the long factors).
    seq = tokens(110, 1100)
    logits = full_logits(model, seq)
    keep = [0, 5, 17, 600, 1023, 1024, 1099]
    ref["long_context"] = {"tokens": seq, "positions": keep, "logits": rows(logits[keep])}
    save(model, "phi3", ref)


def make_gemma3():
    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,  # not head_dim: the scale must come from the config
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        sliding_window=6,  # shorter than the sequence, so the window matters
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        final_logit_softcapping=10.0,
        # transformers' Gemma 3 attention never applies `attn_logit_softcapping` (and the
        # published configs set it to null), so it stays unset here.
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )
    model = build(cfg, transformers.Gemma3ForCausalLM, 3)
    save(model, "gemma3", reference_for(model, 103, incremental=True))


def qwen3_5_text_config(tie: bool):
    return transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,  # linear, linear, linear, full (full_attention_interval 4)
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # two value heads per key head: the head mapping matters
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 2],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=tie,
    )


def make_qwen3_5():
    # Text-only layout (Qwen3_5ForCausalLM, tensors `model.layers.*`), untied head (like 9B).
    model = build(qwen3_5_text_config(False), transformers.Qwen3_5ForCausalLM, 4)
    save(model, "qwen3_5_text", reference_for(model, 104, incremental=True))

    # Multimodal checkpoint layout (like the published Qwen3.5 repositories): config with
    # `text_config`, tensors under `model.language_model.`, tied head (like 0.8B/4B). The vision
    # tower is left out; the loader skips it either way. Logits come from the text model, which is
    # what the conditional-generation model runs for text-only input.
    model = build(qwen3_5_text_config(True), transformers.Qwen3_5ForCausalLM, 5)

    def rename(k: str) -> str:
        return re.sub(r"^model\.", "model.language_model.", k)

    def nest(text: dict) -> dict:
        text = dict(text)
        text.pop("architectures", None)
        tie = text.get("tie_word_embeddings", False)
        return {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": text,
            "tie_word_embeddings": tie,
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16},
        }

    save(model, "qwen3_5", reference_for(model, 105, incremental=True), rename=rename, config_rewrite=nest)


MAKERS = {
    "llama": make_llama,
    "qwen3": make_qwen3,
    "qwen2": make_qwen2,
    "lfm2": make_lfm2,
    "qwen3_moe": make_qwen3_moe,
    "phi3": make_phi3,
    "gemma3": make_gemma3,
    "qwen3_5": make_qwen3_5,
}


def main(argv):
    torch.set_grad_enabled(False)
    names = argv or list(MAKERS)
    for n in names:
        if n not in MAKERS:
            sys.exit(f"unknown fixture '{n}': choose from {', '.join(MAKERS)}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    for n in names:
        MAKERS[n]()


if __name__ == "__main__":
    main(sys.argv[1:])
