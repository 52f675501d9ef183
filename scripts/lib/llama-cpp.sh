# Sourced by the scripts that build llama.cpp (not run on its own): the source vendored in the
# PyPI sdist llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION, unpacked once into a cache directory,
# and a CPU-only Release build of the targets asked for, in one shared build directory.
#
# Two variants on x86-64: `native` (GGML_NATIVE=ON: every instruction set the CPU has, AMX
# included) and `noamx` (the same AVX/AVX-512 sets named one by one, AMX off). On a CPU with AMX
# llama.cpp's AMX kernels crash its prefill (SmolLM2 Q4_1, Gemma 3 Q4_K_M on Sapphire Rapids)
# while its decode is faster with them, so the benchmarks run both there.
# Needs python3 + pip, a C++ compiler and CMake (installed from Debian's packages if missing).

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_DIR="${ANELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/anelm}/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_CPP_SRC="$LLAMA_CPP_DIR/src"
LLAMA_CPP_BUILD="$LLAMA_CPP_DIR/build"

# llama_cpp_source: download and unpack the vendored source into $LLAMA_CPP_SRC (once).
llama_cpp_source() {
  [[ -d "$LLAMA_CPP_SRC" ]] && return 0
  mkdir -p "$LLAMA_CPP_DIR"
  echo "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION source from PyPI" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check --no-binary=llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$LLAMA_CPP_DIR/dl" >&2
  rm -rf "$LLAMA_CPP_DIR/unpack" && mkdir -p "$LLAMA_CPP_DIR/unpack"
  tar -xzf "$LLAMA_CPP_DIR/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$LLAMA_CPP_DIR/unpack"
  mv "$LLAMA_CPP_DIR/unpack/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" "$LLAMA_CPP_SRC"
  rm -rf "$LLAMA_CPP_DIR/unpack"
}

# llama_cpp_has_amx: whether this CPU has AMX-INT8 (or ANELM_LLAMACPP_BOTH_BUILDS=1 asks to act
# as if it had, to exercise the two-build path elsewhere).
llama_cpp_has_amx() {
  [[ "${ANELM_LLAMACPP_BOTH_BUILDS:-0}" == 1 ]] && return 0
  grep -qw amx_int8 /proc/cpuinfo 2>/dev/null
}

# llama_cpp_build_dir VARIANT: the build directory of `native` or `noamx`.
llama_cpp_build_dir() {
  case "$1" in
    native) echo "$LLAMA_CPP_BUILD" ;;
    noamx) echo "$LLAMA_CPP_DIR/build-noamx" ;;
    *) echo "unknown llama.cpp build variant: $1 (native or noamx)" >&2; return 2 ;;
  esac
}

# llama_cpp_build_variant VARIANT TARGET...: llama_cpp_build in VARIANT's build directory.
llama_cpp_build_variant() {
  local variant="$1"; shift
  local dir
  dir="$(llama_cpp_build_dir "$variant")" || return 2
  if [[ "$variant" == native ]]; then
    llama_cpp_build "$@"
    return
  fi
  llama_cpp_source
  # The x86 instruction sets this CPU has, named as ggml's options, AMX left out.
  local flags isa=()
  flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
  has() { [[ " $flags " == *" $1 "* ]]; }
  has avx && isa+=(-DGGML_AVX=ON)
  has avx2 && isa+=(-DGGML_AVX2=ON)
  has fma && isa+=(-DGGML_FMA=ON)
  has f16c && isa+=(-DGGML_F16C=ON)
  has bmi2 && isa+=(-DGGML_BMI2=ON)
  has avx_vnni && isa+=(-DGGML_AVX_VNNI=ON)
  has avx512f && isa+=(-DGGML_AVX512=ON)
  has avx512vbmi && isa+=(-DGGML_AVX512_VBMI=ON)
  has avx512_vnni && isa+=(-DGGML_AVX512_VNNI=ON)
  has avx512_bf16 && isa+=(-DGGML_AVX512_BF16=ON)
  echo "configuring llama.cpp (CPU, Release, no AMX: ${isa[*]}) in $dir" >&2
  cmake -S "$LLAMA_CPP_SRC" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${isa[@]}" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
  echo "building llama.cpp targets (no AMX): $*" >&2
  cmake --build "$dir" --target "$@" -j "$(nproc)" >&2
}

# llama_cpp_build TARGET...: configure (once) and build the given CMake targets.
llama_cpp_build() {
  llama_cpp_source
  if ! command -v cmake >/dev/null; then
    echo "installing cmake from Debian's packages" >&2
    if [[ $(id -u) -eq 0 ]]; then apt-get install -y -q cmake >&2; else sudo apt-get install -y -q cmake >&2; fi
  fi
  # Configuring again with the same options is quick and changes nothing; the server target is
  # configured (without TLS, and without fetching a prebuilt web UI) but only built when asked.
  echo "configuring llama.cpp (CPU, Release) in $LLAMA_CPP_BUILD" >&2
  cmake -S "$LLAMA_CPP_SRC" -B "$LLAMA_CPP_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
  echo "building llama.cpp targets: $*" >&2
  cmake --build "$LLAMA_CPP_BUILD" --target "$@" -j "$(nproc)" >&2
}
