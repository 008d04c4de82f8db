"""Streaming: text deltas -> OpenAI `delta` dicts, tool calls by index.

Every delta re-parses the whole text so far as partial output (`message.parse_message`) and sends
what grew: more content, more reasoning, a new tool call (index, id, name and the arguments so
far) or more of a call's arguments. Text that may be the start of a marker is held back by the
parsers, so the deltas joined equal the final parse for well-formed output. An output cut off
inside a tool call keeps the half call as content in the final parse, while the stream may already
have sent its name (llama-server has the same limitation).
"""
from __future__ import annotations

from runtime.chat.calls import random_tool_call_id, to_openai_calls
from runtime.chat.formats import ChatFormat, ReasoningFormat
from runtime.chat.message import MessageParse, ParsedMessage, parse_message


class StreamingChatParser:
    """Feed text deltas, get OpenAI `delta` dicts. Usage::

        sp = StreamingChatParser(format, reasoning_format, thinking_forced_open, parse_tool_calls, prefix)
        for piece in pieces: send(sp.feed(piece))
        deltas, message = sp.finish()
    """

    def __init__(self, format: str = ChatFormat.CONTENT_ONLY, reasoning_format: str = ReasoningFormat.AUTO,
                 thinking_forced_open: bool = False, parse_tool_calls: bool = True, prefix: str = "",
                 think_space: tuple[str, str] | None = None):
        self.format = format
        self.think_space = think_space
        self.reasoning_format = reasoning_format
        self.thinking_forced_open = thinking_forced_open
        self.parse_tool_calls = parse_tool_calls
        self.text = prefix
        self._content = ""
        self._reasoning = ""
        self._calls: list[tuple[str, str]] = []  # (name, arguments sent so far)
        self._ids: list[str] = []
        self._done = False

    def _parse(self, partial: bool) -> MessageParse:
        return parse_message(self.text, self.format, self.reasoning_format, self.thinking_forced_open,
                             self.parse_tool_calls, partial, self.think_space)

    def _diff(self, p: MessageParse) -> list[dict]:
        out: list[dict] = []
        if p.reasoning.startswith(self._reasoning) and len(p.reasoning) > len(self._reasoning):
            out.append({"reasoning_content": p.reasoning[len(self._reasoning):]})
            self._reasoning = p.reasoning
        if p.content.startswith(self._content) and len(p.content) > len(self._content):
            out.append({"content": p.content[len(self._content):]})
            self._content = p.content
        for n, c in enumerate(p.calls):
            if c.name is None:
                break
            if n >= len(self._calls):
                if c.partial and not c.arguments:
                    break
                if n >= len(self._ids):
                    self._ids.append(c.id or random_tool_call_id())
                out.append({"tool_calls": [{"index": n, "id": self._ids[n], "type": "function",
                                            "function": {"name": c.name, "arguments": c.arguments}}]})
                self._calls.append((c.name, c.arguments))
            else:
                sent = self._calls[n][1]
                if c.arguments.startswith(sent) and len(c.arguments) > len(sent):
                    out.append({"tool_calls": [{"index": n, "function": {"arguments": c.arguments[len(sent):]}}]})
                    self._calls[n] = (c.name, c.arguments)
        return out

    def feed(self, delta: str) -> list[dict]:
        if self._done:
            raise RuntimeError("feed() after finish()")
        self.text += delta
        return self._diff(self._parse(True))

    def finish(self) -> tuple[list[dict], ParsedMessage]:
        """The remaining deltas and the final message (tool call ids as streamed)."""
        self._done = True
        p = self._parse(False)
        deltas = self._diff(p)
        return deltas, ParsedMessage(p.content, p.reasoning, to_openai_calls(p.calls, self._ids))


def merge_deltas(deltas: list[dict]) -> ParsedMessage:
    """Join OpenAI deltas the way a client does (for tests and for logging)."""
    msg = ParsedMessage()
    calls: dict[int, dict] = {}
    for d in deltas:
        msg.content += d.get("content") or ""
        msg.reasoning_content += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or []:
            cur = calls.setdefault(tc["index"], {"type": "function", "function": {"name": "", "arguments": ""}, "id": ""})
            if "id" in tc:
                cur["id"] = tc["id"]
            fn = tc.get("function") or {}
            cur["function"]["name"] += fn.get("name") or ""
            cur["function"]["arguments"] += fn.get("arguments") or ""
    msg.tool_calls = [calls[k] for k in sorted(calls)]
    return msg
