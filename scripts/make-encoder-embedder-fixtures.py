"""Make a tiny random-weight encoder embedder and record sentence-transformers' embeddings of it as
a fixture: `embeddinggemma` (a Gemma3TextModel with bidirectional attention laid out as
google/embeddinggemma-300m: mean pooling, Dense 64 → 128 → 64 without bias, Normalize; local
layers with a window that the longest text here exceeds once transformers halves it) or
`modernbert` (a ModernBertModel as gte-modernbert / modernbert-embed: mean pooling, Normalize;
local layers of 16 tokens).

Run by scripts/make-embedding-fixtures.sh in the virtualenv with sentence-transformers and torch.
Usage: make-encoder-embedder-fixtures.py embeddinggemma|modernbert OUT_DIR

OUT_DIR becomes a sentence-transformers model directory with random weights (fp32), a byte-level
BPE tokenizer trained on a few sentences (its post-processor puts the model's delimiters around a
text: <bos> … <eos>, or [CLS] … [SEP]) and `query` / `document` prompts. OUT_DIR/reference.json
holds, for texts of different lengths embedded in one batch, the token ids the model saw and the
embeddings, with and without the query prompt.
"""

import os
import sys

import torch
import transformers
from sentence_transformers import SentenceTransformer, models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_fixture  # noqa: E402

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


def make_tokenizer(path: str, specials: list, first: str, last: str, **names) -> transformers.PreTrainedTokenizerFast:
    """A BPE tokenizer whose post-processor puts `first` before a text and `last` after it."""
    return st_fixture.bpe_tokenizer(
        path, CORPUS, specials, f"{first} $A {last}", f"{first} $A {last} $B {last}", [first, last], **names
    )


def gemma_model(path: str, vocab: int) -> None:
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


def build(kind: str, base: str) -> list:
    """The model's files under `base`; returns its sentence-transformers modules after the Transformer."""
    if kind == "embeddinggemma":
        fast = make_tokenizer(base, ["<pad>", "<eos>", "<bos>"], "<bos>", "<eos>",
                              bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
        gemma_model(base, len(fast))
        torch.manual_seed(28)
        dim = 64
        return [
            models.Pooling(dim, pooling_mode="mean"),
            models.Dense(dim, 2 * dim, bias=False, activation_function=torch.nn.Identity()),
            models.Dense(2 * dim, dim, bias=False, activation_function=torch.nn.Identity()),
            models.Normalize(),
        ]
    fast = make_tokenizer(base, ["[PAD]", "[SEP]", "[CLS]", "[MASK]"], "[CLS]", "[SEP]",
                          cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    st_fixture.tiny_modernbert(base, transformers.ModernBertModel, fast, 29)
    return [models.Pooling(64, pooling_mode="mean"), models.Normalize()]


QUERY_PROMPTS = {"embeddinggemma": "task: search result | query: ", "modernbert": "search_query: "}
DOCUMENT_PROMPTS = {"embeddinggemma": "title: none | text: ", "modernbert": ""}


def main() -> None:
    kind, out = sys.argv[1], sys.argv[2]
    if kind not in QUERY_PROMPTS:
        sys.exit(f"unknown kind {kind!r}: embeddinggemma or modernbert")
    query_prompt = QUERY_PROMPTS[kind]
    base = os.path.join(out, ".build")
    os.makedirs(base, exist_ok=True)
    rest = build(kind, base)
    word = models.Transformer(base, max_seq_length=128)
    st = SentenceTransformer(
        modules=[word, *rest], device="cpu", prompts={"query": query_prompt, "document": DOCUMENT_PROMPTS[kind]}
    )
    st.save(out)
    for f in os.listdir(base):
        os.remove(os.path.join(base, f))
    os.rmdir(base)
    if os.path.exists(os.path.join(out, "README.md")):
        os.remove(os.path.join(out, "README.md"))

    model = SentenceTransformer(out, device="cpu")
    model.eval()
    records = {}
    for prompt_name in [None, "query"]:
        embs = model.encode(
            TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, prompt_name=prompt_name, precision="float32"
        )
        prefix = query_prompt if prompt_name else ""
        records[prompt_name or "none"] = st_fixture.rows(model, TEXTS, prefix, embs)
    st_fixture.write_reference(
        out,
        f"tiny random-weight {kind} embedder (scripts/make-encoder-embedder-fixtures.py)",
        "mean",
        query_prompt,
        records["none"],
        records["query"],
    )


if __name__ == "__main__":
    main()
