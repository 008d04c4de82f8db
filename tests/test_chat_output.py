"""Chat output parsing (runtime/chat/message.py, parsers.py, stream.py, json_scan.py): reasoning split,
tool calls per format, streaming deltas."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.chat import StreamingChatParser, merge_deltas, parse_chat_output
from runtime.chat.json_scan import Incomplete, Invalid, scan_object, scan_value
from runtime.chat.parsers import split_at_marker

ID_RE = re.compile(r"^[A-Za-z0-9]{32}$")

EX13_GEN = '{"name": "read_file", "arguments": {\n  \t\t\t  \t\t\t  \t\t\t  \t\t\t"path":"src/Main.java" }}\n</tool_call>'
EX13_ARGS = '{\n  \t\t\t  \t\t\t  \t\t\t  \t\t\t"path":"src/Main.java" }'


def _stream(text: str, chunks: list[int] | None = None, **kw):
    sp = StreamingChatParser(**kw)
    deltas: list[dict] = []
    pos = 0
    for n in chunks or [1] * len(text):
        deltas += sp.feed(text[pos:pos + n])
        pos += n
    deltas += sp.feed(text[pos:])
    tail, final = sp.finish()
    return deltas + tail, final


def _strip_ids(msg):
    return (msg.content, msg.reasoning_content,
            [(c["function"]["name"], c["function"]["arguments"]) for c in msg.tool_calls])


# -- reasoning ---------------------------------------------------------------------------------

def test_example14_reasoning_auto_none_legacy():
    gen = " creek creek creek creek creek"
    kw = dict(format="DeepSeek R1", thinking_forced_open=True, prefix="<think>\n")
    m = parse_chat_output(gen, **kw)
    assert m.content == "" and m.reasoning_content == "\n" + gen and m.tool_calls == []
    m = parse_chat_output(gen, reasoning_format="none", **kw)
    assert m.content == "<think>\n" + gen and m.reasoning_content == ""
    m = parse_chat_output(gen + "</think>\n\nYes.", reasoning_format="deepseek-legacy", **kw)
    assert m.reasoning_content == "\n" + gen
    assert m.content == "<think>\n" + gen + "</think>\n\nYes."
    m = parse_chat_output(gen + "</think>\n\nYes.", reasoning_format="deepseek", **kw)
    assert (m.content, m.reasoning_content) == ("Yes.", "\n" + gen)


def test_think_tags_not_forced_and_content_only_ignores_them():
    m = parse_chat_output("<think>plan</think>answer", format="Hermes 2 Pro")
    assert (m.content, m.reasoning_content) == ("answer", "plan")
    m = parse_chat_output("<think>plan</think>answer", format="Content-only")
    assert (m.content, m.reasoning_content) == ("<think>plan</think>answer", "")
    with pytest.raises(ValueError):
        parse_chat_output("x", reasoning_format="bogus")


def test_streaming_reasoning_delta_names():
    deltas, final = _stream(" creek creek</think>Done", format="DeepSeek R1", thinking_forced_open=True,
                            prefix="<think>\n")
    # b1's PEG mapper drops reasoning of whitespace only: the leading "\n " waits for the first letter
    assert deltas[0] == {"reasoning_content": "\n c"}
    assert all(set(d) <= {"content", "reasoning_content"} for d in deltas)
    assert not any("<" in d.get("content", "") or "<" in d.get("reasoning_content", "") for d in deltas)
    assert _strip_ids(merge_deltas(deltas)) == _strip_ids(final) == ("Done", "\n creek creek", [])


# -- tool calls ----------------------------------------------------------------------------------

def test_example13_prefilled_hermes_call():
    m = parse_chat_output(EX13_GEN, format="Hermes 2 Pro", prefix="<tool_call>\n")
    assert m.content == ""
    assert len(m.tool_calls) == 1
    tc = m.tool_calls[0]
    assert tc["type"] == "function" and ID_RE.match(tc["id"])
    assert tc["function"] == {"name": "read_file", "arguments": EX13_ARGS}
    assert json.loads(tc["function"]["arguments"]) == {"path": "src/Main.java"}
    assert m.to_openai() == {"role": "assistant", "content": "", "tool_calls": m.tool_calls}


def test_example13_streaming_chunks():
    deltas, final = _stream(EX13_GEN, format="Hermes 2 Pro", prefix="<tool_call>\n")
    first = deltas[0]["tool_calls"][0]
    assert set(first) == {"index", "id", "type", "function"}
    assert first["index"] == 0 and ID_RE.match(first["id"]) and first["type"] == "function"
    assert first["function"] == {"name": "read_file", "arguments": "{"}
    for d in deltas[1:]:
        (tc,) = d["tool_calls"]
        assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
    assert merge_deltas(deltas).tool_calls == final.tool_calls
    assert final.tool_calls[0]["id"] == first["id"]
    assert final.tool_calls[0]["function"]["arguments"] == EX13_ARGS


def test_hermes_several_calls_content_and_variants():
    text = ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>'
            '<function=c>{"z": true}</function>')
    m = parse_chat_output(text, format="Hermes 2 Pro")
    assert m.content == "Let me look.\n"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in m.tool_calls] == [
        ("a", '{"x": 1}'), ("b", '{"y": [1, 2]}'), ("c", '{"z": true}')]
    assert len({c["id"] for c in m.tool_calls}) == 3
    # b1-0c1e570's grammar lets one block hold several calls, separated by commas
    m = parse_chat_output('<tool_call>\n{"name": "a", "arguments": {}} ,\n {"name": "b", "arguments": {"y": 2}}\n'
                          "</tool_call>", format="Hermes 2 Pro")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in m.tool_calls] == [("a", "{}"), ("b", '{"y": 2}')]
    # not JSON after the marker: plain text
    m = parse_chat_output("use <tool_call> tags", format="Hermes 2 Pro")
    assert m.content == "use <tool_call> tags" and m.tool_calls == []
    # cut off (max_tokens) inside a call: as b1-0c1e570's lenient final parse, the calls made so far
    # and nothing of the unfinished one; a call whose closing tag is missing counts as made
    m = parse_chat_output('Hi <tool_call>\n{"name": "a", "arguments": {}}, {"name": "b", "argu', format="Hermes 2 Pro")
    assert [c["function"]["name"] for c in m.tool_calls] == ["a"] and m.content == "Hi "
    m = parse_chat_output('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool', format="Hermes 2 Pro")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in m.tool_calls] == [("a", '{"x": 1}')]
    assert m.content == ""
    # tools not requested: nothing is parsed
    m = parse_chat_output(EX13_GEN, format="Hermes 2 Pro", parse_tool_calls=False, prefix="<tool_call>\n")
    assert m.content == "<tool_call>\n" + EX13_GEN and m.tool_calls == []


def test_partial_marker_is_held_back():
    sp = StreamingChatParser(format="Hermes 2 Pro")
    assert sp.feed("Hello <tool_") == [{"content": "Hello "}]
    assert sp.feed("x") == [{"content": "<tool_x"}]
    sp = StreamingChatParser(format="DeepSeek R1")
    assert sp.feed("<thi") == []
    assert sp.feed("nk>abc</th") == [{"reasoning_content": "abc"}]


def test_llama3_json_and_python_tag():
    m = parse_chat_output('{"name": "get_weather", "parameters": {"city": "Paris"}}', format="Llama 3.x")
    assert m.content == "" and m.tool_calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    m = parse_chat_output('{"type": "function", "name": "f", "parameters": {}}', format="Llama 3.x")
    assert m.tool_calls[0]["function"]["name"] == "f"
    m = parse_chat_output('The answer is {"a": 1}', format="Llama 3.x")
    assert m.content == 'The answer is {"a": 1}' and m.tool_calls == []
    m = parse_chat_output('<|python_tag|>brave_search.call(query="weather", n=3)', format="Llama 3.x with builtin tools")
    assert m.tool_calls[0]["function"]["name"] == "brave_search"
    assert json.loads(m.tool_calls[0]["function"]["arguments"]) == {"query": "weather", "n": 3}
    deltas, final = _stream('{"name": "get_weather", "parameters": {"city": "Paris"}}', format="Llama 3.x")
    assert not any("content" in d for d in deltas)
    assert merge_deltas(deltas).tool_calls == final.tool_calls


def test_mistral_nemo_keeps_model_ids():
    text = 'Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcdefghi"}, {"name": "b", "arguments": {}, "id": "123456789"}]'
    m = parse_chat_output(text, format="Mistral Nemo")
    assert m.content == "Sure."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in m.tool_calls] == [
        ("abcdefghi", "a", '{"x": 1}'), ("123456789", "b", "{}")]
    deltas, final = _stream(text, format="Mistral Nemo")
    assert merge_deltas(deltas) == final == m


def test_deepseek_r1_tool_calls():
    text = ("<think>need weather</think>\n"
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
            "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    m = parse_chat_output(text, format="DeepSeek R1")
    assert m.reasoning_content == "need weather" and m.content == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in m.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]


def test_generic_format():
    m = parse_chat_output('{"tool_calls": [{"name": "a", "arguments": {"x": 1}}]}', format="Generic")
    assert m.tool_calls[0]["function"] == {"name": "a", "arguments": '{"x": 1}'}
    m = parse_chat_output('{"tool_call": {"name": "b", "arguments": {}}}', format="Generic")
    assert m.tool_calls[0]["function"]["name"] == "b"
    m = parse_chat_output('{"response": "hi"}', format="Generic")
    assert (m.content, m.tool_calls) == ("hi", [])


CASES = [
    ("Hermes 2 Pro", "", 'Sure! <think>x</think><tool_call>\n{"name": "a", "arguments": {"s": "<tool_call> }"}}\n</tool_call>tail'),
    ("Hermes 2 Pro", "", '<think>why</think>\n\n<tool_call>{"name":"a","arguments":{"k":[1,{"q":"\\"}"}]}}</tool_call><tool_call>{"name":"b","arguments":{}}</tool_call>'),
    ("Hermes 2 Pro", "<tool_call>\n", EX13_GEN),
    ("DeepSeek R1", "<think>\n", "hmm </thin </think>\n\nThe answer < 7."),
    ("Llama 3.x", "", '  {"name": "f", "parameters": {"a": "b c"}}'),
    ("Llama 3.x", "", '{"nam is not a call'),
    ("Mistral Nemo", "", 'x [TOOL_CALLS] [{"name": "a", "arguments": {"u": 1}, "id": "abcdefghi"}]'),
    ("Content-only", "", "plain <tool_call> text"),
]


@pytest.mark.parametrize("fmt,prefix,text", CASES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_streaming_joins_to_final_parse(fmt, prefix, text, data):
    chunks = data.draw(st.lists(st.integers(1, 7), max_size=len(text)))
    forced = prefix.startswith("<think>")
    deltas, final = _stream(text, chunks, format=fmt, prefix=prefix, thinking_forced_open=forced)
    ref = parse_chat_output(text, format=fmt, prefix=prefix, thinking_forced_open=forced)
    assert _strip_ids(merge_deltas(deltas)) == _strip_ids(final) == _strip_ids(ref)
    assert [c["id"] for c in merge_deltas(deltas).tool_calls] == [c["id"] for c in final.tool_calls]


# -- building blocks -------------------------------------------------------------------------------

def test_split_at_marker_holds_back_a_partial_marker():
    markers = ("<tool_call>", "<function=")
    assert split_at_marker("a <function=f> <tool_call>", markers, partial=True) == ("a ", 2, "<function=")
    assert split_at_marker("a <function=f> <tool_call>", markers, partial=False, start=3) == (
        "function=f> ", 15, "<tool_call>")
    assert split_at_marker("Hello <tool_", markers, partial=True) == ("Hello ", -1, "")
    assert split_at_marker("Hello <tool_", markers, partial=False) == ("Hello <tool_", -1, "")
    assert split_at_marker("Hello <fun", markers, partial=True, start=2) == ("llo ", -1, "")
    assert split_at_marker("x <tool_x", markers, partial=True) == ("x <tool_x", -1, "")
    assert split_at_marker("<think>abc</th", ("</think>",), partial=True, start=7) == ("abc", -1, "")


def test_json_scan_spans_and_cut_off_ends():
    s = '{"a": [1, {"b": "x\\"y"}], "c": -2.5e3, "d": null}'
    end, spans = scan_object(s, 0)
    assert end == len(s) and {k: s[a:b] for k, (a, b) in spans.items()} == {
        "a": '[1, {"b": "x\\"y"}]', "c": "-2.5e3", "d": "null"}
    with pytest.raises(Incomplete) as e:
        scan_object('{"a": 1, "b": {"c": tr', 0)
    assert set(e.value.spans) == {"a"} and e.value.open_key == "b" and e.value.open_start == 14
    for cut in ('"abc', "12", "-", "nul", '"\\u00', "[1, "):
        with pytest.raises(Incomplete):
            scan_value(cut, 0)
    for bad in ("{1: 2}", "[1 2]", "nope", '{"a" 1}'):
        with pytest.raises(Invalid):
            scan_value(bad + " ", 0)


def test_gemma4_thought_channels():
    """common/parsers/gemma4.cpp's grammar: thought channels are reasoning, a trailing empty one and a
    lone <channel|> end the message; streamed deltas join to the final parse."""
    text = "<|channel>thought\nplan it<channel|>The answer.<|channel>thought\n<channel|>"
    m = parse_chat_output(text, format="peg-gemma4")
    assert (m.content, m.reasoning_content) == ("The answer.", "plan it")
    m = parse_chat_output("<|turn>model\nHi<channel|>junk", format="peg-gemma4")
    assert (m.content, m.reasoning_content) == ("Hi", "")
    m = parse_chat_output("<|channel><|channel>thought x<channel|>y", format="peg-gemma4")
    assert (m.content, m.reasoning_content) == ("y", "x")
    m = parse_chat_output(text, format="peg-gemma4", reasoning_format="none")
    assert m.content == "<|channel>thought\nplan it<channel|>The answer.<|channel>thought\n<channel|>"
    deltas, final = _stream(text, format="peg-gemma4")
    assert not any("<" in d.get("content", "") + d.get("reasoning_content", "") for d in deltas)
    assert _strip_ids(merge_deltas(deltas)) == _strip_ids(final)
