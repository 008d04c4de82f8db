#!/usr/bin/env bash
# On a CUDA machine: run the Triton kernel tests natively (no interpreter), then time every kernel
# at Llama-3-8B / Qwen2.5-7B layer shapes against torch. Budget: under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
unset TRITON_INTERPRET
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')" || exit 1
echo "== kernel tests (native CUDA)"
TRITIUM_KERNEL_DEVICE=cuda timeout 240 "$PY" -m pytest -q -x tests/test_kernels_triton.py tests/test_kernels_ref.py tests/test_model_triton.py
rc_tests=$?
echo "== kernel timings"
timeout 300 "$PY" scripts/gpu_check.py
rc_bench=$?
echo "tests rc=$rc_tests bench rc=$rc_bench"
exit $(( rc_tests != 0 || rc_bench != 0 ))
