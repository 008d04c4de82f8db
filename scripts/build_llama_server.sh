#!/usr/bin/env bash
# Build llama.cpp's llama-server (the reference tritium is measured against) from the llama.cpp
# tree vendored in the llama-cpp-python source distribution, which needs only the package index:
# llama-cpp-python 0.3.36 vendors llama.cpp commit 0c1e570, the build the specification shows
# (`llama-server --version`: "version: 0.5.0-dev (build 1, commit 0c1e570)").
#
#   bash scripts/build_llama_server.sh [DIR]     # default DIR: ./build-llama-server
#   DIR/llama-server -m model.gguf --port 8081 -np 4 -c 8192     (a link into DIR/src/.../build/bin)
#
# Needs cmake, a C++ compiler and ninja or make; about 8 minutes on 2 cores. CPU build only.
set -euo pipefail
OUT=$(realpath -m "${1:-build-llama-server}")
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PY=${PYTHON:-python3}
mkdir -p "$OUT/src"
cd "$OUT/src"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
    "$PY" -m pip download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d . -q
    tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
cd "llama_cpp_python-$VERSION/vendor/llama.cpp"
GEN=()
if command -v ninja > /dev/null; then GEN=(-G Ninja); fi
# GGML_NATIVE compiles for this CPU, AMX included where /proc/cpuinfo lists it; but a virtual machine
# may list amx_tile without letting a process use the tile registers (seen here: Xeon VMs whose
# llama-server dies with SIGILL on `tilezero` in the first Q8_0 matmul), so AMX stays off: the AVX-512
# VNNI paths are what llama.cpp runs on such a machine. LLAMA_NO_AMX=0 keeps it.
NO_AMX=()
if [ "${LLAMA_NO_AMX:-1}" = 1 ]; then NO_AMX=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"); fi
cmake -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    "${NO_AMX[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON > "$OUT/cmake.log"
cmake --build build --target llama-server -j "$(nproc)" > "$OUT/build.log"
# the binary finds its shared libraries through the build tree's RUNPATH: link, do not copy
ln -sf "$PWD/build/bin/llama-server" "$OUT/llama-server"
"$OUT/llama-server" --version 2>&1 | tail -2
