"""Helpers shared by the scripts that make sentence-transformers embedder fixtures
(make-decoder-embedder-fixture.py, make-encoder-embedder-fixtures.py): a byte-level BPE tokenizer
trained on a few sentences, and reference.json with each text's token ids and embedding."""

import json
import os
import sys

import sentence_transformers
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer


def bpe_tokenizer(path, corpus, specials, single, pair, delimiters, **names):
    """A BPE tokenizer of 320 tokens trained on `corpus`, whose post-processor lays a text out as
    `single` (`pair` for two), with the `delimiters` named there; saved to `path`."""
    tk = Tokenizer(BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus, trainer)
    tk.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(d, tk.token_to_id(d)) for d in delimiters]
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, **names)
    fast.save_pretrained(path)
    return fast


def rows(model, texts, prefix, embeddings):
    """One reference row per text: the text, the ids the model saw for `prefix + text`, its embedding."""
    out = []
    for text, emb in zip(texts, embeddings):
        ids = model.tokenize([prefix + text])["input_ids"][0].tolist()
        out.append({"text": text, "token_ids": [int(i) for i in ids], "embedding": [float(v) for v in emb]})
    return out


def write_reference(out, description, pooling, query_prompt, texts, query_texts):
    """OUT/reference.json with the versions that made it."""
    doc = {
        "model": description,
        "pooling": pooling,
        "query_prompt": query_prompt,
        "made_with": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
        },
        "texts": texts,
        "query_texts": query_texts,
    }
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out}: {len(texts)} texts, with and without the query prompt", file=sys.stderr)


def tiny_modernbert(path, model_class, fast, seed, **extra):
    """A tiny random ModernBERT of `model_class` (4 layers, width 64, a global layer every third,
    local layers over 16 positions, exact GELU; `extra` adds config fields such as a classifier
    head's), its special token ids from `fast`'s [PAD], [SEP] and [CLS]; weights drawn from
    `seed` (norms near 1, embeddings wide, matrices ~ N(0, 1/fan_in)) and saved to `path`."""
    ids = {t: fast.convert_tokens_to_ids(t) for t in ["[PAD]", "[SEP]", "[CLS]"]}
    cfg = transformers.ModernBertConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=512,
        norm_eps=1e-5,
        local_attention=16,
        global_attn_every_n_layers=3,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        hidden_activation="gelu",
        pad_token_id=ids["[PAD]"],
        sep_token_id=ids["[SEP]"],
        eos_token_id=ids["[SEP]"],
        cls_token_id=ids["[CLS]"],
        bos_token_id=ids["[CLS]"],
        **extra,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_class(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(path)
