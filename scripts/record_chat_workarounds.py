"""Record llama-server b1-0c1e570's rendering of developer and system messages (common/chat.cpp's
workaround::map_developer_role_to_system and workaround::system_message_not_supported).

    python scripts/record_chat_workarounds.py [/path/to/llama-server] [--model M.gguf]

Starts the reference binary (tritium's built-in tiny model, as scripts/record_chat_kwargs.py does) with
each template of TEMPLATES and keeps its `/apply-template` answer to each message list of MESSAGES in
tests/data/llama_server_chat_workarounds.json. tests/test_chat_workarounds.py sends the same to tritium.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from record_chat_kwargs import ROOT, run_case

OUT = ROOT / "tests" / "data" / "llama_server_chat_workarounds.json"
TEMPLATES = ["tests/data/templates/nosystem-probe.jinja", "tests/data/templates/kwargs-probe.jinja",
             "tests/data/templates/openai-gpt-oss-120b.jinja"]
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


def main() -> int:
    args = sys.argv[1:]
    model = str(Path(os.environ.get("TRITIUM_CACHE", Path.home() / ".cache" / "tritium"))
                / "tritium-builtin-tiny-v1-f32.gguf")
    if "--model" in args:
        i = args.index("--model")
        model = args[i + 1]
        del args[i:i + 2]
    binary = args[0] if args else os.environ.get("LLAMA_SERVER", "/work/lsb/llama-server")
    cases = []
    for t in TEMPLATES:
        c = run_case(binary, model, ["--jinja", "--chat-template-file", str(ROOT / t)],
                     [("/apply-template", {"messages": m}) for m in MESSAGES])
        c["flags"] = ["--jinja", "--chat-template-file", t]
        cases.append(c)
    OUT.write_text(json.dumps({"binary": "llama-server b1-0c1e570", "generator": "scripts/record_chat_workarounds.py",
                               "model": "tritium's built-in tiny model (tritium-builtin-tiny-v1-f32.gguf)",
                               "cases": cases}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
