"""Make a tiny random-weight Qwen3 decoder embedder (Qwen3-Embedding's layout) and record
sentence-transformers' embeddings of it as a fixture.

Run by scripts/make-embedding-fixtures.sh in the virtualenv with sentence-transformers and torch.
Usage: make-decoder-embedder-fixture.py OUT_DIR

OUT_DIR becomes a sentence-transformers model directory: a Qwen3Model of two layers with random
weights (fp32), a byte-level BPE tokenizer trained on a few sentences (its post-processor appends
<|endoftext|>, as Qwen3-Embedding's does), last-token pooling, Normalize, and a `query` prompt in
config_sentence_transformers.json. OUT_DIR/reference.json holds, for texts of different lengths
embedded in one batch, the token ids the model saw and the embeddings, with and without the
prompt. The batch is embedded with left and with right padding and the two must agree (the
script stops otherwise), so the reference does not depend on the padding side.
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
    "A decoder embedder pools the last token's hidden state.",
    "Café, naïve, Zürich, Москва, 東京.",
    "Indexing notes, documents and browser history by topic.",
]

TEXTS = [
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings for search.",
    "A decoder embedder pools the last token's hidden state, after the final norm.",
    "Café au lait à Zürich.",
    "x",
    "Indexing notes, documents and browser history by topic needs one vector per text; "
    "a longer text makes the batch's lengths differ a lot.",
]

QUERY_PROMPT = "Instruct: find related notes\nQuery: "


def make_tokenizer(path: str) -> transformers.PreTrainedTokenizerFast:
    return st_fixture.bpe_tokenizer(
        path,
        CORPUS,
        ["<|endoftext|>"],
        "$A <|endoftext|>",
        "$A <|endoftext|> $B <|endoftext|>",
        ["<|endoftext|>"],
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def make_model(path: str, vocab: int) -> None:
    cfg = transformers.Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(26)
    model = transformers.Qwen3Model(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model.save_pretrained(path)


def embed(model: SentenceTransformer, side: str, prompt_name):
    model.tokenizer.padding_side = side
    return model.encode(
        TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, prompt_name=prompt_name, precision="float32"
    )


def main() -> None:
    out = sys.argv[1]
    base = os.path.join(out, ".build")
    os.makedirs(base, exist_ok=True)
    fast = make_tokenizer(base)
    make_model(base, len(fast))
    word = models.Transformer(base, max_seq_length=64)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="lasttoken")
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
        left = embed(model, "left", prompt_name)
        right = embed(model, "right", prompt_name)
        diff = float(abs(left - right).max())
        if diff > 1e-5:
            sys.exit(f"error: left and right padding give different embeddings (max |diff| {diff})")
        prefix = QUERY_PROMPT if prompt_name else ""
        records[prompt_name or "none"] = st_fixture.rows(model, TEXTS, prefix, left)
    st_fixture.write_reference(
        out,
        "tiny random-weight Qwen3 decoder embedder (scripts/make-decoder-embedder-fixture.py)",
        "lasttoken",
        QUERY_PROMPT,
        records["none"],
        records["query"],
    )


if __name__ == "__main__":
    main()
