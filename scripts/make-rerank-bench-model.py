"""Make a MiniLM-sized cross-encoder for `anelm bench --rerank`: all-MiniLM-L6-v2's encoder
(6 layers, width 384, 512 positions, its WordPiece tokenizer) under a random pooler and
one-label classifier head, saved as BertForSequenceClassification — the shape of
cross-encoder/ms-marco-MiniLM-L-6-v2, which no PyPI package ships. Its scores mean nothing; its
speed is a real MiniLM cross-encoder's.

Usage: make-rerank-bench-model.py MINILM_DIR OUT_DIR (run by scripts/make-rerank-bench-model.sh)
"""
import json
import os
import sys

import torch
import transformers

src, out = sys.argv[1:3]
torch.manual_seed(6)
model = transformers.BertForSequenceClassification.from_pretrained(src, num_labels=1).eval()
model.config.architectures = ["BertForSequenceClassification"]
model.save_pretrained(out)
tok = transformers.AutoTokenizer.from_pretrained(src)
tok.model_max_length = 512
tok.save_pretrained(out)
cfg_path = os.path.join(out, "config.json")
with open(cfg_path, encoding="utf-8") as f:
    cfg = json.load(f)
cfg["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
with open(cfg_path, "w", encoding="utf-8") as f:
    json.dump(cfg, f, indent=1)
print(out)
