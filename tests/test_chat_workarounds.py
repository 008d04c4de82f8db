"""Developer and system messages rendered as llama-server b1-0c1e570 renders them (common/chat.cpp:
"developer" becomes "system" except for harmony templates; a template that does not read a system
message gets the first one merged into the next message, or dropped when it is alone).

tests/data/llama_server_chat_workarounds.json holds the reference binary's /apply-template answers
(scripts/record_chat_workarounds.py); the same requests go to tritium-server here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from runtime.chat import ChatTemplate, message_workarounds

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "tests" / "data" / "llama_server_chat_workarounds.json").read_text())["cases"]


def undated(answer: dict) -> dict:
    """gpt-oss's template prints today's date (strftime_now): the recording's day is not the test's."""
    return json.loads(re.sub(r"Current date: \\d{4}-\\d{2}-\\d{2}", "Current date: DATE", json.dumps(answer)))


def test_probe_template_has_no_system_role():
    t = ChatTemplate((ROOT / "tests/data/templates/nosystem-probe.jinja").read_text())
    assert t.caps["supports_system_role"] is False


def test_workarounds_leave_the_input_alone():
    msgs = [{"role": "developer", "content": "D"}, {"role": "user", "content": "U"}]
    out = message_workarounds(msgs, "", supports_system_role=False)
    assert out == [{"role": "user", "content": "D\nU"}]
    assert msgs[0]["role"] == "developer" and msgs[1]["content"] == "U"
    assert message_workarounds(msgs, "<|channel|>", supports_system_role=True) == msgs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["flags"][-1].rsplit("/", 1)[-1])
def test_as_llama_server(case, start_server):
    flags = [str(ROOT / a) if a.startswith("tests/") else a for a in case["flags"]]
    srv = start_server("-np", "1", "-c", "512", *flags)
    for a in case["answers"]:
        r = httpx.post(srv.url + a["path"], json=a["body"], timeout=60)
        assert (r.status_code, undated(r.json())) == (a["status"], undated(a["json"])), a["body"]
    srv.stop()
