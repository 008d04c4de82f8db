"""Record llama-server b1-0c1e570's answers about chat template kwargs and reasoning flags.

    python scripts/record_chat_kwargs.py [/path/to/llama-server] [--model M.gguf]

Starts the reference binary with each case's flags (the built-in tiny model of tritium, whose file
is generated deterministically, and tests/data/templates/kwargs-probe.jinja, a template printing the
variables), sends each request and keeps the answer (status and JSON; of a chat completion only the
message and finish reason) and the load log's lines about preserving reasoning, in
tests/data/llama_server_chat_kwargs.json. tests/test_chat_kwargs.py sends the same to tritium.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "llama_server_chat_kwargs.json"
TEMPLATE = ROOT / "tests" / "data" / "templates" / "kwargs-probe.jinja"

HISTORY = [{"role": "user", "content": "hi"},
           {"role": "assistant", "content": "hello", "reasoning_content": "earlier thought"},
           {"role": "user", "content": "and now?"}]


def apply(**extra) -> tuple[str, dict]:
    return "/apply-template", {"messages": HISTORY, **extra}


def chat(**extra) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": HISTORY, "max_tokens": 8, "temperature": 0, **extra}


def control(**body) -> tuple[str, dict]:
    return "/v1/chat/completions/control", body


def live(action: str = "reasoning_end", **extra) -> tuple[str, dict]:
    """A streamed chat completion; after its first chunk, a control request naming its id."""
    return "live", {"action": action, "chat": {"messages": HISTORY, "max_tokens": 300, "temperature": 0,
                                               "ignore_eos": True, "stream": True, **extra}}


def run_live(url: str, body: dict) -> dict:
    """What a control request answers mid-stream, and what the stream said before and after it:
    reasoning and content text (their lengths after, and whether the forced end came at once)."""
    before = {"reasoning": "", "content": ""}
    after = {"reasoning": "", "content": ""}
    answer = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body["chat"], timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {})
            side = before if answer is None else after
            side["reasoning"] += delta.get("reasoning_content") or ""
            side["content"] += delta.get("content") or ""
            if answer is None and (delta.get("reasoning_content") or delta.get("content")):
                c = httpx.post(url + "/v1/chat/completions/control", json={"id": chunk["id"], "action": body["action"]},
                               timeout=60)
                answer = {"status": c.status_code, "json": c.json()}
    return {"control": answer, "reasoning_after": len(after["reasoning"]) > 0, "content_after": len(after["content"]) > 0,
            "content_before": before["content"]}


T = ["--chat-template-file", str(TEMPLATE)]
CASES: list[tuple[list[str], list[tuple[str, dict]]]] = [
    (T, [apply(), apply(chat_template_kwargs={"enable_thinking": False, "custom": "c1"}),
         apply(reasoning_effort="high"), apply(reasoning_effort="none"), apply(reasoning_effort=""),
         apply(chat_template_kwargs={"enable_thinking": "false"}), apply(chat_template_kwargs={"enable_thinking": 0}),
         apply(chat_template_kwargs={"preserve_reasoning": False}),
         apply(chat_template_kwargs={"clear_thinking": True, "reasoning_strength": "s"}, reasoning_effort="low"),
         apply(chat_template_kwargs={"reasoning_effort": "medium"}), apply(chat_template_kwargs={"custom": 42}),
         chat(), chat(chat_template_kwargs={"enable_thinking": False})]),
    (T + ["--reasoning", "off"], [apply(), apply(chat_template_kwargs={"enable_thinking": True})]),
    (T + ["--chat-template-kwargs", '{"enable_thinking":false,"custom":"server"}'],
     [apply(), apply(chat_template_kwargs={"custom": "request"})]),
    (T + ["--reasoning-effort", "low"], [apply(), apply(reasoning_effort="none"), apply(reasoning_effort="high")]),
    (T + ["--reasoning-effort", "low", "--reasoning-effort", "default"], [apply()]),
    (T + ["--no-reasoning-preserve"], [apply(), apply(chat_template_kwargs={"preserve_reasoning": True})]),
    (T + ["--reasoning-preserve"], [apply()]),
    (T + ["--skip-chat-parsing"], [apply(), chat(), chat(chat_template_kwargs={"enable_thinking": False})]),
    (["--chat-template", "chatml", "--reasoning-preserve"], [apply()]),
    # the reasoning budget and /v1/chat/completions/control
    (T, [chat(max_tokens=12, reasoning_budget_tokens=3), chat(max_tokens=12, reasoning_budget_tokens=0),
         chat(max_tokens=16, reasoning_budget_tokens=2, reasoning_budget_message=" Enough."),
         chat(max_tokens=12, thinking_budget_tokens=4), chat(max_tokens=12, reasoning_budget_tokens=-5),
         control(), control(id="chatcmpl-x"), control(id="chatcmpl-x", action="reasoning_end"),
         control(id=5, action="reasoning_end"), live(reasoning_control=True), live(reasoning_control=False)]),
    (T + ["--reasoning-budget", "3", "--reasoning-budget-message", " Stop."],
     [chat(max_tokens=14), chat(max_tokens=14, reasoning_budget_tokens=1), chat(max_tokens=12, stream=False,
                                                                               reasoning_budget_tokens=-1)]),
    (T + ["--skip-chat-parsing", "--reasoning-budget", "2"], [chat(max_tokens=10)]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(binary: str, model: str, flags: list[str], requests: list[tuple[str, dict]]) -> dict:
    port = free_port()
    log = ROOT / f".record-{port}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([binary, "-m", model, "--port", str(port), "-np", "1", "-c", "512", *flags],
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        answers = []
        for path, body in requests:
            if path == "live":
                answers.append({"path": path, "body": body, "live": run_live(url, body)})
                continue
            r = httpx.get(url + path, timeout=120) if body is None else httpx.post(url + path, json=body, timeout=120)
            data = r.json()
            if path.endswith("/chat/completions") and r.status_code == 200:
                data = {"message": data["choices"][0]["message"], "finish_reason": data["choices"][0]["finish_reason"]}
            answers.append({"path": path, "body": body, "status": r.status_code, "json": data})
        lines = [ln.split(" init: ", 1)[1] for ln in log.read_text(errors="replace").splitlines()
                 if " init: chat template" in ln]
        return {"flags": flags, "answers": answers, "log": lines}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.unlink()


def binary_and_model(argv: list[str]) -> tuple[str, str]:
    """`[/path/to/llama-server] [--model M.gguf]`: the reference binary and the model (default: the
    built-in tiny model of tritium, generated deterministically)."""
    args = list(argv)
    model = str(Path(os.environ.get("TRITIUM_CACHE", Path.home() / ".cache" / "tritium"))
                / "tritium-builtin-tiny-v1-f32.gguf")
    if "--model" in args:
        i = args.index("--model")
        model = args[i + 1]
        del args[i:i + 2]
    return (args[0] if args else os.environ.get("LLAMA_SERVER", "/work/lsb/llama-server")), model


def write_cases(out: Path, generator: str, cases: list[dict]) -> None:
    out.write_text(json.dumps({"binary": "llama-server b1-0c1e570", "generator": generator,
                               "model": "tritium's built-in tiny model (tritium-builtin-tiny-v1-f32.gguf)",
                               "cases": cases}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases -> {out}")


def main() -> int:
    binary, model = binary_and_model(sys.argv[1:])
    cases = [run_case(binary, model, flags, reqs) for flags, reqs in CASES]
    rel = [[a.replace(str(ROOT) + "/", "") for a in c["flags"]] for c in cases]
    for c, flags in zip(cases, rel):
        c["flags"] = flags
    write_cases(OUT, "scripts/record_chat_kwargs.py", cases)
    return 0

if __name__ == "__main__":
    sys.exit(main())
