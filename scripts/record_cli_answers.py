"""Record what llama-server b1-0c1e570 answers to command lines it refuses while parsing.

    python scripts/record_cli_answers.py [/path/to/llama-server]   (default: $LLAMA_SERVER or /work/lsb/llama-server)

Each case is an argument list and environment variables; the binary's exit status, stdout and
stderr are written to tests/data/llama_server_cli_answers.json, which tests/test_cli_answers.py
compares with tritium-server's parser (the reference binary is not needed there). Only lines that
end before a model is loaded belong here (refusals, --version, --list-devices).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "llama_server_cli_answers.json"

CASES: list[tuple[list[str], dict[str, str]]] = [([a.replace("{x}", "") for a in argv], env) for argv, env in [
    (["--foo"], {}), (["--temperature", "0.7", "--bogus"], {}), (["--port", "abc"], {}), (["--port"], {}),
    (["-m"], {}), (["--temp=0.5"], {}), (["--mlock"], {}), (["--no-mmap"], {}), (["--ctx", "5"], {}),
    (["--draft", "8"], {}), (["--draft", "x"], {}), (["--draft-min", "2"], {}), (["--draft-max", "16"], {}),
    (["--spec-ngram-size-n", "3"], {}), (["--spec-ngram-min-hits", "1"], {}),
    (["-fa", "x"], {}), (["-ctk", "q9"], {}), (["-ctv", "q8"], {}), (["-ot", "exps=CUDA0"], {}), (["-ot", "exps"], {}),
    (["--rpc", "h:1"], {}), (["-dev", "CUDA0"], {}), (["-dev", "CPU"], {}), (["-ngl", "99", "--bogus"], {}),
    (["-ngl", "x"], {}), (["-sm", "x"], {}), (["-sm", "row", "-ts", "3,1", "--bogus"], {}), (["-mg", "0", "--bogus"], {}),
    (["--chat-template-kwargs", "{x"], {}), (["--chat-template-kwargs", "x"], {}),
    (["--chat-template-kwargs", "[x"], {}), (["--chat-template-kwargs", '{"a": x}'], {}),
    (["--chat-template-kwargs", " x"], {}), (["--chat-template-kwargs", '{"a":1, x'], {}),
    (["--chat-template-kwargs", '{"a":1'], {}), (["--chat-template-kwargs", '{"a" 1}'], {}),
    (["--samplers", "top_k;bogus;temp", "--bogus"], {}), (["--sampler-seq", "kzt", "--bogus"], {}),
    (["--chat-template-kwargs", '{"enable_thinking":false,"preserve_reasoning":true}', "--bogus"], {}),
    (["-rea", "maybe"], {}), (["--reasoning-budget", "-2"], {}), (["--reasoning-format", "x"], {}),
    (["--pooling", "max"], {}), (["--rope-scaling", "x"], {}), (["--repeat-last-n", "-1"], {}),
    (["--repeat-penalty", "0"], {}), (["--presence-penalty", "inf"], {}), (["--frequency-penalty", "nan"], {}),
    (["--dry-penalty-last-n", "-1"], {}), (["-np", "0"], {}), (["--sleep-idle-seconds", "0"], {}),
    (["--sleep-idle-seconds", "-2"], {}), (["--slot-save-path", "/nonexistent/dir"], {}),
    (["--media-path", "/nonexistent/dir"], {}), (["--host", ","], {}), (["-C", "0xg"], {}), (["-Cr", "5"], {}),
    (["-Cr", "600-700"], {}), (["-Cr", "x-3"], {}), (["--prio", "9"], {}), (["--prio-batch", "-1"], {}),
    (["--n-cpu-moe", "-1"], {}), (["-ncffn", "-1"], {}), (["--spec-type", "ngram"], {}),
    (["--spec-type", "none,bogus", "--bogus"], {}),
    (["--spec-ngram-mod-n-min", "2000"], {}), (["--spec-ngram-mod-n-match", "0"], {}),
    (["--spec-ngram-simple-min-hits", "0"], {}), (["--spec-draft-n-max", "-1"], {}), (["--spec-synth-len", "x"], {}),
    (["--spec-synth-len", "-1"], {}), (["--spec-synth-len", "2.5x"], {}), (["--spec-synth-rates", "0.5,x"], {}),
    (["--spec-draft-type-k", "q9"], {}), (["--spec-draft-prio", "7"], {}), (["--lora-scaled", "a.gguf"], {}),
    (["--lora-scaled", "a.gguf:x"], {}), (["--control-vector-scaled", "x"], {}), (["--override-kv", "a=x:1"], {}),
    (["--override-kv", "a=bool:maybe"], {}), (["--log-colors", "x"], {}), (["-fit", "x"], {}), (["-lm", "x"], {}),
    (["-lzm", "x"], {}), (["--numa", "x"], {}), (["-s", "x"], {}), (["--temp", "x"], {}), (["--temp", "1e99"], {}),
    (["--top-k", "1.5", "--bogus"], {}), (["-l", "15043"], {}), (["-l", "x+1"], {}), (["-l", "1*1"], {}),
    (["--grammar-file", "/nonexistent.gbnf"], {}), (["-jf", "/nonexistent.json"], {}), (["-j", "{x"], {}),
    (["--api-key-file", "/nonexistent"], {}), (["--chat-template-file", "/nonexistent"], {}),
    (["--ui-config-file", "/nonexistent"], {}), (["-dt", "0.1", "--bogus"], {}),
    (["-l", "1+1", "-l", "2+2", "--bogus"], {}), (["--spec-type", "ngram-mod", "--spec-type", "ngram-simple",
                                                    "--bogus"], {}),
    (["-mmdev", "CUDA0"], {}), (["-fitt", "1,x"], {}), (["-ts", "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1"], {}),
    (["--video-fps", "x"], {}), (["--kv-unified-per-slot", "x"], {}), (["-cms", "-1"], {}),
    (["--threads", "x"], {}), (["-C", "1", "--bogus"], {}), (["--version"], {}), (["--list-devices"], {}),
    (["--version", "--bogus"], {}), (["--bogus", "--version"], {}),
    ([], {"LLAMA_ARG_PORT": "x"}), ([], {"LLAMA_ARG_KV_UNIFIED": "maybe"}), ([], {"LLAMA_ARG_DRAFT_MAX": "8"}),
    ([], {"LLAMA_ARG_CACHE_TYPE_K": "q9"}), ([], {"LLAMA_ARG_REASONING": "x"}),
    (["--port", "8000", "--bogus"], {"LLAMA_ARG_PORT": "9000"}),
    (["--no-kv-unified", "--bogus"], {"LLAMA_ARG_NO_KV_UNIFIED": "1"}),
    (["--bogus"], {"LLAMA_ARG_FLASH_ATTN": "x"}),
]]


def run(binary: str, argv: list[str], env: dict[str, str]) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "LLAMA_API_KEY"))}
    full.update(env)
    with tempfile.TemporaryDirectory() as home:  # no user config file (~/.config/llama.cpp/config.ini)
        full["HOME"] = full["XDG_CONFIG_HOME"] = home
        r = subprocess.run([binary, *argv], capture_output=True, text=True, timeout=60, env=full,
                           stdin=subprocess.DEVNULL)
    return {"argv": argv, "env": env, "rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


def main() -> int:
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LLAMA_SERVER", "/work/lsb/llama-server")
    answers = [run(binary, argv, env) for argv, env in CASES]
    for a in answers:
        if a["rc"] == 0 and a["argv"] not in (["--version"], ["--list-devices"], ["--version", "--bogus"]):
            print("note: accepted:", a["argv"], a["env"], file=sys.stderr)
    doc = {"binary": "llama-server b1-0c1e570 (CPU build, scripts/build_llama_server.sh)",
           "generator": "scripts/record_cli_answers.py", "answers": answers}
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(answers)} answers -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
