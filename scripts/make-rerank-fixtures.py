"""Make tiny random-weight rerankers and record what sentence-transformers and transformers
score with them.

Run by scripts/make-rerank-fixtures.sh in the virtualenv of the embedding fixtures.
Usage: make-rerank-fixtures.py OUT_DIR

OUT_DIR/cross-encoder/: a BertForSequenceClassification (2 layers, width 32, 96 positions,
num_labels 1) saved by transformers with a WordPiece tokenizer trained on a few sentences:
the files a sentence-transformers CrossEncoder directory on the Hugging Face hub has.
reference.json holds, for ~20 (query, document) pairs (non-ASCII, empty-ish, and pairs past
the 96-token limit, truncated longest-first), the token and type ids CrossEncoder feeds the
model, its raw logit and `CrossEncoder.predict`'s score (sigmoid, its default for one label).

OUT_DIR/classifier/: the same trunk with a 3-label head (id2label negative/neutral/positive);
reference.json holds transformers' softmax probabilities for single texts.

OUT_DIR/modernbert-cross-encoder/: a ModernBertForSequenceClassification (4 layers, global and
local attention with 8 positions either side, mean pooling, a dense bias, num_labels 1) with a
byte-level BPE tokenizer, as gte-reranker-modernbert is laid out; reference.json as for
cross-encoder/ (CrossEncoder's ids, logits and sigmoid scores, checked against transformers).

OUT_DIR/modernbert-classifier/: the same trunk with a 3-label head ([CLS] pooling, the tanh GELU);
reference.json holds transformers' softmax probabilities for single texts.

OUT_DIR/decoder-reranker/: a Qwen3ForCausalLM (2 layers, width 64) with a byte-level BPE
tokenizer that has "yes" and "no" as single tokens, and the chat markers. reference.json holds,
for (query, document) pairs in Qwen3-Reranker's prompt format, the token ids and P(yes) =
softmax([logit(no), logit(yes)])[1] at the last position, computed as Qwen3-Reranker's model
card does with transformers.
"""

import json
import os
import sys

import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import CrossEncoder
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, WordPiece
from tokenizers.trainers import BpeTrainer, WordPieceTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_fixture  # noqa: E402

CORPUS = [
    "What is the capital of France? Paris is the capital and largest city of France.",
    "How do I reset my password? Open the settings page and choose reset password.",
    "The quick brown fox jumps over the lazy dog.",
    "Neural engines run encoders well because every token fills a lane.",
    "Indexing notes, documents and browser history by topic needs a reranker.",
    "Café au lait, crème brûlée, Zürich, naïve façade.",
    "Москва столица России. 東京は日本の首都です。",
    "Search engines rank documents by relevance to the query.",
    "yes no yes no maybe",
]

LONG_DOC = " ".join(
    "A reranker reads the query and the document together, so every pair is one forward of the "
    "encoder; long documents are truncated to the model's limit.".split()
    * 6
)

PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "The quick brown fox jumps over the lazy dog."),
    ("How do I reset my password?", "Open the settings page and choose reset password."),
    ("How do I reset my password?", "Search engines rank documents by relevance."),
    ("reranker", "Indexing notes, documents and browser history by topic needs a reranker."),
    ("Café", "Crème brûlée à Zürich, naïve façade."),
    ("Москва", "Москва столица России."),
    ("東京", "東京は日本の首都です。"),
    ("emoji 🚀", "rockets 🚀🔥 and symbols ©®™"),
    ("x", "y"),
    ("?", "!"),
    ("  padded query  ", "  padded document with spaces  "),
    ("UPPER case Query", "lower CASE document"),
    ("neural engine lanes", "Neural engines run encoders well because every token fills a lane."),
    ("long document", LONG_DOC),
    (LONG_DOC, "a long query and a short document"),
    (LONG_DOC, LONG_DOC + " again"),
    ("What is relevance?", "Search engines rank documents by relevance to the query."),
    ("fox", "The quick brown fox jumps over the lazy dog."),
    ("dog", "The quick brown fox jumps over the lazy dog."),
    ("numbers 3.14", "pi is 3.14159 and e is 2.718"),
]

CLASSIFY_TEXTS = [
    "I love this engine.",
    "This is terrible.",
    "Paris is the capital of France.",
    "Café au lait à Zürich.",
    "x",
    LONG_DOC,
]

QWEN_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

MAX_POSITIONS = 96


def versions() -> dict:
    return {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
    }


def randomize(model: torch.nn.Module, seed: int, scale: float) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("weight") else 0.1 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))


def wordpiece(path: str) -> transformers.PreTrainedTokenizerFast:
    tk = Tokenizer(WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = WordPieceTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    tk.train_from_iterator(CORPUS, trainer)
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = transformers.BertTokenizerFast(
        tokenizer_object=tk,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(path)
    return fast


def bert_classifier(path: str, vocab: int, labels: list, seed: int) -> None:
    cfg = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=["BertForSequenceClassification"],
    )
    model = transformers.BertForSequenceClassification(cfg).eval().float()
    randomize(model, seed, 0.2)
    model.save_pretrained(path)


def write(path: str, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


def mark_sigmoid(out: str) -> None:
    """Record the one-label score's activation in config.json, as the hub's cross-encoder
    directories do (sentence-transformers >= 4)."""
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    write(cfg_path, cfg)


def cross_encoder_reference(out: str, fast, model_class, description: str, types: bool, **load) -> None:
    """reference.json of the one-label cross-encoder in `out`: CrossEncoder's ids (and token types
    when the model takes them), raw logits and sigmoid scores for PAIRS, each logit checked
    against transformers' own forward (`load`: keyword arguments of both loads)."""
    ce = CrossEncoder(out, device="cpu", model_kwargs=load or None)
    ce.eval()
    assert ce.max_seq_length == MAX_POSITIONS, ce.max_seq_length
    scores = ce.predict(PAIRS, batch_size=8, convert_to_numpy=True)
    logits = ce.predict(PAIRS, batch_size=8, convert_to_numpy=True, activation_fn=torch.nn.Identity())
    hf = model_class.from_pretrained(out, **load).eval()
    records = []
    for (q, d), score, logit in zip(PAIRS, scores, logits):
        feats = ce.preprocess([[q, d]])
        plain = fast(q, d, truncation="longest_first", max_length=MAX_POSITIONS)
        record = {"query": q, "document": d, "token_ids": feats["input_ids"][0].tolist()}
        inputs = {"input_ids": torch.tensor([record["token_ids"]])}
        if types:
            record["type_ids"] = feats["token_type_ids"][0].tolist()
            inputs["token_type_ids"] = torch.tensor([record["type_ids"]])
        if record["token_ids"] != plain["input_ids"] or (types and record["type_ids"] != plain["token_type_ids"]):
            sys.exit(f"error: CrossEncoder's ids differ from the tokenizer's for {(q, d)!r}")
        with torch.no_grad():
            ref = hf(**inputs).logits[0, 0].item()
        if abs(ref - float(logit)) > 1e-5:
            sys.exit(f"error: transformers' logit {ref} differs from CrossEncoder's {logit}")
        records.append({**record, "logit": float(logit), "score": float(score)})
    truncated = sum(len(r["token_ids"]) == MAX_POSITIONS for r in records)
    if truncated < 3:
        sys.exit(f"error: only {truncated} pairs reach {MAX_POSITIONS} tokens")
    write(
        os.path.join(out, "reference.json"),
        {
            "model": description,
            "max_length": MAX_POSITIONS,
            "activation": "sigmoid",
            "made_with": versions(),
            "pairs": records,
        },
    )


def classifier_reference(out: str, fast, model, labels: list, description: str) -> None:
    """reference.json of the sequence classifier `model`: transformers' logits and softmax
    probabilities of CLASSIFY_TEXTS."""
    records = []
    for text in CLASSIFY_TEXTS:
        enc = fast(text, truncation=True, max_length=MAX_POSITIONS, return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits[0]
        probs = torch.softmax(logits, dim=-1)
        records.append(
            {
                "text": text,
                "token_ids": enc["input_ids"][0].tolist(),
                "logits": [float(v) for v in logits],
                "probabilities": [float(v) for v in probs],
            }
        )
    write(
        os.path.join(out, "reference.json"),
        {"model": description, "labels": labels, "made_with": versions(), "texts": records},
    )


def cross_encoder(out: str) -> None:
    fast = wordpiece(out)
    bert_classifier(out, len(fast), ["LABEL_0"], seed=40)
    mark_sigmoid(out)
    cross_encoder_reference(
        out, fast, transformers.BertForSequenceClassification,
        "tiny random BertForSequenceClassification cross-encoder (scripts/make-rerank-fixtures.py)", types=True,
    )


def classifier(out: str, tok_dir: str) -> None:
    fast = transformers.BertTokenizerFast.from_pretrained(tok_dir)
    fast.save_pretrained(out)
    labels = ["negative", "neutral", "positive"]
    bert_classifier(out, len(fast), labels, seed=41)
    model = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    classifier_reference(
        out, fast, model, labels, "tiny random 3-label BertForSequenceClassification (scripts/make-rerank-fixtures.py)"
    )


def modernbert_tokenizer(path: str) -> transformers.PreTrainedTokenizerFast:
    """ModernBERT's layout: `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]`, no token types fed to the model."""
    return st_fixture.bpe_tokenizer(
        path, CORPUS + [LONG_DOC], ["[PAD]", "[SEP]", "[CLS]", "[MASK]", "[UNK]"],
        "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1", ["[CLS]", "[SEP]"],
        cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]",
        model_max_length=MAX_POSITIONS, model_input_names=["input_ids", "attention_mask"],
    )


def modernbert_classifier_model(path: str, fast, labels: list, seed: int, **head) -> None:
    st_fixture.tiny_modernbert(
        path,
        transformers.ModernBertForSequenceClassification,
        fast,
        seed,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        architectures=["ModernBertForSequenceClassification"],
        **head,
    )


def modernbert_cross_encoder(out: str) -> None:
    fast = modernbert_tokenizer(out)
    modernbert_classifier_model(out, fast, ["LABEL_0"], seed=43, classifier_pooling="mean", classifier_bias=True)
    mark_sigmoid(out)
    cross_encoder_reference(
        out, fast, transformers.ModernBertForSequenceClassification,
        "tiny random ModernBertForSequenceClassification cross-encoder (scripts/make-rerank-fixtures.py)",
        types=False, attn_implementation="eager",
    )


def modernbert_classifier(out: str, tok_dir: str) -> None:
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(tok_dir)
    fast.save_pretrained(out)
    labels = ["negative", "neutral", "positive"]
    modernbert_classifier_model(out, fast, labels, seed=44, classifier_pooling="cls",
                                classifier_activation="gelu_pytorch_tanh")
    model = transformers.ModernBertForSequenceClassification.from_pretrained(out, attn_implementation="eager").eval()
    classifier_reference(
        out, fast, model, labels,
        "tiny random 3-label ModernBertForSequenceClassification (scripts/make-rerank-fixtures.py)",
    )


def bpe(path: str) -> transformers.PreTrainedTokenizerFast:
    tk = Tokenizer(BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    trainer = BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = CORPUS + [QWEN_PREFIX, QWEN_SUFFIX, QWEN_INSTRUCTION] + ["yes", "no", "Query Document Instruct"] * 20
    tk.train_from_iterator(corpus, trainer)
    for word in ["yes", "no"]:
        if tk.token_to_id(word) is None:
            sys.exit(f"error: '{word}' is not one token of the trained vocabulary")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )
    fast.save_pretrained(path)
    return fast


def decoder_reranker(out: str) -> None:
    fast = bpe(out)
    cfg = transformers.Qwen3Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        use_sliding_window=False,
        architectures=["Qwen3ForCausalLM"],
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
    )
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3ForCausalLM(cfg).eval().float()
    randomize(model, 42, 0.08)
    model.save_pretrained(out)
    model = transformers.Qwen3ForCausalLM.from_pretrained(out, attn_implementation="eager").eval()

    # Qwen3-Reranker's model card: prefix and suffix tokens around the formatted pair, scored by
    # the softmax over the "no" and "yes" logits at the last position.
    yes, no = fast.convert_tokens_to_ids("yes"), fast.convert_tokens_to_ids("no")
    prefix = fast.encode(QWEN_PREFIX, add_special_tokens=False)
    suffix = fast.encode(QWEN_SUFFIX, add_special_tokens=False)
    records = []
    for q, d in PAIRS[:12] + [PAIRS[14]]:
        text = f"<Instruct>: {QWEN_INSTRUCTION}\n<Query>: {q}\n<Document>: {d}"
        ids = prefix + fast.encode(text, add_special_tokens=False) + suffix
        whole = fast.encode(QWEN_PREFIX + text + QWEN_SUFFIX, add_special_tokens=False)
        if ids != whole:
            sys.exit(f"error: the prompt's tokens depend on where it is split for {(q, d)!r}")
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        pair = torch.stack([logits[no], logits[yes]])
        p_yes = torch.softmax(pair, dim=-1)[1].item()
        records.append({"query": q, "document": d, "token_ids": ids, "p_yes": p_yes})
    write(
        os.path.join(out, "reference.json"),
        {
            "model": "tiny random Qwen3ForCausalLM yes/no reranker (scripts/make-rerank-fixtures.py)",
            "instruction": QWEN_INSTRUCTION,
            "made_with": versions(),
            "pairs": records,
        },
    )


def main() -> None:
    out = sys.argv[1]
    ce_dir = os.path.join(out, "cross-encoder")
    os.makedirs(ce_dir, exist_ok=True)
    cross_encoder(ce_dir)
    cls_dir = os.path.join(out, "classifier")
    os.makedirs(cls_dir, exist_ok=True)
    classifier(cls_dir, ce_dir)
    dec_dir = os.path.join(out, "decoder-reranker")
    os.makedirs(dec_dir, exist_ok=True)
    decoder_reranker(dec_dir)
    mb_ce_dir = os.path.join(out, "modernbert-cross-encoder")
    os.makedirs(mb_ce_dir, exist_ok=True)
    modernbert_cross_encoder(mb_ce_dir)
    mb_cls_dir = os.path.join(out, "modernbert-classifier")
    os.makedirs(mb_cls_dir, exist_ok=True)
    modernbert_classifier(mb_cls_dir, mb_ce_dir)
    print(f"wrote {ce_dir}, {cls_dir}, {dec_dir}, {mb_ce_dir} and {mb_cls_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
