# Sourced by the model fetch scripts (not run on its own): where anelm's model cache lives (the
# same place the binary looks), sha256 of a file, the early exit for an already verified model,
# and the temp directory a fetch works in (beside the destination, removed on exit).

if [ -n "${XDG_CACHE_HOME:-}" ]; then
  ANELM_MODELS_DIR="$XDG_CACHE_HOME/anelm/models"
elif [ "$(uname -s)" = "Darwin" ]; then
  ANELM_MODELS_DIR="$HOME/Library/Caches/anelm/models"
else
  ANELM_MODELS_DIR="$HOME/.cache/anelm/models"
fi

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
