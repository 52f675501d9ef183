"""Make a tiny random-weight ModernBERT embedder (as gte-modernbert / modernbert-embed are laid out:
a ModernBertModel, mean pooling, Normalize) and record sentence-transformers' embeddings of it as
a fixture.

Run by scripts/make-embedding-fixtures.sh in the virtualenv with sentence-transformers and torch.
Usage: make-modernbert-fixture.py OUT_DIR

OUT_DIR becomes a sentence-transformers model directory: a ModernBertModel of four layers (every
third global, the others local with a window of 16 tokens, so the longer texts here exercise it)
with random weights (fp32), a byte-level BPE tokenizer trained on a few sentences (its
post-processor puts [CLS] before and [SEP] after), mean pooling, Normalize, and a `query` prompt.
OUT_DIR/reference.json holds, for texts of different lengths embedded in one batch, the token ids
the model saw and the embeddings, with and without the query prompt.
"""

import json
import os
import sys

import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer, models
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn texts into vectors for search and clustering.",
    "An encoder attends both ways and pools every token's state.",
    "Café, naïve, Zürich, Москва, 東京.",
    "Indexing notes, documents and browser history by topic.",
]

TEXTS = [
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings for search.",
    "An encoder attends both ways, so every token sees the whole text before pooling.",
    "A local layer sees sixteen tokens around each position; a global one every token of the text.",
    "Café au lait à Zürich.",
    "x",
]

QUERY_PROMPT = "search_query: "


def make_tokenizer(path: str) -> transformers.PreTrainedTokenizerFast:
    tk = Tokenizer(BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=320,
        special_tokens=["[PAD]", "[SEP]", "[CLS]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]"
    )
    fast.save_pretrained(path)
    return fast


def make_model(path: str, vocab: int) -> None:
    cfg = transformers.ModernBertConfig(
        vocab_size=vocab,
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
        pad_token_id=0,
        sep_token_id=1,
        cls_token_id=2,
        bos_token_id=2,
        eos_token_id=1,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(29)
    model = transformers.ModernBertModel(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(path)


def main() -> None:
    out = sys.argv[1]
    base = os.path.join(out, ".build")
    os.makedirs(base, exist_ok=True)
    fast = make_tokenizer(base)
    make_model(base, len(fast))
    word = models.Transformer(base, max_seq_length=128)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    st = SentenceTransformer(
        modules=[word, pool, models.Normalize()], device="cpu", prompts={"query": QUERY_PROMPT, "document": ""}
    )
    st.save(out)
    for f in os.listdir(base):
        os.remove(os.path.join(base, f))
    os.rmdir(base)

    model = SentenceTransformer(out, device="cpu")
    model.eval()
    records = {}
    for prompt_name in [None, "query"]:
        embs = model.encode(
            TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, prompt_name=prompt_name, precision="float32"
        )
        prefix = QUERY_PROMPT if prompt_name else ""
        rows = []
        for text, emb in zip(TEXTS, embs):
            ids = model.tokenize([prefix + text])["input_ids"][0].tolist()
            rows.append({"text": text, "token_ids": [int(i) for i in ids], "embedding": [float(v) for v in emb]})
        records[prompt_name or "none"] = rows
    doc = {
        "model": "tiny random-weight ModernBERT embedder (scripts/make-modernbert-fixture.py)",
        "pooling": "mean",
        "query_prompt": QUERY_PROMPT,
        "made_with": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
        },
        "texts": records["none"],
        "query_texts": records["query"],
    }
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out}: {len(TEXTS)} texts, with and without the query prompt", file=sys.stderr)


if __name__ == "__main__":
    main()
