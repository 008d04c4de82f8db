"""Gemma 4's output (b1-0c1e570's common/parsers/gemma4.cpp, without tools): reasoning in thought
channels, the rest content.

    root    := "<|turn>model\n"? message+
    message := thought content
    thought := "<|channel>"* (not followed by "thought") "<|channel>thought" SPACE REASONING(until "<channel|>") "<channel|>"
             | (nothing, when the text does not continue with "<|channel>")
    content := CONTENT(until "<|channel>" or "<channel|>")

With reasoning_format none a thought block is content, tags included. The parse stops where the
grammar does (e.g. at a lone "<channel|>"), keeping what it captured; while streaming, a tail that
may still become a marker is held back.
"""
from __future__ import annotations

from runtime.chat.json_scan import skip_ws
from runtime.chat.parsers import split_at_marker

TURN = "<|turn>model\n"
CHANNEL = "<|channel>"
THOUGHT = "<|channel>thought"
CHANNEL_END = "<channel|>"


def parse_gemma4(text: str, extract_reasoning: bool, partial: bool) -> tuple[str, str]:
    """(content, reasoning) of Gemma 4's output `text`."""
    content: list[str] = []
    reasoning: list[str] = []
    i = len(TURN) if text.startswith(TURN) else 0
    if partial and TURN.startswith(text[i:]) and i == 0 and text:
        return "", ""
    while i < len(text):
        if text.startswith(CHANNEL, i):
            j = i
            while text.startswith(CHANNEL, j) and not text.startswith(THOUGHT, j):
                j += len(CHANNEL)  # b1's consume_empty_channels
            if not text.startswith(THOUGHT, j):
                if partial and THOUGHT.startswith(text[j:]):
                    break  # may still become a thought channel
                break
            k = skip_ws(text, j + len(THOUGHT))
            body, end, _ = split_at_marker(text, (CHANNEL_END,), partial, k)
            if extract_reasoning:
                reasoning.append(body)
            else:
                content.append(text[i:k] + body + (CHANNEL_END if end >= 0 else ""))
            if end < 0:
                break
            i = end + len(CHANNEL_END)
        body, end, _ = split_at_marker(text, (CHANNEL, CHANNEL_END), partial, i)
        content.append(body)
        if end < 0 or end == i and text.startswith(CHANNEL_END, end):
            break  # the end, or a lone "<channel|>": the grammar stops there
        i = end
    return "".join(content), "".join(reasoning)
