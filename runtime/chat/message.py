"""Model output -> (content, reasoning_content, tool_calls), as llama-server's chat parser does.

The parser reads `prefix + generated`, where `prefix` is the part of the assistant message that the
prompt already holds: the `<think>\\n` a generation prompt ends with when thinking is forced open
(DeepSeek R1, QwQ; lesson Example 14) and a prefilled assistant message (Example 13's
`<tool_call>\\n`). So with reasoning_format "none" the content starts with that `<think>`, and a
prefilled tool-call opener is completed by the generated text.

reasoning_format (llama.cpp --reasoning-format):
  * "none": no extraction, the raw text stays in content.
  * "auto" / "deepseek": text between `<think>` and `</think>` (or from the start when thinking is
    forced open) goes to reasoning_content, unstripped; the content after `</think>` loses its
    leading whitespace.
  * "deepseek-legacy": reasoning_content is filled the same way and content keeps the raw text
    including the tags.
Reasoning is only extracted for formats whose templates think (Hermes 2 Pro, DeepSeek R1), and from
gpt-oss's analysis channel (`harmony.py`: the text parsed after its generation prompt
`<|start|>assistant`; reasoning_format none puts the analysis message, tags included, in content).

Tool calls (`parsers.py` per format) are returned as OpenAI dicts `{"type": "function", "function":
{"name", "arguments"}, "id"}`; the id is 32 random alphanumerics unless the model gave one (Mistral).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.chat.calls import ParsedCall, to_openai_calls
from runtime.chat.formats import REASONING_FORMATS, THINKING_FORMATS, ChatFormat, Marker, ReasoningFormat
from runtime.chat.gemma4 import parse_gemma4
from runtime.chat.harmony import parse_harmony
from runtime.chat.json_scan import skip_ws
from runtime.chat.parsers import parse_json_response, parse_tool_calls, split_at_marker


@dataclass
class ParsedMessage:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def to_openai(self) -> dict:
        """The `message` object of a chat completion (content "" rather than null, as the lesson shows)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [dict(tc) for tc in self.tool_calls]
        return msg


@dataclass
class MessageParse:
    """One parse of the text so far (calls not yet in OpenAI form)."""
    content: str
    reasoning: str
    calls: list[ParsedCall]


def _optspace(text: str, i: int, spaces: str) -> int:
    """b1's optspace: each of the tag's own surrounding whitespace characters, optionally, in order."""
    for ch in spaces:
        if text.startswith(ch, i):
            i += 1
    return i


def parse_message(text: str, fmt: str, reasoning_format: str, thinking_forced_open: bool,
                  with_tool_calls: bool, partial: bool, think_space: tuple[str, str] | None = None) -> MessageParse:
    """Split `text` into reasoning, content and tool calls; `partial` while more text may follow.
    `think_space`: the whitespace the template's reasoning markers end with (runtime/chat/continuation.py),
    b1's optspace after `<think>` and after `</think>`; None: any whitespace after `</think>`.
    Reasoning of whitespace only is dropped, as b1's PEG mapper drops it."""
    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"unknown reasoning_format {reasoning_format!r}")
    if fmt == ChatFormat.GEMMA4:  # thought channels -> reasoning
        content, reasoning = parse_gemma4(text, reasoning_format != ReasoningFormat.NONE, partial)
        return MessageParse(content, "" if not reasoning.strip(" \n\r\t") else reasoning, [])
    if fmt == ChatFormat.GPT_OSS:  # harmony channels: analysis -> reasoning, final -> content, calls
        h = parse_harmony(text, reasoning_format != ReasoningFormat.NONE, with_tool_calls, partial)
        return MessageParse(h.content, h.reasoning, h.calls)
    reasoning = ""
    raw_head = ""  # deepseek-legacy keeps the reasoning section in content
    body = text
    if reasoning_format != ReasoningFormat.NONE and fmt in THINKING_FORMATS:
        start = 0
        opened = False
        if text.startswith(Marker.THINK_START):
            start, opened = len(Marker.THINK_START), True
            if think_space is not None:
                start = _optspace(text, start, think_space[0])
        elif thinking_forced_open:
            opened = True
        elif partial and Marker.THINK_START.startswith(text):
            return MessageParse("", "", [])  # may become "<think>"
        if opened:
            reasoning, end, _ = split_at_marker(text, (Marker.THINK_END,), partial, start)
            if end >= 0:
                body_start = (skip_ws(text, end + len(Marker.THINK_END)) if think_space is None
                              else _optspace(text, end + len(Marker.THINK_END), think_space[1]))
                if partial and body_start >= len(text):
                    body_start = len(text)
                raw_head = text[:body_start]
                body = text[body_start:]
            else:
                raw_head = text[:start] + reasoning
                body = ""
    if fmt == ChatFormat.PEG_NATIVE:  # a JSON response: tools are not parsed (not in its grammar either)
        content, calls = parse_json_response(body, partial), []
    elif with_tool_calls:
        content, calls = parse_tool_calls(body, fmt, partial)
    else:
        content, calls = body, []
    if reasoning_format == ReasoningFormat.DEEPSEEK_LEGACY and reasoning:
        content = raw_head + content
    if not reasoning.strip(" \n\r\t"):
        reasoning = ""
    return MessageParse(content, reasoning, calls)


def parse_chat_output(text: str, format: str = ChatFormat.CONTENT_ONLY, reasoning_format: str = ReasoningFormat.AUTO,
                      thinking_forced_open: bool = False, parse_tool_calls: bool = True,
                      prefix: str = "", tool_call_ids: list[str] | None = None,
                      think_space: tuple[str, str] | None = None) -> ParsedMessage:
    """Parse a complete generation. `prefix`: assistant text already in the prompt (see module doc).
    `tool_call_ids`: ids to use for the calls in order (extended with new random ones)."""
    p = parse_message(prefix + text, format, reasoning_format, thinking_forced_open, parse_tool_calls, False,
                      think_space)
    return ParsedMessage(p.content, p.reasoning, to_openai_calls(p.calls, tool_call_ids))
