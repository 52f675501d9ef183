"""sentence-transformers' side of `anelm bench --embeddings` (run by the anelm binary).

Usage: python bench_embed_st.py MODEL_DIR TEXTS_JSON REPETITIONS THREADS
Prints one JSON object: {"version", "torch", "tokens", "seconds": [...]} for encoding every text
once per repetition on torch CPU with THREADS threads, after one warm-up pass.
"""
import json
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[4]))
import sentence_transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

model_dir, texts_path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(texts_path, encoding="utf-8") as f:
    texts = json.load(f)
model = SentenceTransformer(model_dir, device="cpu")
tokens = int(model.tokenize(texts)["attention_mask"].sum())
model.encode(texts[:64])
seconds = []
for _ in range(reps):
    t = time.perf_counter()
    with torch.inference_mode():
        model.encode(texts, batch_size=32)
    seconds.append(time.perf_counter() - t)
print(json.dumps({"version": sentence_transformers.__version__, "torch": torch.__version__, "tokens": tokens, "seconds": seconds}))
