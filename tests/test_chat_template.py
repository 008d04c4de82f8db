"""Chat template rendering, caps and format detection against the real templates in ../shared."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from runtime.chat import (
    CAPS_KEYS,
    ChatTemplate,
    default_chatml_template,
    detect_format,
    normalize_messages,
    thinking_forced_open,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
TEMPLATES = SHARED / "templates"


def _template_files() -> list[Path]:
    if not TEMPLATES.is_dir():
        return []
    return sorted(TEMPLATES.glob("*.jinja"))


def _load(name: str, bos: str = "<s>", eos: str = "</s>") -> ChatTemplate:
    path = TEMPLATES / name
    if not path.exists():
        pytest.skip("shared templates not available")
    return ChatTemplate(path.read_text(), bos, eos)


TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file from the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "file path"}},
                   "required": ["path"]}}}]
# 9 alphanumerics: Mistral Nemo's template insists on that id shape
TOOL_TURN = [
    {"role": "user", "content": "Show me pom.xml"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "id": "call00001", "function": {"name": "read_file", "arguments": "{\"path\": \"pom.xml\"}"}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "<project>...</project>"},
]


def _gguf_string(path: Path, key: str) -> str:
    """Read one string metadata value without parsing the whole (150k-token) vocab."""
    data = path.read_bytes()
    k = key.encode()
    i = data.index(len(k).to_bytes(8, "little") + k) + 8 + len(k)
    assert int.from_bytes(data[i:i + 4], "little") == 8  # GGUF_TYPE_STRING
    n = int.from_bytes(data[i + 4:i + 12], "little")
    return data[i + 12:i + 12 + n].decode()


def test_default_chatml_matches_qwen2_vocab():
    path = SHARED / "vocab" / "ggml-vocab-qwen2.gguf"
    if not path.exists():
        pytest.skip("shared vocab not available")
    assert _gguf_string(path, "tokenizer.chat_template") == default_chatml_template()


def test_chatml_apply_template_example7():
    t = ChatTemplate(default_chatml_template(), "<|endoftext|>", "<|endoftext|>")
    out = t.render([{"role": "system", "content": "You are a coding assistant."},
                    {"role": "user", "content": "Write hello world in Java."}])
    assert out == ("<|im_start|>system\nYou are a coding assistant.<|im_end|>\n<|im_start|>user\n"
                   "Write hello world in Java.<|im_end|>\n<|im_start|>assistant\n")
    out = t.render([{"role": "user", "content": "Say hi."}])
    assert out == ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
                   "Say hi.<|im_end|>\n<|im_start|>assistant\n")
    assert t.render([{"role": "user", "content": "Say hi."}], add_generation_prompt=False).endswith("<|im_end|>\n")


def test_chatml_caps_and_format_like_props():
    t = ChatTemplate(default_chatml_template())
    caps = t.caps
    assert list(caps) == sorted(caps) == list(CAPS_KEYS)
    assert caps["supports_tools"] is False
    assert caps["supports_tool_calls"] is False
    assert caps["supports_parallel_tool_calls"] is False
    assert caps["supports_system_role"] is True
    assert detect_format(t.source, has_tools=False) == "Content-only"


def test_content_parts_and_null_are_normalized():
    t = ChatTemplate(default_chatml_template())
    out = t.render([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"role": "assistant", "content": None}], add_generation_prompt=False)
    assert "<|im_start|>user\na\nb<|im_end|>" in out
    assert "<|im_start|>assistant\n<|im_end|>" in out


def test_normalize_parses_string_arguments_only_when_asked():
    msgs = normalize_messages(TOOL_TURN, object_arguments=True)
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"path": "pom.xml"}
    assert TOOL_TURN[1]["tool_calls"][0]["function"]["arguments"] == "{\"path\": \"pom.xml\"}"  # input untouched
    msgs = normalize_messages(TOOL_TURN, object_arguments=False)
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == "{\"path\": \"pom.xml\"}"


def test_deepseek_r1_example14_and_forced_open():
    t = _load("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "<|endoftext|>", "<|endoftext|>")
    msgs = [{"role": "user", "content": "Is 7 prime?"}]
    assert t.render(msgs) == "<|endoftext|><｜User｜>Is 7 prime?<｜Assistant｜><think>\n"
    gp = t.generation_prompt(msgs)
    assert gp == "<｜Assistant｜><think>\n"
    assert thinking_forced_open(gp)
    # enable_thinking=false (as a chat_template_kwargs entry) closes the block at once
    closed = t.render(msgs, chat_template_kwargs={"enable_thinking": False})
    assert closed.endswith("<think>\n</think>")
    assert not thinking_forced_open(closed)
    assert detect_format(t.source, has_tools=False) == "DeepSeek R1"


def test_qwen25_tool_turn_example13():
    t = _load("Qwen-Qwen2.5-7B-Instruct.jinja", "<|endoftext|>", "<|im_end|>")
    out = t.render(TOOL_TURN, tools=TOOLS)
    assert out.endswith(
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"pom.xml\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n<project>...</project>\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # tools are listed with HF's tojson: ", " / ": " separators, unicode kept
    assert json.dumps(TOOLS[0]) in out
    caps = t.caps
    assert caps["supports_tools"] and caps["supports_tool_calls"] and caps["supports_parallel_tool_calls"]
    assert t.requires_object_arguments
    assert detect_format(t.source, has_tools=True) == "Hermes 2 Pro"
    assert detect_format(t.source, has_tools=False) == "Hermes 2 Pro"


def test_tojson_keeps_unicode_and_takes_indent():
    t = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2) }}")
    out = t.render([], add_generation_prompt=False, x={"k": "é<>"})
    assert out == '{"k": "é<>"}|{\n  "k": "é<>"\n}'


def test_raise_exception_and_sandbox():
    t = ChatTemplate("{{ raise_exception('nope') }}")
    with pytest.raises(jinja2.TemplateError, match="nope"):
        t.render([])
    t = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        t.render([{"role": "user", "content": "x"}])


def test_strftime_and_date_string_and_loopcontrols():
    t = ChatTemplate("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
                     "|{{ date_string }}|{{ strftime_now('%Y') | length }}")
    assert t.render([], date_string="26 Jul 2024") == "01|26 Jul 2024|4"


def test_gemma_has_no_system_role():
    t = _load("google-gemma-2-2b-it.jinja")
    assert t.caps["supports_system_role"] is False
    assert t.caps["supports_tools"] is False
    assert detect_format(t.source, has_tools=False) == "Content-only"
    assert detect_format(t.source, has_tools=True) == "Generic"


def test_qwen3_enable_thinking():
    t = _load("Qwen-Qwen3-0.6B.jinja")
    # it prints reasoning_content only after the last user turn: not "preserved" for llama.cpp
    assert t.caps["supports_preserve_reasoning"] is False
    msgs = [{"role": "user", "content": "hi"}]
    assert t.render(msgs).endswith("<|im_start|>assistant\n")
    assert t.render(msgs, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llama31_format_and_date():
    t = _load("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>")
    assert detect_format(t.source, has_tools=False) == "Llama 3.x"
    out = t.render([{"role": "user", "content": "hi"}], date_string="01 Jan 2025")
    assert "Today Date: 01 Jan 2025" in out
    assert t.caps["supports_tool_calls"] is True
    assert t.caps["supports_parallel_tool_calls"] is False  # the template refuses two calls


def test_mistral_nemo_format_needs_tools():
    t = _load("mistralai-Mistral-Nemo-Instruct-2407.jinja")
    assert detect_format(t.source, has_tools=False) == "Content-only"
    assert detect_format(t.source, has_tools=True) == "Mistral Nemo"


@pytest.mark.parametrize("path", _template_files(), ids=lambda p: p.name)
def test_every_shared_template_renders(path: Path):
    t = ChatTemplate(path.read_text(), "<s>", "</s>")
    simple = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"},
              {"role": "user", "content": "How are you?"}]
    out = t.render(simple)
    assert "Hello there" in out and "How are you?" in out
    caps = t.caps
    if caps["supports_system_role"]:
        out = t.render([{"role": "system", "content": "Be terse."}] + simple)
        assert "Be terse." in out
    if caps["supports_tools"] and caps["supports_tool_calls"]:
        out = t.render(TOOL_TURN + [{"role": "assistant", "content": "It is a Maven project."},
                                    {"role": "user", "content": "thanks"}], tools=TOOLS)
        assert "read_file" in out
        assert "pom.xml" in out
        assert "<project>...</project>" in out


def test_caps_equal_llama_server_for_every_shared_template():
    """chat_template_caps of llama-server b1-0c1e570 (`/props` with --chat-template-file, recorded
    in tests/data) for every template in ../shared/templates: same keys, order and values."""
    import json
    want = json.loads((Path(__file__).parent / "data" / "llama-server-b1-0c1e570-template-caps.json").read_text())
    files = {p.name: p for p in _template_files()}
    if not files:
        pytest.skip("../shared/templates not available")
    assert set(want) <= set(files)
    for name, caps in want.items():
        got = ChatTemplate(files[name].read_text(), "<s>", "</s>").caps
        assert list(got.items()) == list(caps.items()), name
