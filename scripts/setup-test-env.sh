#!/usr/bin/env bash
# Python side of the test suite: a virtualenv with the official `openai` and `ollama` clients and
# `jsonschema` (pinned), used by crates/anelm-cli/tests/server.rs and tests/ollama.rs to drive
# `anelm serve` and validate its structured outputs. Idempotent; prints the python path.
set -euo pipefail
VENV="${ANELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/anelm}/venv-openai"
OPENAI_VERSION=1.109.1
JSONSCHEMA_VERSION=4.25.1
OLLAMA_VERSION=0.6.3
PY="$VENV/bin/python"
if [[ -x "$PY" ]] && "$PY" - "$OPENAI_VERSION" "$JSONSCHEMA_VERSION" "$OLLAMA_VERSION" 2>/dev/null <<'PYEOF'
import sys
from importlib.metadata import version
sys.exit(version("openai") != sys.argv[1] or version("jsonschema") != sys.argv[2]
         or version("ollama") != sys.argv[3])
PYEOF
then
  echo "$PY"; exit 0
fi
echo "setting up $VENV with openai==$OPENAI_VERSION jsonschema==$JSONSCHEMA_VERSION ollama==$OLLAMA_VERSION" >&2
[[ -x "$PY" ]] || python3 -m venv "$VENV"
"$PY" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" "jsonschema==$JSONSCHEMA_VERSION" \
  "ollama==$OLLAMA_VERSION" >&2
echo "$PY"
