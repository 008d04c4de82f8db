#!/usr/bin/env bash
# On a CUDA machine: run the Triton kernel tests natively (no interpreter), then time every kernel
# at Llama-3-8B / Qwen2.5-7B layer shapes against torch, then serve an 8B-shaped Q4_K model with
# `--device cuda` and measure one stream against the HBM-bandwidth bound. Budget: under 8 minutes
# for the kernel part; the end-to-end part adds a few minutes.
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
echo "== end to end: tritium-server --device cuda on an 8B-shaped Q4_K model (random weights), one stream"
MODEL=${TMPDIR:-/tmp}/tritium-llama8b-q4k.gguf
VOCAB=../shared/vocab/ggml-vocab-llama-bpe.gguf
if [ -f "$VOCAB" ]; then SRC=(--vocab "$VOCAB"); else SRC=(--builtin); fi
timeout 240 "$PY" scripts/make_tiny_model.py "${SRC[@]}" --arch llama --layers 32 --embd 4096 --heads 32 \
    --kv-heads 8 --ff 14336 --ctx 8192 --type q4_k --random-blocks --out "$MODEL"
"$PY" -m api.cli -m "$MODEL" --device cuda -np 8 -c 8192 --port 8093 > "${TMPDIR:-/tmp}/tritium-e2e.log" 2>&1 &
SERVER=$!
timeout 420 "$PY" scripts/bench.py http://127.0.0.1:8093 --concurrency 1,8 --prompt-tokens 128-128 \
    --gen-tokens 128-128 --requests-per-level 3 --wait 300 | tee "${TMPDIR:-/tmp}/tritium-e2e.jsonl"
rc_e2e=${PIPESTATUS[0]}
grep -E "CUDA graph" "${TMPDIR:-/tmp}/tritium-e2e.log"
kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
echo "== the same with CUDA graphs off (TRITIUM_CUDA_GRAPHS=0), one stream"
TRITIUM_CUDA_GRAPHS=0 "$PY" -m api.cli -m "$MODEL" --device cuda -np 1 -c 4096 --port 8094 > "${TMPDIR:-/tmp}/tritium-e2e-eager.log" 2>&1 &
SERVER=$!
timeout 300 "$PY" scripts/bench.py http://127.0.0.1:8094 --concurrency 1 --prompt-tokens 128-128 \
    --gen-tokens 128-128 --requests-per-level 2 --wait 240 --label eager
kill $SERVER 2>/dev/null
"$PY" - "$MODEL" "${TMPDIR:-/tmp}/tritium-e2e.jsonl" <<'PYEOF'
import json, sys, time
import torch
from runtime.loader import load_model
lm = load_model(sys.argv[1])
per_token = sum(w.nbytes for n, w in lm.weights.items() if n != "token_embd.weight" and hasattr(w, "nbytes"))
a = torch.empty(1 << 28, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): b.copy_(a)
torch.cuda.synchronize(); bw = 10 * 2 * a.numel() * 4 / (time.perf_counter() - t)
bound = bw / per_token
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
one = [r for r in rows if r.get("concurrency") == 1]
tps = one[-1]["decode_tokens_per_s_median"] if one else float("nan")
print(json.dumps({"weights_bytes_per_token": per_token, "hbm_GBps": bw / 1e9, "bound_tokens_per_s": bound,
                  "decode_tokens_per_s": tps, "fraction_of_bound": tps / bound}))
PYEOF
echo "tests rc=$rc_tests bench rc=$rc_bench e2e rc=$rc_e2e"
exit $(( rc_tests != 0 || rc_bench != 0 || rc_e2e != 0 ))
