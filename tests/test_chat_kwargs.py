"""Chat template kwargs and the reasoning flags against llama-server b1-0c1e570's answers.

tests/data/llama_server_chat_kwargs.json holds the reference binary's answers (scripts/record_chat_kwargs.py)
for --chat-template-kwargs, --reasoning, --reasoning-effort, --reasoning-preserve and
--skip-chat-parsing with tests/data/templates/kwargs-probe.jinja (it prints the variables) on
tritium's built-in tiny model; the same requests are sent to tritium-server here.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "tests" / "data" / "llama_server_chat_kwargs.json").read_text())["cases"]


def flags(case) -> list[str]:
    return [str(ROOT / a) if a.startswith("tests/") else a for a in case["flags"]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c["flags"]))
def test_as_llama_server(case, start_server):
    srv = start_server("-np", "1", "-c", "512", *flags(case))
    for a in case["answers"]:
        r = httpx.post(srv.url + a["path"], json=a["body"], timeout=120)
        data = r.json()
        if a["path"].endswith("/chat/completions") and r.status_code == 200:
            data = {"message": data["choices"][0]["message"], "finish_reason": data["choices"][0]["finish_reason"]}
        assert (r.status_code, data) == (a["status"], a["json"]), a["body"]
    said = [line.split(" init: ", 1)[1] for line in srv.log().splitlines() if " init: chat template" in line]
    assert said == case["log"]
    srv.stop()
