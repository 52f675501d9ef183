#!/usr/bin/env bash
# Python side of the test suite: a virtualenv with the official `openai` client (pinned), used by
# crates/anelm-cli/tests/server.rs to drive `anelm serve`. Idempotent; prints the python path.
set -euo pipefail
VENV="${ANELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/anelm}/venv-openai"
OPENAI_VERSION=1.109.1
PY="$VENV/bin/python"
if [[ -x "$PY" ]] && "$PY" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "$PY"; exit 0
fi
echo "creating $VENV with openai==$OPENAI_VERSION" >&2
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION" >&2
echo "$PY"
