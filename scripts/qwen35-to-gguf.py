#!/usr/bin/env python3
"""Convert a (tiny) Qwen3.5 safetensors directory to a GGUF file in llama.cpp's `qwen35` layout.

Lays the tensors out as llama.cpp's converter (convert_hf_to_gguf.py, Qwen3_5TextModel) does, so
anelm's GGUF path for Qwen3.5 can be tested without downloading a real model; the layout (names,
tiled value heads, `1 + w` norms, metadata) is in scripts/qwen35_gguf.py, shared with the
benchmark-model maker scripts/make-qwen35-bench.py.

All tensors are written as F32 (llama.cpp's `--outtype f32`). The fixtures have no tokenizer, so a
placeholder vocabulary (GPT-2's 256 byte symbols, then `<tN>`, one merge) is written to keep the
file complete and loadable by llama.cpp and anelm.
Multimodal checkpoints: the text model under `model.language_model.` is converted; vision and
`mtp.*` tensors are skipped (llama.cpp's `--no-mtp`).

Usage: python scripts/qwen35-to-gguf.py <safetensors dir> <out.gguf>
Needs numpy, safetensors and gguf (`pip install gguf`), e.g. the fixtures virtualenv of
scripts/make-hf-fixtures.sh.
"""

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen35_gguf  # noqa: E402


def main(src, out):
    src = Path(src)
    cfg = qwen35_gguf.text_config(json.loads((src / "config.json").read_text()))
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in tensors else "model."

    def key(name):
        return name if name == "lm_head.weight" else prefix + name

    def get(name):
        t = tensors.get(key(name))
        if t is None:
            sys.exit(f"missing tensor {key(name)}")
        return t.astype(np.float32)

    has_output = "lm_head.weight" in tensors and not cfg.get("tie_word_embeddings", False)
    shapes = {}
    for full, t in tensors.items():
        if full == "lm_head.weight":
            shapes[full] = t.shape
        elif full.startswith(prefix):
            shapes[full[len(prefix):]] = t.shape
    try:
        qwen35_gguf.write(out, cfg, src.name, shapes, get, has_output, float_type="f32")
    except (KeyError, ValueError) as e:
        sys.exit(f"{src}: {e}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
