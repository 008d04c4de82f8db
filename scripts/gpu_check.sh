#!/usr/bin/env bash
# The GPU check, one command planned for under 5 minutes on a lent H100 (model generation included),
# so a 15-minute device budget holds a second call. On the GPU machine (16 cores, Python 3.12,
# torch 2.11.0+cu130, triton 3.6.0, no package index), with the device tool:
#
#   run(command="scripts/gpu_check.sh --out $OUT", carry=["gpu_wheels"], timeout_s=420)
#
# gpu_wheels/ (git-ignored) is made here by scripts/gpu_wheels.sh: the wheels the machine lacks and
# the Llama 3 vocabulary (128,256 tokens). Anywhere, without a GPU (CI: tests/test_gpu_check.py):
#
#   scripts/gpu_check.sh --dry-run [--out DIR]     # CPU, Triton interpreter, tiny shapes
#
# What comes back in DIR (at most 8 files, the device tool's limit): summary.json (every figure),
# summary.txt (the table, also printed last), logs.tar.gz (each step's log). Steps, each with its own
# timeout, the planned seconds on an H100 in brackets:
#   deps       [5]   missing wheels from gpu_wheels/ installed with pip --no-index --target (outside DIR)
#   model      [60]  a Llama-3-8B-shaped Q4_K_M model with random weights: 128,256-token vocabulary,
#                    Q6_K output head, llama.cpp's Q4_K_M type mix (make_tiny_model.py --random-blocks),
#                    generated into $TRITIUM_CACHE/gpu-check/ once per machine; meanwhile
#   precompile [60]  aot_compile.py --exact for its shapes (14 processes, the compile-only driver):
#                    triton's cache warm before anything runs, and no variant spills under this triton
#   timings    [45]  scripts/gpu_check.py: every kernel at 8B shapes as the engine runs it, GB/s and
#                    TFLOP/s against the measured copy bandwidth and bf16 matmul peak, and its error
#                    against its torch reference (a kernel over its tolerance fails the step)
#   e2e        [100] tritium-server --device cuda on the model: decode at 1, 8 and 32 streams (twice
#                    as many requests as streams, 128-token prompts, 128 tokens each), prefill of 512
#                    and 4096 tokens (time to first token), against the bandwidth bound
#   agreement  [40]  greedy tokens of the CUDA path and the CPU path on the model, 8 prompts x 32
#                    tokens, and the CUDA path teacher-forced on the CPU path's tokens
# The whole script is one { ... } block: bash parses it before running, so editing the file during
# a run cannot derail that run.
{
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=gpu_check_out
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--dry-run]" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)  # logs and installed wheels: only the three result files go into OUT
LOGS=$WORK/logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
T0=$(date +%s)
: > "$WORK/steps.tsv"

step() {  # step NAME TIMEOUT_S CMD...: run with a timeout, log to $LOGS/NAME.log, record rc and seconds
  local name=$1 limit=$2; shift 2
  local t=$(date +%s) rc
  echo "== $name (timeout ${limit}s): $*" | tee "$LOGS/$name.log"
  timeout -k 10 "$limit" bash -c '"$@"' _ "$@" >> "$LOGS/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" >> "$WORK/steps.tsv"
  tail -n 4 "$LOGS/$name.log"
  echo "== $name: rc=$rc in $(( $(date +%s) - t ))s"
}

if [ $DRY = 1 ]; then
  export TRITON_INTERPRET=1 TRITIUM_NO_CPU_KERNELS=1  # the CPU side on its torch paths: no C build in a fresh cache
  DEVICE=cpu
else
  unset TRITON_INTERPRET
  DEVICE=cuda
fi
export TRITIUM_CACHE=${TRITIUM_CACHE:-$HOME/.cache/tritium}
export OUT WORK LOGS DRY PY ROOT DEVICE

# deps: the wheels of gpu_wheels/ the machine lacks, into a folder outside OUT
deps() {
  local missing=()
  for m in gguf:gguf numpy:numpy yaml:pyyaml tqdm:tqdm requests:requests charset_normalizer:charset-normalizer \
           idna:idna urllib3:urllib3 certifi:certifi fastapi:fastapi starlette:starlette pydantic:pydantic \
           pydantic_core:pydantic-core annotated_types:annotated-types typing_extensions:typing-extensions \
           typing_inspection:typing-inspection annotated_doc:annotated-doc anyio:anyio \
           opentelemetry:opentelemetry-api uvicorn:uvicorn click:click h11:h11 httpx:httpx httpcore:httpcore; do
    "$PY" -c "import ${m%%:*}" 2>/dev/null || missing+=("${m##*:}")
  done
  echo "missing: ${missing[*]:-none}"
  [ ${#missing[@]} = 0 ] && return 0
  [ -d "$ROOT/gpu_wheels" ] || { echo "no gpu_wheels/: run scripts/gpu_wheels.sh where the index is reachable"; return 1; }
  "$PY" -m pip install -q --no-index --no-deps --find-links "$ROOT/gpu_wheels" --target "$WORK/pydeps" "${missing[@]}"
}
export -f deps
step deps "$( [ $DRY = 1 ] && echo 300 || echo 30 )" deps
export PYTHONPATH="$WORK/pydeps:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" > "$WORK/env.txt" 2>&1
cat "$WORK/env.txt"
if [ $DRY = 0 ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device (use --dry-run)')" || exit 1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$WORK/env.txt" 2>&1
fi

# model (and precompile beside it)
if [ $DRY = 1 ]; then
  MODEL="$WORK/tiny.gguf"
  MODEL_ARGS=(--arch llama --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 256 --ctx 1024 --type q4_k --builtin)
else
  mkdir -p "$TRITIUM_CACHE/gpu-check"
  MODEL="$TRITIUM_CACHE/gpu-check/llama3-8b-q4_k_m.gguf"
  VOCAB="$ROOT/gpu_wheels/ggml-vocab-llama-bpe.gguf"
  [ -f "$VOCAB" ] || VOCAB="$ROOT/../shared/vocab/ggml-vocab-llama-bpe.gguf"
  MODEL_ARGS=(--arch llama --layers 32 --embd 4096 --heads 32 --kv-heads 8 --ff 14336 --ctx 16384 --rope-base 500000
              --type q4_k --random-blocks --vocab "$VOCAB")
fi
export MODEL
make_model() {
  if [ -s "$MODEL" ]; then echo "reusing $MODEL"; return 0; fi
  "$PY" scripts/make_tiny_model.py "$@" --out "$MODEL.part" && mv "$MODEL.part" "$MODEL"
}
export -f make_model
if [ $DRY = 1 ]; then
  step precompile 300 "$PY" scripts/aot_compile.py --quick --list
  step model 300 make_model "${MODEL_ARGS[@]}"
else
  step precompile 150 "$PY" scripts/aot_compile.py --exact --shape llama3-8b --act bfloat16 --only qmatmul,attention,small,dequant --arch 90 --jobs 14 &
  PRE=$!
  step model 150 make_model "${MODEL_ARGS[@]}"
  wait $PRE
fi

# timings: every kernel, checked against its reference
if [ $DRY = 1 ]; then
  step timings 900 "$PY" scripts/gpu_check.py --smoke --out "$WORK"
else
  step timings 90 "$PY" scripts/gpu_check.py --out "$WORK"
fi

# e2e: the server on the model
e2e() {
  local port=${GPU_CHECK_PORT:-8093} srv levels nreq gen prompt ctx
  if [ $DRY = 1 ]; then
    srv=(-m "$MODEL" --device cpu -np 2 -kvu -c 1024); levels=1,2; gen=4; prompt=16; ctx=(64 128)
  else
    srv=(-m "$MODEL" --device cuda -np 32 -kvu -c 16384); levels=1,8,32; gen=128; prompt=128; ctx=(512 4096)
  fi
  local t=$(date +%s)
  "$PY" -m api.cli "${srv[@]}" --port "$port" > "$LOGS/server.log" 2>&1 &
  local pid=$! rc=0
  "$PY" - "$port" <<'PYEOF' || { kill "$pid"; wait "$pid" 2>/dev/null; return 1; }
import sys, time, httpx
t = time.time()
while time.time() - t < 600:
    try:
        if httpx.get(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
else:
    sys.exit("server not ready")
PYEOF
  echo "SERVER_READY_S $(( $(date +%s) - t ))"
  for c in ${levels//,/ }; do  # decode: twice as many requests as streams
    "$PY" scripts/bench.py "http://127.0.0.1:$port" --concurrency "$c" --requests-per-level $((2 * c)) \
      --prompt-tokens "$prompt-$prompt" --gen-tokens "$gen-$gen" --label decode --out "$WORK/e2e.jsonl" || rc=1
  done
  for p in "${ctx[@]}"; do  # prefill: time to the first token of a p-token prompt
    "$PY" scripts/bench.py "http://127.0.0.1:$port" --concurrency 1 --requests-per-level 2 \
      --prompt-tokens "$p-$p" --gen-tokens 1-1 --label "prefill$p" --out "$WORK/e2e.jsonl" || rc=1
  done
  grep -E "CUDA graph|launch configs|rejected|Error|error" "$LOGS/server.log" | head -8
  kill "$pid"; wait "$pid" 2>/dev/null
  return $rc
}
export -f e2e
step e2e "$( [ $DRY = 1 ] && echo 900 || echo 150 )" e2e

# agreement: the CUDA path against the CPU path on the model
if [ $DRY = 1 ]; then
  step agreement 900 "$PY" scripts/gpu_check.py --smoke --agreement "$MODEL" --out "$WORK"
else
  step agreement 90 "$PY" scripts/gpu_check.py --agreement "$MODEL" --out "$WORK"
fi

# summary: summary.json + summary.txt in OUT, the logs tarred
"$PY" - "$WORK" "$OUT" "$MODEL" "$DRY" "$(( $(date +%s) - T0 ))" <<'PYEOF'
import json, sys
from pathlib import Path
work, out, model, dry, secs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
steps = [dict(zip(("step", "rc", "seconds"), l.split("\t"))) for l in (work / "steps.tsv").read_text().splitlines()]
def load(name):
    try:
        return json.loads((work / name).read_text())
    except (OSError, ValueError):
        return None
timings, agreement = load("timings.json"), load("agreement.json")
e2e = [json.loads(l) for l in (work / "e2e.jsonl").read_text().splitlines() if l.startswith("{")] \
    if (work / "e2e.jsonl").exists() else []
bw = (timings or {}).get("summary", {}).get("copy_GBps")
weights = None
try:  # bytes a decode step reads: every matrix but the embedding table
    from gguf import GGML_QUANT_SIZES
    from runtime.model.gguf import read_gguf
    gf = read_gguf(model)
    weights = sum(t.n_elements // GGML_QUANT_SIZES[t.qtype][0] * GGML_QUANT_SIZES[t.qtype][1]
                  for t in gf.tensors if t.name != "token_embd.weight")
except Exception as e:  # noqa: BLE001
    print("no model size:", e)
bound = bw * 1e9 / weights if bw and weights else None
server_ready = None
for l in (work / "logs" / "e2e.log").read_text().splitlines() if (work / "logs" / "e2e.log").exists() else []:
    if l.startswith("SERVER_READY_S"):
        server_ready = int(l.split()[1])
decode = {r["concurrency"]: r for r in e2e if r.get("server") == "decode"}
prefill = {r["server"]: r for r in e2e if str(r.get("server", "")).startswith("prefill")}
summary = {"dry_run": dry, "seconds": secs, "env": (work / "env.txt").read_text().strip().splitlines(),
           "steps": steps, "weights_bytes_per_token": weights, "bound_tok_s": bound, "server_ready_s": server_ready,
           "decode": {c: {"streams": c, "tok_s_per_stream": r.get("decode_tokens_per_s_median"),
                          "tok_s_total": r.get("gen_tokens_per_s"), "requests": r.get("requests"),
                          "errors": r.get("errors")} for c, r in decode.items()},
           "prefill": {k: {"prompt_tokens": int(k[7:]), "ttft_ms": r.get("ttft_ms_median"),
                           "tok_s": int(k[7:]) / (r["ttft_ms_median"] / 1e3) if r.get("ttft_ms_median") else None}
                       for k, r in prefill.items()},
           "kernels": (timings or {}).get("summary"), "kernel_failures": (timings or {}).get("failures"),
           "agreement": agreement}
(out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
lines = [f"GPU check ({'DRY RUN: CPU, interpreter, tiny shapes' if dry else 'GPU'}), {secs} s in all",
         *summary["env"][:3], "", "| step | rc | s |", "| --- | --- | --- |"]
lines += [f"| {s['step']} | {s['rc']} | {s['seconds']} |" for s in steps]
lines += ["", f"decode (bound {bound:.0f} tok/s: {weights / 1e9:.2f} GB per token at {bw:.0f} GB/s)" if bound else "decode",
          "| streams | tok/s per stream | tok/s total | of bound (1 stream) |", "| --- | --- | --- | --- |"]
for c, d in sorted(summary["decode"].items()):
    frac = f"{d['tok_s_per_stream'] / bound:.0%}" if bound and d["tok_s_per_stream"] and c == 1 else "-"
    lines.append(f"| {c} | {d['tok_s_per_stream']} | {d['tok_s_total']} | {frac} |")
lines += ["", "| prefill tokens | TTFT ms | tok/s |", "| --- | --- | --- |"]
lines += [f"| {p['prompt_tokens']} | {p['ttft_ms']} | {p['tok_s'] and round(p['tok_s'])} |" for p in summary["prefill"].values()]
k = summary["kernels"] or {}
lines += ["", "kernels: " + ", ".join(f"{a} {b:.1f}" if isinstance(b, float) else f"{a} {b}" for a, b in k.items()
                                    if not a.startswith("paged_decode"))]
for f in (summary["kernel_failures"] or [])[:4]:
    lines.append(f"KERNEL FAILURE {f}")
lines.append("agreement: " + json.dumps(agreement))
lines.append(f"server ready in {server_ready} s")
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
fail=0
while IFS=$'\t' read -r name rc secs; do [ "$rc" = 0 ] || fail=1; done < "$WORK/steps.tsv"
cp "$WORK/env.txt" "$WORK/steps.tsv" "$LOGS/" 2>/dev/null
for f in timings.json agreement.json e2e.jsonl; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$LOGS/"; done
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
rm -rf "$WORK"
n=$(find "$OUT" -type f | wc -l)
echo "$n files in $OUT"
[ "$n" -le 8 ] || { echo "more than 8 files in $OUT: the device tool returns only 8"; fail=1; }
exit $fail
}
