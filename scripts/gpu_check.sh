#!/usr/bin/env bash
# The GPU check, in one command that fits 8 minutes on the lent GPU machine (one H200, 16 cores,
# Python 3.12, torch 2.11.0+cu130, triton 3.6.0, no package index):
#
#   scripts/gpu_check.sh [--out DIR] [--eager]     # on the GPU machine
#   scripts/gpu_check.sh --dry-run [--out DIR]     # anywhere: CPU, Triton interpreter, tiny shapes (CI)
#
# Steps, each with its own timeout, each one's output teed to DIR/<step>.log (default DIR:
# gpu_check_out/), a one-screen summary last (DIR/summary.txt):
#   0 deps       wheels from gpu_wheels/ (scripts/gpu_wheels.sh, carried with the tree:
#                device tool carry=["gpu_wheels"]) installed with pip --no-index --target DIR/pydeps,
#                which goes on PYTHONPATH; packages already importable are left alone
#   1 precompile scripts/aot_compile.py --exact for the shapes of steps 3 and 4 (16 processes,
#                the compile-only driver), filling triton's cache before anything runs
#   2 tests      kernel and model tests natively (TRITIUM_KERNEL_DEVICE=cuda), 8 pytest-xdist
#                workers when available, never -x
#   3 timings    scripts/gpu_check.py (kernels at Llama-3-8B shapes against torch, GB/s and
#                TFLOP/s against the measured copy bandwidth / matmul peak) -> DIR/timings.json
#   4 e2e        tritium-server --device cuda on an 8B-shaped Q4_K model with random weights
#                (generated once into $TRITIUM_CACHE/gpu-check/, reused), one and eight streams
#                (scripts/bench.py), tok/s against the HBM bound (weights bytes per token / copy
#                bandwidth); --eager adds a run with TRITIUM_CUDA_GRAPHS=0 (about +1 minute)
# Planned GPU timings (seconds): deps 10, precompile 90, tests 120, timings 100, e2e 150 = 470;
# the timeouts (40 + 100 + 140 + 110 + 170 = 560) keep even the worst case under the device tool's
# 600 s per command, so the summary always comes back. With the device tool:
#   run(command="scripts/gpu_check.sh --out $OUT/gpu", carry=["gpu_wheels"], timeout_s=600)
# ($OUT comes back; the 8B model stays in $TRITIUM_CACHE on the machine while it is warm.)
# The whole script is one { ... } block: bash parses it before running, so editing the file
# during a run cannot derail that run.
{
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=gpu_check_out
DRY=0
EAGER=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --eager) EAGER=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--dry-run] [--eager]" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
T0=$(date +%s)
declare -A RC SECS
STEPS=()

step() {  # step NAME TIMEOUT_S CMD...: run with a timeout, tee to $OUT/NAME.log, record rc and time
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  echo "== $name (timeout ${limit}s): $*" | tee "$OUT/$name.log"
  # through bash -c: shell functions (exported below) get the same timeout as commands
  timeout -k 10 "$limit" bash -c '"$@"' _ "$@" 2>&1 | tee -a "$OUT/$name.log"
  RC[$name]=${PIPESTATUS[0]}
  SECS[$name]=$(( $(date +%s) - t ))
  STEPS+=("$name")
  echo "== $name: rc=${RC[$name]} in ${SECS[$name]}s" | tee -a "$OUT/$name.log"
}

if [ $DRY = 1 ]; then
  export TRITON_INTERPRET=1
  DEVICE=cpu
else
  unset TRITON_INTERPRET
  DEVICE=cuda
fi
export TRITIUM_CACHE=${TRITIUM_CACHE:-$HOME/.cache/tritium}
export OUT DRY EAGER PY ROOT DEVICE

# 0: dependencies from the carried wheels
deps() {
  local missing=()
  for m in gguf:gguf numpy:numpy yaml:pyyaml tqdm:tqdm requests:requests charset_normalizer:charset-normalizer \
           idna:idna urllib3:urllib3 certifi:certifi fastapi:fastapi starlette:starlette pydantic:pydantic \
           pydantic_core:pydantic-core annotated_types:annotated-types typing_extensions:typing-extensions \
           typing_inspection:typing-inspection annotated_doc:annotated-doc anyio:anyio \
           opentelemetry:opentelemetry-api uvicorn:uvicorn click:click h11:h11 httpx:httpx httpcore:httpcore \
           pytest:pytest pluggy:pluggy iniconfig:iniconfig packaging:packaging pygments:pygments \
           xdist:pytest-xdist execnet:execnet; do
    "$PY" -c "import ${m%%:*}" 2>/dev/null || missing+=("${m##*:}")
  done
  echo "missing: ${missing[*]:-none}"
  [ ${#missing[@]} = 0 ] && return 0
  if [ ! -d "$ROOT/gpu_wheels" ]; then
    echo "no gpu_wheels/ folder: run scripts/gpu_wheels.sh where the package index is reachable, carry it"
    # pytest-xdist only parallelizes the tests; anything else missing is fatal
    [ "${missing[*]}" = "pytest-xdist execnet" ] && return 0
    return 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --find-links "$ROOT/gpu_wheels" --target "$OUT/pydeps" "${missing[@]}"
}
export -f deps
step deps "$( [ $DRY = 1 ] && echo 300 || echo 40 )" deps
export PYTHONPATH="$OUT/pydeps:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, triton; print('python', __import__('sys').version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/env.txt"
if [ $DRY = 0 ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device (use --dry-run)')" || exit 1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/env.txt" 2>&1
fi

# 1: precompile (triton's cache) the variants the timings and the e2e model launch
if [ $DRY = 1 ]; then
  step precompile 300 "$PY" scripts/aot_compile.py --quick --list
else
  step precompile 100 "$PY" scripts/aot_compile.py --exact --shape llama3-8b --act bfloat16 --arch 90 --jobs 16
fi

# 2: kernel and model tests, natively, every failure reported
XDIST=()
[ $DRY = 0 ] && "$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 8)
if [ $DRY = 1 ]; then
  step tests 600 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" tests/test_kernels_triton.py \
    -k "test_qmatmul and (Q4_K or Q8_0) and 5 or decode_one or tuner"
else
  step tests 140 env TRITIUM_KERNEL_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
    tests/test_kernels_triton.py tests/test_model_triton.py
fi

# 3: kernel timings
if [ $DRY = 1 ]; then
  step timings 600 "$PY" scripts/gpu_check.py --smoke --out "$OUT"
else
  step timings 110 "$PY" scripts/gpu_check.py --out "$OUT"
fi

# 4: end to end
e2e() {
  local model args port=8093
  if [ $DRY = 1 ]; then
    model="$OUT/tiny.gguf"; port=${GPU_CHECK_PORT:-8190}
    args=(--arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 --ctx 512 --type q4_k)
  else
    mkdir -p "$TRITIUM_CACHE/gpu-check"
    model="$TRITIUM_CACHE/gpu-check/llama8b-q4k.gguf"
    args=(--arch llama --layers 32 --embd 4096 --heads 32 --kv-heads 8 --ff 14336 --ctx 8192 --type q4_k --random-blocks)
  fi
  if [ ! -s "$model" ]; then
    local vocab=../shared/vocab/ggml-vocab-llama-bpe.gguf src=(--builtin)
    [ -f "$vocab" ] && src=(--vocab "$vocab")
    "$PY" scripts/make_tiny_model.py "${src[@]}" "${args[@]}" --out "$model.part" && mv "$model.part" "$model" || return 1
  else
    echo "reusing $model"
  fi
  serve_and_bench "$model" "$port" "" 1,8 3 || return 1
  if [ $EAGER = 1 ]; then serve_and_bench "$model" $((port + 1)) eager 1 2 || return 1; fi
  "$PY" - "$model" "$OUT/e2e.jsonl" "$DEVICE" <<'PYEOF'
import json, sys, time
import torch
from gguf import GGML_QUANT_SIZES
from runtime.model.gguf import read_gguf
gf = read_gguf(sys.argv[1])
# bytes read per decoded token: every tensor but the embedding table (gathered, one row)
def nbytes(t):
    bs, ts = GGML_QUANT_SIZES[t.qtype]
    return t.n_elements // bs * ts
per_token = sum(nbytes(t) for t in gf.tensors if t.name != "token_embd.weight")
dev = sys.argv[3]
n = (1 << 28) if dev == "cuda" else (1 << 20)
a = torch.empty(n, device=dev); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
if dev == "cuda": torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10): b.copy_(a)
if dev == "cuda": torch.cuda.synchronize()
bw = 10 * 2 * a.numel() * 4 / (time.perf_counter() - t)
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
one = [r for r in rows if r.get("concurrency") == 1 and r.get("label") != "eager"]
tps = one[-1].get("decode_tokens_per_s_median", float("nan")) if one else float("nan")
bound = bw / per_token
print("E2E " + json.dumps({"weights_bytes_per_token": per_token, "copy_GBps": bw / 1e9, "bound_tokens_per_s": bound,
                           "decode_tokens_per_s": tps, "fraction_of_bound": tps / bound}))
PYEOF
}
serve_and_bench() {  # MODEL PORT LABEL LEVELS REQUESTS
  local model=$1 port=$2 label=$3 levels=$4 nreq=$5 log="$OUT/server${3:+-$3}.log" rc
  local env=() srv=(-m "$model" --device "$DEVICE" -np 8 -c 8192 --port "$port")
  [ -n "$label" ] && env=(TRITIUM_CUDA_GRAPHS=0) && srv=(-m "$model" --device "$DEVICE" -np 1 -c 4096 --port "$port")
  # dry run: the torch paths (no C kernel build into a fresh cache: not what is checked here)
  [ $DRY = 1 ] && srv=(-m "$model" --device cpu -np 2 -c 512 --port "$port") && env=(TRITIUM_NO_CPU_KERNELS=1)
  env "${env[@]}" "$PY" -m api.cli "${srv[@]}" > "$log" 2>&1 &
  local pid=$!
  local gen=128 wait=150
  [ $DRY = 1 ] && gen=8 && wait=300
  "$PY" scripts/bench.py "http://127.0.0.1:$port" --concurrency "$levels" --prompt-tokens 128-128 \
    --gen-tokens "$gen-$gen" --requests-per-level "$nreq" --wait "$wait" ${label:+--label "$label"} --out "$OUT/e2e.jsonl"
  rc=$?
  grep -E "CUDA graph|launch configs|error|Error" "$log" | head -5
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  return $rc
}
rm -f "$OUT/e2e.jsonl"
export -f e2e serve_and_bench
if [ $DRY = 1 ]; then step e2e 600 e2e; else step e2e 170 e2e; fi

# summary: one screen
{
  echo "== GPU check summary ($( [ $DRY = 1 ] && echo 'DRY RUN: CPU, interpreter, tiny shapes' || echo GPU )), $(( $(date +%s) - T0 )) s in all"
  head -3 "$OUT/env.txt"
  for s in "${STEPS[@]}"; do printf '%-11s rc=%-4s %5ss\n' "$s" "${RC[$s]}" "${SECS[$s]}"; done
  echo "-- precompile"; grep -E "^[0-9]+ compilations|^FAIL" "$OUT/precompile.log" | head -4
  grep -E "variants of" "$OUT/precompile.log" | head -1
  echo "-- tests"; grep -E "passed|failed|error" "$OUT/tests.log" | tail -1
  grep -E "^FAILED" "$OUT/tests.log" | head -6
  echo "-- timings"
  "$PY" - "$OUT/timings.json" <<'PYEOF' 2>/dev/null || echo "no timings.json"
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
for k, v in s.items():
    print(f"{k:58s} {v:8.2f}" if isinstance(v, (int, float)) else f"{k:58s} {v}")
PYEOF
  echo "-- e2e"; grep -E "^E2E" "$OUT/e2e.log" | cut -c1-300 || echo "no e2e figures"
} | tee "$OUT/summary.txt"
fail=0
for s in "${STEPS[@]}"; do [ "${RC[$s]}" = 0 ] || fail=1; done
exit $fail
}
