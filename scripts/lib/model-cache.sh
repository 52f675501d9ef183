# Sourced by the model fetch and fixture scripts (not run on its own): where anelm's cache and
# its models live (the same place the binary looks), sha256 of a file, the early exit for an already verified model,
# and the temp directory a fetch works in (beside the destination, removed on exit).

# ANELM_CACHE_DIR holds the models and the scripts' virtualenvs.
if [ -n "${XDG_CACHE_HOME:-}" ]; then
  ANELM_CACHE_DIR="$XDG_CACHE_HOME/anelm"
elif [ "$(uname -s)" = "Darwin" ]; then
  ANELM_CACHE_DIR="$HOME/Library/Caches/anelm"
else
  ANELM_CACHE_DIR="$HOME/.cache/anelm"
fi
ANELM_MODELS_DIR="$ANELM_CACHE_DIR/models"

sha_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
  else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

# exit_if_verified FILE SHA256: print FILE and exit 0 when it is already there and intact.
exit_if_verified() {
  if [ -f "$1" ] && [ "$(sha_of "$1")" = "$2" ]; then
    echo "$1"
    exit 0
  fi
}

# start_fetch: check for python with pip (PY, from $PYTHON or python3) and make `tmp`, a work
# directory in the models directory that is removed when the script exits.
start_fetch() {
  PY="${PYTHON:-python3}"
  command -v "$PY" >/dev/null 2>&1 || { echo "error: python3 with pip is needed to fetch the model (set PYTHON=...)" >&2; exit 1; }
  mkdir -p "$ANELM_MODELS_DIR"
  tmp=$(mktemp -d "$ANELM_MODELS_DIR/.fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
}
