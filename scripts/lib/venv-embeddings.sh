# The virtualenv the fixture and bench-model scripts run sentence-transformers, transformers and
# torch in (pinned, from PyPI), created once under the user cache. Source it from the repository
# root; it sets $venv. The PyPI torch wheel for Linux is a CUDA build whose import needs the CUDA
# runtime packages, so they come along (about 3 GB); everything runs on the CPU in fp32.
TORCH_VERSION="2.15.0"
TRANSFORMERS_VERSION="5.24.0"
ST_VERSION="6.2.0"
GGUF_VERSION="0.19.0"

# shellcheck source=model-cache.sh
. scripts/lib/model-cache.sh
venv="$ANELM_CACHE_DIR/venv-embeddings"
stamp="$venv/.anelm-torch-$TORCH_VERSION-transformers-$TRANSFORMERS_VERSION-st-$ST_VERSION-gguf-$GGUF_VERSION"

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null 2>&1 || { echo "error: python3 (>= 3.10) is needed (set PYTHON=...)" >&2; exit 1; }

if [ ! -f "$stamp" ]; then
  echo "creating $venv (torch $TORCH_VERSION, sentence-transformers $ST_VERSION; about 3 GB) ..." >&2
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check \
    "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" "sentence-transformers==$ST_VERSION" "gguf==$GGUF_VERSION" >&2
  touch "$stamp"
fi
