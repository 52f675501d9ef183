# Sourced by the scripts that build llama.cpp (not run on its own): the source vendored in the
# PyPI sdist llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION, unpacked once into a cache directory,
# and a CPU-only Release build of the targets asked for, in one shared build directory.
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
