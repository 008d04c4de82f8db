"""gpt-oss's harmony output format (runtime/chat/harmony.py) against llama.cpp b1-0c1e570's own cases
for it (tests/test-chat.cpp of the sdist, "GPT-OSS format tests": the expected content, reasoning and
tool calls of each output; its two continuation cases excepted), streamed as whole; the template
(models/templates/openai-gpt-oss-120b.jinja) detected as the gpt-oss format and rendered."""
from __future__ import annotations

import pytest

from runtime.chat import ChatTemplate
from runtime.chat.formats import ChatFormat, detect_format
from runtime.chat.message import parse_chat_output
from runtime.chat.stream import StreamingChatParser, merge_deltas

C = "Hello, world!\nWhat's up?"
CALL = [("special_function", '{"arg1": 1}')]
EDIT_ARGS = '{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": false}'
A = "<|channel|>analysis<|message|>"
S = "<|start|>assistant"

# (output, reasoning_format, tools?, content, reasoning, calls): tests/test-chat.cpp's cases, in order
CASES = [
    ("<|channel|>final<|message|>" + C, "auto", False, C, "", []),
    ("<|channel|>commentary<|message|>" + C, "auto", False, C, "", []),
    (A + "I'm\nthinking<|end|>" + S + "<|channel|>final<|message|>" + C, "auto", False, C, "I'm\nthinking", []),
    (A + "I'm\nthinking<|end|>" + S + "<|channel|>final<|message|>" + C, "none", False,
     A + "I'm\nthinking<|end|>" + C, "", []),
    (' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}', "auto", True, "", "", CALL),
    ('<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}', "auto", True, "", "", CALL),
    (' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}', "auto", True,
     "", "", CALL),
    ('<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}', "auto", True, "", "", CALL),
    (A + "I'm\nthinking<|end|>" + S + ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
     "auto", True, "", "I'm\nthinking", CALL),
    (A + "Thinking about edit...<|end|>" + S + "<|channel|>commentary to=functions.edit <|constrain|>json"
     "<|message|>" + EDIT_ARGS, "auto", True, "", "Thinking about edit...", [("edit", EDIT_ARGS)]),
    (A + "I need to output the invoice details in JSON<|end|>" + S + "<|channel|>final <|constrain|>json"
     '<|message|>{"amount": 123.45, "date": "2025-12-03"}', "auto", False, '{"amount": 123.45, "date": "2025-12-03"}',
     "I need to output the invoice details in JSON", []),
    (A + "I will execute python to say hello<|end|>" + S + " to=container.exec<|channel|>commentary<|message|>"
     "python3 -c 'print(\"hello\")'", "auto", False, "", "I will execute python to say hello", []),
    (A + "I will execute python to say hello<|end|>" + S + "<|channel|>commentary to=python <|constrain|>code"
     "<|message|>print(\"hello\")", "auto", False, "", "I will execute python to say hello", []),
    ("<|channel|>commentary to=assistant" + A + "I'm\nthinking<|end|>" + S + "<|channel|>final<|message|>" + C,
     "auto", False, C, "I'm\nthinking", []),
    (A + "I'm\nthinking<|end|>" + S + "<|channel|>commentary to=assistant<|channel|>final<|message|>" + C,
     "auto", False, C, "I'm\nthinking", []),
]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_llama_cpp_gpt_oss_cases(i):
    text, rf, tools, content, reasoning, calls = CASES[i]
    msg = parse_chat_output(text, ChatFormat.GPT_OSS, rf, parse_tool_calls=tools)
    assert (msg.content, msg.reasoning_content) == (content, reasoning)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg.tool_calls] == calls
    # streamed a few characters at a time: the deltas add up to the same message
    sp = StreamingChatParser(ChatFormat.GPT_OSS, rf, False, tools)
    deltas = [d for k in range(0, len(text), 3) for d in sp.feed(text[k:k + 3])]
    rest, final = sp.finish()
    merged = merge_deltas(deltas + rest)
    assert (merged.content, merged.reasoning_content) == (content, reasoning)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in merged.tool_calls] == calls
    assert final.content == content


def test_partial_analysis_is_reasoning():
    """llama.cpp's partial case: an open analysis message streams as reasoning."""
    sp = StreamingChatParser(ChatFormat.GPT_OSS, "auto", False, False)
    deltas = sp.feed(A + "I'm\nthinking")
    assert merge_deltas(deltas).reasoning_content == "I'm\nthinking" and merge_deltas(deltas).content == ""
    assert sp.feed("<|en") == []  # may become <|end|>: held back


GPT_OSS_TEMPLATE = (
    "{#- a cut of models/templates/openai-gpt-oss-120b.jinja's structure -#}"
    "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}")


def test_template_detection_and_generation_prompt():
    assert detect_format("x <|channel|>final y", has_tools=True, has_json_schema=True) == ChatFormat.GPT_OSS
    t = ChatTemplate(GPT_OSS_TEMPLATE.replace("<|message|>", "<|channel|>final<|message|>"))
    assert t.format() == ChatFormat.GPT_OSS
    assert t.generation_prompt([{"role": "user", "content": "Hi"}]) == "<|start|>assistant"
