#!/usr/bin/env bash
# The kernel crate's tests on aarch64 from an x86-64 Linux host, under qemu user-mode emulation:
# the NEON kernels (row-major and packed, with `sdot` and with `smull`) against the scalar
# reference. Lints the crate for aarch64 first (clippy on the host does not see that code), then
# runs the tests twice: on qemu's default CPU (which has dotprod, so `Isa::NeonDot` and
# the `sdot` kernels run) and as a Cortex-A53 (no dotprod: only the `smull` kernels).
#
# Installs what it needs when missing: the Rust target `aarch64-unknown-linux-gnu` (rustup) and,
# with apt-get (as root, or through passwordless sudo), `qemu-user`, `gcc-aarch64-linux-gnu` and
# `libc6-dev-arm64-cross`. Release mode: building it costs about as much as debug, and the tests
# then run about ten times faster under emulation (docs/field-guide.md, 2026-12-06 late).
# Timings under qemu say nothing about speed on ARM hardware.
#
# Usage: scripts/test-aarch64.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
SYSROOT=/usr/aarch64-linux-gnu
LINKER=aarch64-linux-gnu-gcc

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  echo "== rustup target add $TARGET"
  rustup target add "$TARGET" || {
    echo "error: cannot add the Rust target $TARGET (rustup target add $TARGET)" >&2
    exit 1
  }
fi

if ! command -v qemu-aarch64 >/dev/null || ! command -v "$LINKER" >/dev/null || [[ ! -d "$SYSROOT/lib" ]]; then
  packages=(qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
  if [[ $(id -u) -eq 0 ]]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "error: qemu-aarch64, $LINKER or $SYSROOT is missing, and installing them needs root:" >&2
    echo "  sudo apt-get install -y ${packages[*]}" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "error: qemu-aarch64, $LINKER or $SYSROOT is missing and there is no apt-get; install" >&2
    echo "  qemu user-mode emulation, an aarch64 Linux cross gcc and its glibc, then rerun" >&2
    exit 1
  fi
  echo "== apt-get install ${packages[*]}"
  if ! DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q "${packages[@]}" >/dev/null; then
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q "${packages[@]}" >/dev/null || {
      echo "error: apt-get could not install ${packages[*]}" >&2
      exit 1
    }
  fi
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="$LINKER"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"

# The host's clippy never sees the aarch64-only code (the NEON kernels): lint it for this target.
echo "== cargo clippy -p anelm-kernels --target $TARGET"
cargo clippy -p anelm-kernels --target "$TARGET" --all-targets -- -D warnings
echo "== anelm-kernels tests on $TARGET under qemu (default CPU: NEON + dotprod)"
cargo test --release -p anelm-kernels --target "$TARGET" "$@"
echo "== anelm-kernels tests on $TARGET under qemu (Cortex-A53: NEON without dotprod)"
QEMU_CPU=cortex-a53 cargo test --release -p anelm-kernels --target "$TARGET" "$@"
