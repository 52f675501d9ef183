#!/usr/bin/env bash
# Python side of the test suite: a virtualenv with the official API clients the server tests
# drive `anelm serve` with (pinned): `openai` and `jsonschema` (structured outputs), the
# `openai-agents` SDK (an agent over the Responses API), `anthropic` (the Messages API), `ollama` (Ollama's API),
# `instructor` and `pydantic-ai` (pydantic models as schemas; pydantic-ai 1.30.1 is the newest that
# works with openai 1.109.1, and it needs an opentelemetry-api that still has `_events`),
# `email-validator` (pydantic's `EmailStr`), `rfc3339-validator` (jsonschema checks `date-time` and `time` with it).
# Idempotent; prints the python path.
set -euo pipefail
VENV="${ANELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/anelm}/venv-openai"
PACKAGES=(
  "openai==1.109.1"
  "jsonschema==4.25.1"
  "openai-agents==0.3.3"
  "anthropic==2.10.0"
  "ollama==0.6.3"
  "instructor==1.12.0"
  "pydantic-ai-slim[openai]==1.30.1"
  "opentelemetry-api==1.38.0"
  "email-validator==2.4.0"
  "rfc3339-validator==0.1.4"
)
PY="$VENV/bin/python"
if [[ -x "$PY" ]] && "$PY" - "${PACKAGES[@]}" 2>/dev/null <<'PYEOF'
import sys
from importlib.metadata import version
sys.exit(any(version(n.split("[")[0]) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PYEOF
then
  echo "$PY"; exit 0
fi
echo "setting up $VENV with ${PACKAGES[*]}" >&2
[[ -x "$PY" ]] || python3 -m venv "$VENV"
"$PY" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
echo "$PY"
