"""Record llama-server b1-0c1e570's rendering of developer and system messages (common/chat.cpp's
workaround::map_developer_role_to_system and workaround::system_message_not_supported) and of a
continued final assistant message (its reasoning in the template's markers, runtime/chat/continuation.py).

    python scripts/record_chat_workarounds.py [/path/to/llama-server] [--model M.gguf]

Starts the reference binary (tritium's built-in tiny model, as scripts/record_chat_kwargs.py does) with
each template of TEMPLATES and keeps its `/apply-template` answer to each message list of MESSAGES, and
its `/apply-template` and `/v1/chat/completions` answers (6 greedy tokens) to each of CONTINUE and its chat_template_caps (`/props`), in
tests/data/llama_server_chat_workarounds.json ("shared/..." paths: ../shared/templates).
tests/test_chat_workarounds.py sends the same to tritium.
"""
from __future__ import annotations

import sys
from pathlib import Path

from record_chat_kwargs import ROOT, binary_and_model, run_case, write_cases

OUT = ROOT / "tests" / "data" / "llama_server_chat_workarounds.json"
TEMPLATES = ["tests/data/templates/nosystem-probe.jinja", "tests/data/templates/kwargs-probe.jinja",
             "tests/data/templates/openai-gpt-oss-120b.jinja", "shared/templates/Qwen-Qwen3-0.6B.jinja",
             "shared/templates/Qwen-QwQ-32B.jinja", "shared/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
             "shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja", "tests/data/templates/google-gemma-4-31B-it.jinja"]
SHARED = ROOT.parent / "shared"
U = {"role": "user", "content": "U1"}
MESSAGES = [
    [{"role": "developer", "content": "D"}, U],
    [{"role": "system", "content": "S"}, U, {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}],
    [{"role": "system", "content": "S only"}],
    [U, {"role": "developer", "content": "D late"}, {"role": "user", "content": "U2"}],
    [{"role": "system", "content": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
     {"role": "user", "content": [{"type": "text", "text": "P1"}, {"type": "text", "text": "P2"}]}],
    [{"role": "system", "content": "S"}, {"role": "system", "content": "S2"}, U],
]

CONTINUE = [
    [U, {"role": "assistant", "content": "prefill"}],
    [U, {"role": "assistant", "content": "prefill", "reasoning_content": "r"}],
    [U, {"role": "assistant", "content": "", "reasoning_content": "r"}],
    {"messages": [U, {"role": "assistant", "content": "pre", "reasoning_content": "r"}],
     "continue_final_message": "reasoning_content"},
]


def requests() -> list[tuple[str, dict | None]]:
    out: list[tuple[str, dict | None]] = [("/props", None)]  # its chat_template_caps
    out += [("/apply-template", {"messages": m}) for m in MESSAGES]
    for c in CONTINUE:
        body = c if isinstance(c, dict) else {"messages": c}
        out.append(("/apply-template", body))
        out.append(("/v1/chat/completions", {**body, "max_tokens": 6, "temperature": 0}))
    return out


def template_path(name: str) -> Path:
    return SHARED / name.split("/", 1)[1] if name.startswith("shared/") else ROOT / name


def main() -> int:
    binary, model = binary_and_model(sys.argv[1:])
    cases = []
    for t in TEMPLATES:
        c = run_case(binary, model, ["--jinja", "--chat-template-file", str(template_path(t))], requests())
        props = c["answers"][0]
        props["json"] = {"chat_template_caps": props["json"]["chat_template_caps"]}
        c["flags"] = ["--jinja", "--chat-template-file", t]
        cases.append(c)
    write_cases(OUT, "scripts/record_chat_workarounds.py", cases)
    return 0

if __name__ == "__main__":
    sys.exit(main())
