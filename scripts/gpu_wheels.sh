#!/usr/bin/env bash
# Download, on a machine with the package index, the wheels scripts/gpu_check.sh installs on the
# GPU machine (Python 3.12, torch 2.11.0+cu130, triton 3.6.0, no package index there), and copy the
# Llama 3 vocabulary (128,256 tokens, ../shared/vocab/ggml-vocab-llama-bpe.gguf, 7.8 MB) its model uses:
#
#   scripts/gpu_wheels.sh [DIR]        # default DIR: gpu_wheels/ (git-ignored)
#
# Every wheel is named with its dependencies (pip --no-deps: nothing is resolved on the way), for
# CPython 3.12 on manylinux x86_64, binary only. Versions are those of this checkout's .venv when
# it has the package (tested together), else the newest. Total: about 30 MB.
#
# The folder is git-ignored: pass it to the device tool with carry=["gpu_wheels"] (or copy it
# next to the tree some other way); gpu_check.sh looks for it in the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-gpu_wheels}
PIP=${PIP:-.venv/bin/pip}
[ -x "$PIP" ] || PIP="python3 -m pip"

PKGS=(
  # the model file format
  gguf numpy pyyaml tqdm requests charset-normalizer idna urllib3 certifi
  # the HTTP server
  fastapi starlette pydantic pydantic-core annotated-types typing-extensions typing-inspection
  annotated-doc anyio opentelemetry-api uvicorn click h11
  # the bench client (pytest and pytest-xdist are on the machine's image already)
  httpx httpcore
)

pinned=()
freeze=$($PIP freeze 2>/dev/null || true)
for p in "${PKGS[@]}"; do
  v=$(printf '%s\n' "$freeze" | awk -F'==' -v n="$p" 'BEGIN{IGNORECASE=1} {k=$1; gsub("_","-",k)} tolower(k)==tolower(n) {print $2}')
  if [ -n "$v" ]; then pinned+=("$p==$v"); else pinned+=("$p"); fi
done
mkdir -p "$DIR"
$PIP download --no-deps --only-binary :all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  -d "$DIR" "${pinned[@]}"
VOCAB=${VOCAB:-../shared/vocab/ggml-vocab-llama-bpe.gguf}
[ -f "$VOCAB" ] && cp "$VOCAB" "$DIR/" || echo "no $VOCAB: gpu_check.sh will look for ../shared/vocab on the GPU machine"
ls "$DIR" > "$DIR/MANIFEST.txt"
echo "$(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR (git-ignored: carry it, see the header)"
