"""Chat template kwargs and the reasoning flags against llama-server b1-0c1e570's answers.

tests/data/llama_server_chat_kwargs.json holds the reference binary's answers (scripts/record_chat_kwargs.py)
for --chat-template-kwargs, --reasoning, --reasoning-effort, --reasoning-preserve,
--skip-chat-parsing, --reasoning-budget(-message), the requests' budget fields and
/v1/chat/completions/control (reasoning_end in the middle of a stream) with tests/data/templates/kwargs-probe.jinja (it prints the variables) on
tritium's built-in tiny model; the same requests are sent to tritium-server here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from record_chat_kwargs import run_live  # noqa: E402  (the recording's own client: the same requests)

CASES = json.loads((ROOT / "tests" / "data" / "llama_server_chat_kwargs.json").read_text())["cases"]


def flags(case) -> list[str]:
    return [str(ROOT / a) if a.startswith("tests/") else a for a in case["flags"]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c["flags"]))
def test_as_llama_server(case, start_server):
    srv = start_server("-np", "1", "-c", "512", *flags(case))
    for a in case["answers"]:
        if a["path"] == "live":  # ended reasoning: content follows (how many tokens were in flight: timing)
            got, want = run_live(srv.url, a["body"]), a["live"]
            assert (got["control"], got["content_after"], got["content_before"]) == \
                (want["control"], want["content_after"], want["content_before"])
            continue
        r = httpx.post(srv.url + a["path"], json=a["body"], timeout=120)
        data, want = r.json(), a["json"]
        if a["path"].endswith("/chat/completions") and r.status_code == 200:
            data = {"message": data["choices"][0]["message"], "finish_reason": data["choices"][0]["finish_reason"]}
        assert (r.status_code, data) == (a["status"], want), a["body"]
    said = [line.split(" init: ", 1)[1] for line in srv.log().splitlines() if " init: chat template" in line]
    assert said == case["log"]
    srv.stop()
