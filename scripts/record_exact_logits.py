"""Records the reference build's logits on the two real models into tests/data/exact_logits.json.

tests/test_exact_numerics.py checks that tritium's CPU forward gives the same float32 logits, bit
for bit (sha256 of every step's logits), as llama.cpp b1-0c1e570's libllama on the same file, the
same tokens and the same prompt batches (llama-server's: one batch, or on a sliding-window model
the batches that end before its context checkpoints, `runtime.serving.plan.prompt_breaks`), then a
few greedy decode steps. The bits depend on the instruction set llama.cpp was built for (its float
order differs between its AVX2 and AVX-512 kernels); this records the machine's flags.

    python scripts/fetch_models.py
    python scripts/record_exact_logits.py --out tests/data/exact_logits.json
    # LLAMA_CPP=<llama.cpp source tree with build/bin/libllama.so> (default: scripts/build_llama_server.sh's)
    # one model into an existing recording of the same float order (the others kept):
    python scripts/record_exact_logits.py --out tests/data/avx2/exact_logits.json --models smollm2-135m-instruct --merge
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["The capital of France is", "Q: What is 12 times 7?\nA:",
           "def mean(xs):\n    \"\"\"Return the arithmetic mean of a list of numbers.\"\"\"\n    return",
           # 64 rows or more in a batch: llama.cpp's tiled flash attention
           "The history of the Roman Empire is long and complex. It began with the founding of the city of Rome, "
           "according to legend in 753 BC, by Romulus and Remus. Over the centuries the small settlement grew into "
           "a republic, and then into an empire that stretched from Britain to Egypt and Syria, ruled by emperors "
           "in Rome. Its"]
N_DECODE = 3
TOP = 5


def batches_for(model_key: str, n_prompt: int) -> list[int]:
    """llama-server's prompt batches for a completion of n_prompt tokens (defaults: n_batch 2048,
    n_ubatch 512): split at its checkpoint positions on the sliding-window model (Gemma 3)."""
    from runtime.serving.plan import prompt_breaks

    ends = list(prompt_breaks(n_prompt, 2048, 512)) if model_key.startswith("gemma") else []
    ends.append(n_prompt)
    return [b - a for a, b in zip([0] + ends[:-1], ends)]


def step_record(logits: np.ndarray) -> dict:
    top = np.argsort(-logits, kind="stable")[:TOP]
    return {"sha256": hashlib.sha256(logits.astype(np.float32).tobytes()).hexdigest(),
            "argmax": int(top[0]), "top": [[int(i), float(logits[i])] for i in top]}


def main() -> None:
    from runtime.model.model_files import GEMMA, MODELS, QWEN
    from runtime.tokenizer import load_tokenizer
    from tests.llama_tokens import real_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/exact_logits.json")
    ap.add_argument("--models", default=f"{QWEN.key},{GEMMA.key}", help="comma-separated keys of model_files.MODELS")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other models of an existing --out (recorded on a CPU with the same flags)")
    a = ap.parse_args()
    root = Path(os.environ.get("LLAMA_CPP", "/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    src = Path(__file__).resolve().parent / "llama_logits_ref.c"
    flags = sorted(f for f in open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
                   if f.startswith(("avx", "fma", "f16c")))
    out = {"recorded_with": "python scripts/record_exact_logits.py (scripts/llama_logits_ref.c against libllama of "
                            "llama.cpp b1-0c1e570, the build of scripts/build_llama_server.sh)",
           "cpu_flags": flags, "n_decode": N_DECODE, "models": {}}
    if a.merge and Path(a.out).exists():
        old = json.loads(Path(a.out).read_text(encoding="utf-8"))
        if old["cpu_flags"] != flags or old["n_decode"] != N_DECODE:
            sys.exit(f"{a.out} was recorded with cpu_flags {old['cpu_flags']}, this CPU has {flags}: not merged")
        out["models"] = old["models"]
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "llama_logits_ref"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), f"-I{root}/include", f"-I{root}/ggml/include",
                        f"-L{root}/build/bin", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{root}/build/bin"],
                       check=True)
        for m in (MODELS[k] for k in a.models.split(",")):
            path = real_model_path(m)
            tk = load_tokenizer(path)
            cases = []
            for p in PROMPTS:
                toks = tk.encode(p, add_special=True, parse_special=True)
                batches = batches_for(m.key, len(toks))
                blob = Path(d) / "logits.bin"
                subprocess.run([str(exe), str(path), str(blob), str(N_DECODE), ",".join(map(str, batches)),
                                *map(str, toks)], check=True)
                lg = np.fromfile(blob, dtype=np.float32).reshape(N_DECODE + 1, -1)
                cases.append({"prompt": p, "tokens": toks, "batches": batches,
                              "steps": [step_record(row) for row in lg]})
                print(m.key, repr(p), batches, [s["argmax"] for s in cases[-1]["steps"]])
            out["models"][m.key] = cases
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
