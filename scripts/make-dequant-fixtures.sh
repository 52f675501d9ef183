#!/usr/bin/env bash
# Regenerate crates/anelm-kernels/tests/fixtures/dequant-gguf-py.json: random K-quant blocks
# (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K), IQ4_NL, IQ4_XS and Q5_1 blocks, and their values as the PyPI `gguf` package's numpy dequantizers compute
# them, an implementation independent of anelm's (`tests/dequant_vs_gguf_py.rs` compares).
#
# Creates (once) a virtualenv under the user cache with a pinned `gguf` and numpy. The CI never
# runs this: the fixture is committed.
set -euo pipefail
cd "$(dirname "$0")/.."

GGUF_VERSION="0.19.0"
# shellcheck source=lib/model-cache.sh
. scripts/lib/model-cache.sh
cache="$ANELM_CACHE_DIR"
venv="$cache/venv-dequant"
stamp="$venv/.anelm-gguf-$GGUF_VERSION"
PY="${PYTHON:-python3}"
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check "gguf==$GGUF_VERSION" numpy
  touch "$stamp"
fi

"$venv/bin/python" - crates/anelm-kernels/tests/fixtures/dequant-gguf-py.json <<'PY'
import json, sys
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

rng = np.random.default_rng(29)
BLOCKS = 4

MXFP4_EXPONENTS = [0, 1, 121, 160]

def f16_bytes(v):
    return np.array([v], dtype=np.float16).tobytes()

def block(name):
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "IQ4_NL": 18,
            "Q5_1": 24, "Q2_K": 84, "Q3_K": 110, "IQ4_XS": 136, "MXFP4": 17}[name]
    b = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    scale = lambda: f16_bytes(rng.uniform(-0.05, 0.05))
    if name == "Q6_K":
        b[208:210] = scale()
    elif name in ("IQ4_NL", "IQ4_XS"):
        b[0:2] = scale()
    elif name == "Q2_K":
        b[80:82] = scale()
        b[82:84] = scale()
    elif name == "Q3_K":
        b[108:110] = scale()
    elif name == "MXFP4":
        # The E8M0 exponents: both subnormal ones (0, 1), weights' usual range, a large one.
        b[0] = MXFP4_EXPONENTS.pop(0)
    else:
        b[0:2] = scale()
        b[2:4] = scale()
    return bytes(b)

out = {}
# New formats go last, so the earlier blocks keep the generator's earlier draws.
for name, t in [("Q4_K", T.Q4_K), ("Q5_K", T.Q5_K), ("Q6_K", T.Q6_K), ("IQ4_NL", T.IQ4_NL),
                ("Q5_1", T.Q5_1), ("Q2_K", T.Q2_K), ("Q3_K", T.Q3_K), ("IQ4_XS", T.IQ4_XS),
                ("MXFP4", T.MXFP4)]:
    data = b"".join(block(name) for _ in range(BLOCKS))
    values = dequantize(np.frombuffer(data, dtype=np.uint8), t).astype(np.float32).reshape(-1)
    out[name] = {
        "bytes": data.hex(),
        "f32_bits": [int(v) for v in values.view(np.uint32)],
    }
json.dump(out, open(sys.argv[1], "w"))
print(f"wrote {sys.argv[1]}", file=sys.stderr)
PY
