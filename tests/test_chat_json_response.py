"""A chat request's JSON schema (response_format / json_schema), as llama-server b1-0c1e570 serves
it through its generated ("peg-native") parser: the grammar lets the model write the JSON bare or in
a ```json fence, and the content is the JSON alone, streamed without the fence (the token sequence
and deltas recorded against the reference on Qwen2.5-Coder-0.5B: 22 tokens, the fence withheld)."""
from __future__ import annotations

import json

import pytest

from runtime.chat import ChatFormat, StreamingChatParser, detect_format, json_response_grammar, parse_chat_output
from runtime.chat.parsers import parse_json_response
from tests.test_chat_tool_grammar import _accepts

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
JSON = '{\n  "name": "Alice",\n  "age": 30\n}'
# the tokens llama-server b1-0c1e570 generated for this schema on Qwen2.5-Coder-0.5B (greedy)
REFERENCE_TOKENS = ["```", "json", "\n", "{\n", " ", ' "', "name", '":', ' "', "Alice", '",\n', " ", ' "', "age", '":',
                    " ", "3", "0", "\n", "}\n", "```"]
REFERENCE_DELTAS = ["{\n", " ", ' "', "name", '":', ' "', "Alice", '",\n', " ", ' "', "age", '":', " ", "3", "0", "\n", "}"]

QWEN_LIKE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<tool_call>"
THINKING = QWEN_LIKE + "<think>"


def test_the_format_is_peg_native_with_a_schema_where_b1_0c1e570_generates_the_parser():
    assert detect_format(QWEN_LIKE, False, "auto", True) == ChatFormat.PEG_NATIVE
    assert detect_format(QWEN_LIKE, True, "auto", True) == ChatFormat.PEG_NATIVE  # tools are not in its grammar
    assert detect_format(QWEN_LIKE, False, "auto", False) == ChatFormat.HERMES_2_PRO
    assert detect_format(THINKING, False, "auto", True) != ChatFormat.PEG_NATIVE  # reasoning templates: as before
    assert detect_format(QWEN_LIKE, False, "auto", True, jinja=False) != ChatFormat.PEG_NATIVE  # the legacy route
    assert str(ChatFormat.PEG_NATIVE) == "peg-native"


@pytest.mark.parametrize("text", [JSON, "```json\n" + JSON + "\n```", "\n" + JSON + "\n", "```json" + JSON + "```",
                                  '{"name":"B","age":-4}'])
def test_the_grammar_takes_the_json_bare_or_fenced(text):
    assert _accepts(json_response_grammar(SCHEMA), text)


@pytest.mark.parametrize("text", ['{"name": "A"}', "```\n" + JSON + "\n```", "Sure! " + JSON, JSON + " trailing",
                                  "```json\n" + JSON])
def test_the_grammar_refuses_anything_else(text):
    assert not _accepts(json_response_grammar(SCHEMA), text)


def test_the_grammar_of_a_bad_schema_is_an_error():
    with pytest.raises(Exception, match="ref"):
        json_response_grammar({"$ref": "#/nowhere"})


@pytest.mark.parametrize("text", [JSON, "```json\n" + JSON + "\n```", "  " + JSON + "\n\n", "```json " + JSON + "```"])
def test_the_content_is_the_json_alone(text):
    assert parse_json_response(text, False) == JSON
    msg = parse_chat_output(text, ChatFormat.PEG_NATIVE, parse_tool_calls=True)
    assert msg.content == JSON and msg.tool_calls == []


def test_partial_text_holds_back_the_fence_and_the_space_after_the_value():
    assert parse_json_response("`", True) == "" and parse_json_response("```js", True) == ""
    assert parse_json_response("```json\n", True) == ""
    assert parse_json_response("```json\n{\n", True) == "{\n"  # whitespace inside the value is content
    assert parse_json_response("```json\n" + JSON + "\n", True) == JSON
    assert parse_json_response("not json", False) == "not json"  # without the grammar: left as it is


def test_streamed_deltas_are_the_references():
    sp = StreamingChatParser(ChatFormat.PEG_NATIVE, parse_tool_calls=False)
    deltas = [d for tok in REFERENCE_TOKENS for d in sp.feed(tok)]
    rest, msg = sp.finish()
    assert [d["content"] for d in deltas + rest] == REFERENCE_DELTAS
    assert msg.content == JSON and json.loads(msg.content) == {"name": "Alice", "age": 30}
