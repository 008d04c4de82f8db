"""Developer and system messages rendered as llama-server b1-0c1e570 renders them (common/chat.cpp:
"developer" becomes "system" except for harmony templates; a template that does not read a system
message gets the first one merged into the next message, or dropped when it is alone), and a continued
final assistant message: its prompt (the reasoning in the template's markers, then the content) and
the parsed answer (runtime/chat/continuation.py).

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
SHARED = ROOT.parent / "shared"
CASES = json.loads((ROOT / "tests" / "data" / "llama_server_chat_workarounds.json").read_text())["cases"]


def template_path(name: str) -> Path:
    if name.startswith("shared/"):
        if not SHARED.is_dir():
            pytest.skip("../shared (templates) is not available")
        return SHARED / name.split("/", 1)[1]
    return ROOT / name


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
    flags = [str(template_path(a)) if a.endswith(".jinja") else a for a in case["flags"]]
    srv = start_server("-np", "1", "-c", "512", *flags)
    for a in case["answers"]:
        if a["body"] is None:  # /props: the template's caps
            r = httpx.get(srv.url + a["path"], timeout=60)
            assert r.json()["chat_template_caps"] == a["json"]["chat_template_caps"]
            continue
        r = httpx.post(srv.url + a["path"], json=a["body"], timeout=60)
        data = r.json()
        if a["path"].endswith("/chat/completions") and r.status_code == 200:
            data = {"message": data["choices"][0]["message"], "finish_reason": data["choices"][0]["finish_reason"]}
        assert (r.status_code, undated(data)) == (a["status"], undated(a["json"])), a["body"]
    srv.stop()


@pytest.mark.parametrize("name,want", [("tests/data/templates/kwargs-probe.jinja", ("<think>\n", "\n</think>\n")),
                                       ("shared/templates/Qwen-Qwen3-0.6B.jinja", ("<think>\n", "\n</think>\n\n")),
                                       ("shared/templates/Qwen-QwQ-32B.jinja", ("<think>", "</think>")),
                                       ("shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja", ("", ""))])
def test_reasoning_markers(name, want):
    """The markers b1's differential analysis finds (what its continuations above show)."""
    m = ChatTemplate(template_path(name).read_text()).reasoning_markers
    assert (m.start, m.end) == want
