"""sentence-transformers' side of `anelm bench --rerank` (run by the anelm binary).

Usage: python bench_rerank_st.py MODEL_DIR JSON REPETITIONS THREADS
JSON is {"query", "documents"}. Prints one JSON object: {"version", "torch", "tokens",
"seconds": [...]} for CrossEncoder.predict over every (query, document) pair once per repetition
on torch CPU with THREADS threads, after one warm-up pass.
"""
import json
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[4]))
import sentence_transformers  # noqa: E402
from sentence_transformers import CrossEncoder  # noqa: E402

model_dir, path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, encoding="utf-8") as f:
    job = json.load(f)
pairs = [(job["query"], d) for d in job["documents"]]
model = CrossEncoder(model_dir, device="cpu")
tokens = int(model.preprocess(pairs)["attention_mask"].sum())
model.predict(pairs[:64], batch_size=32)
seconds = []
for _ in range(reps):
    t = time.perf_counter()
    model.predict(pairs, batch_size=32)
    seconds.append(time.perf_counter() - t)
print(json.dumps({"version": sentence_transformers.__version__, "torch": torch.__version__, "tokens": tokens, "seconds": seconds}))
