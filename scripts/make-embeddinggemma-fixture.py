"""Make a tiny random-weight EmbeddingGemma (Gemma 3 with bidirectional attention, mean pooling
and two Dense projections, then Normalize) and record sentence-transformers' embeddings of it as
a fixture.

Run by scripts/make-embedding-fixtures.sh in the virtualenv with sentence-transformers and torch.
Usage: make-embeddinggemma-fixture.py OUT_DIR

OUT_DIR becomes a sentence-transformers model directory as google/embeddinggemma-300m is laid out:
a Gemma3TextModel of four layers (`use_bidirectional_attention`, local layers with a window
longer than any text here, every third layer global) with random weights (fp32), a byte-level
BPE tokenizer trained on a few sentences (its post-processor puts <bos> before and <eos> after,
as Gemma's does), mean pooling, Dense 64 → 128 and 128 → 64 (no bias, identity activation),
Normalize, and `query` / `document` prompts. OUT_DIR/reference.json holds, for texts of different
lengths embedded in one batch, the token ids the model saw and the embeddings, with and without
the query prompt.
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
    "Café au lait à Zürich.",
    "x",
]

QUERY_PROMPT = "task: search result | query: "


def make_tokenizer(path: str) -> transformers.PreTrainedTokenizerFast:
    tk = Tokenizer(BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<eos>", "<bos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    bos, eos = tk.token_to_id("<bos>"), tk.token_to_id("<eos>")
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>", special_tokens=[("<bos>", bos), ("<eos>", eos)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.save_pretrained(path)
    return fast


def make_model(path: str, vocab: int) -> None:
    cfg = transformers.Gemma3TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        sliding_window=128,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=16,
        use_bidirectional_attention=True,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(27)
    model = transformers.Gemma3TextModel(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.1 * torch.randn_like(p))  # (1 + w) norms, stored as w
            elif "embed" in name:
                p.copy_(0.25 * torch.randn_like(p))
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
    dim = word.get_word_embedding_dimension()
    pool = models.Pooling(dim, pooling_mode="mean")
    torch.manual_seed(28)
    up = models.Dense(dim, 2 * dim, bias=False, activation_function=torch.nn.Identity())
    down = models.Dense(2 * dim, dim, bias=False, activation_function=torch.nn.Identity())
    st = SentenceTransformer(
        modules=[word, pool, up, down, models.Normalize()],
        device="cpu",
        prompts={"query": QUERY_PROMPT, "document": "title: none | text: "},
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
        "model": "tiny random-weight EmbeddingGemma (scripts/make-embeddinggemma-fixture.py)",
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
