"""Continuing the final assistant message (`continue_final_message`, a prefilled assistant turn) as
llama.cpp b1-0c1e570 does.

b1 renders the other messages without the generation prompt and appends a continuation of its own
(chat-auto-parser-generator.cpp; common/parsers/gpt-oss.cpp for harmony):

    tail = gen[:gen.find(start)] + start + reasoning_content (+ end + content)      CONTENT mode
    tail = "<|start|>assistant<|channel|>analysis<|message|>" + reasoning
           (+ "<|end|><|start|>assistant<|channel|>final<|message|>" + content)   gpt-oss

`gen` is the template's generation prompt, `start` / `end` the reasoning markers its differential
analysis finds (chat-diff-analyzer.cpp: analyze_reasoning, and the template workarounds that set
them); a template without them gets `gen + content`. The markers are found here the same way:
render an assistant message with and without reasoning, and a generation prompt with thinking on
and off, and read the markers around the difference. Gemma 4's own continuation (its thought channel)
is reproduced; the tools-only scope probe and Qwen3-Coder's own continuation are not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Callable

THINKING = "REASON_PART I am thinking END_R"
ASSISTANT = "A_ASST_MSG I can help END_A"
USER = "U_USER_MSG Hello END_U"
_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"
_SPACE = r"[ \t\n\v\f\r]*"
_WRAPPED = re.compile(f"({_MARKER}{_SPACE}){re.escape(THINKING)}({_SPACE}{_MARKER}{_SPACE})")
_DELIMITED = re.compile(f"{re.escape(THINKING)}{_SPACE}({_MARKER}{_SPACE})?")
GEMMA4_DETECT = "'<|tool_call>call:'"  # b1's Gemma 4 template detection (chat.cpp)
HARMONY_ANALYSIS = "<|start|>assistant<|channel|>analysis<|message|>"
HARMONY_FINAL = "<|end|><|start|>assistant<|channel|>final<|message|>"


class Continuation(str, Enum):
    CONTENT = "content"
    REASONING = "reasoning_content"


@dataclass(frozen=True)
class ReasoningMarkers:
    start: str = ""
    end: str = ""


def resolve_mode(requested: str, msg: dict) -> Continuation:
    """b1's AUTO: continue the reasoning when the message has reasoning and no content."""
    if requested == Continuation.REASONING:
        return Continuation.REASONING
    if requested == Continuation.CONTENT:
        return Continuation.CONTENT
    if msg.get("reasoning_content") and not msg.get("content"):
        return Continuation.REASONING
    return Continuation.CONTENT


def continuation_tail(source: str, markers: ReasoningMarkers, gen_prompt: str, content: str, reasoning: str,
                      mode: Continuation, rendered: str = "") -> tuple[str, str]:
    """(what follows the rendered messages (`rendered`) in the prompt, the part of it the output
    parser reads)."""
    if GEMMA4_DETECT in source:  # common/parsers/gemma4.cpp
        head = "<|turn>model\n" if rendered.endswith("<turn|>\n") else ""
        tail = head + "<|channel>thought\n" + reasoning
        if mode is Continuation.CONTENT:
            tail += "<channel|>" + content
        return tail, tail[len(head):]
    if "<|channel|>" in source:  # gpt-oss
        tail = HARMONY_ANALYSIS + reasoning
        if mode is Continuation.CONTENT:
            tail += HARMONY_FINAL + content
        return tail, tail
    tail = gen_prompt
    parsed_from = len(gen_prompt)
    if markers.start:
        at = gen_prompt.find(markers.start)
        tail = gen_prompt if at < 0 else gen_prompt[:at]
        tail += markers.start + reasoning + (markers.end if mode is Continuation.CONTENT else "")
        # b1's parser skips the generation prompt up to the trimmed start marker (p.prefix), then
        # reads reasoning from there: the part of the tail the output parser sees
        at = gen_prompt.find(_trim(markers.start))
        parsed_from = len(gen_prompt) if at < 0 else at
    if mode is Continuation.CONTENT:
        tail += content
    return tail, tail[parsed_from:]


# -- the reasoning markers (chat-diff-analyzer.cpp's analyze_reasoning) ---------------------------

def _trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")


def _segments(text: str) -> list[tuple[bool, str]]:
    """segmentize_markers: (is_marker, text) runs; a marker is <...> or [...]."""
    out: list[tuple[bool, str]] = []
    last, opener = 0, ""
    for i, c in enumerate(text):
        if not opener and c in "<[":
            if last < i:
                out.append((False, text[last:i]))
            last, opener = i, c
        elif opener and c == (">" if opener == "<" else "]"):
            out.append((True, text[last:i + 1]))
            last, opener = i + 1, ""
    if last < len(text):
        out.append((False, text[last:]))
    return out


def _diff(left: str, right: str) -> tuple[str, str]:
    """calculate_diff_split's (left, right): what differs after the common marker/text prefix and
    suffix are taken off."""
    ls, rs = _segments(left), _segments(right)
    if not ls:
        return "", right
    if not rs:
        return left, ""
    a, b, c, d = 0, len(ls) - 1, 0, len(rs) - 1  # left [a..b], right [c..d]
    lfull = rfull = False
    while a != b and c != d:
        adv = False
        if ls[a] == rs[c]:
            a, c, adv = a + 1, c + 1, True
        if ls[b] == rs[d]:
            if a != b:
                b -= 1
            else:
                lfull = True
            if c != d:
                d -= 1
            else:
                rfull = True
            adv = True
        if not adv:
            break
    if a == b and c != d:
        if ls[a] == rs[d]:
            d, lfull = d - 1, True
        elif ls[a] == rs[c]:
            c, lfull = c + 1, True
    elif c == d and a != b:
        if ls[b] == rs[c]:
            b, rfull = b - 1, True
        elif ls[a] == rs[c]:
            a, rfull = a + 1, True
    elif a == b and c == d and ls[a] == rs[c] and ls[a][0]:
        lfull = rfull = True
    text_suffix = not ls[b][0] and not rs[d][0] if 0 <= b < len(ls) and 0 <= d < len(rs) else False
    text_prefix = not rs[c][0] and not ls[a][0] if a < len(ls) and c < len(rs) else False
    rem_l = "".join(v for _, v in ls[a:(b if lfull else b + 1)])
    rem_r = "".join(v for _, v in rs[c:(d if rfull else d + 1)])
    suf = 0
    if text_suffix:
        while suf < min(len(rem_l), len(rem_r)) and rem_l[-1 - suf] == rem_r[-1 - suf]:
            suf += 1
    pre = 0
    if text_prefix:
        l2, r2 = rem_l[:len(rem_l) - suf], rem_r[:len(rem_r) - suf]
        while pre < min(len(l2), len(r2)) and l2[pre] == r2[pre]:
            pre += 1
    out_l, out_r = rem_l[pre:len(rem_l) - suf], rem_r[pre:len(rem_r) - suf]
    if not out_l and out_r and right.startswith(left):
        out_r = right[len(left):]
    return out_l, out_r


def find_markers(render: Callable[..., str], source: str) -> ReasoningMarkers:
    """`render(messages, add_generation_prompt, enable_thinking)`: the template; a failed render
    counts as b1's failed comparison (that probe is skipped)."""
    start = end = ""
    tagged = False

    def both(a: dict, b: dict) -> tuple[str, str] | None:
        try:
            return render(**a), render(**b)
        except Exception:
            return None

    user = {"role": "user", "content": USER}
    plain = {"role": "assistant", "content": ASSISTANT}
    with_r = dict(plain, reasoning_content=THINKING)
    # compare_reasoning_presence
    r = both({"messages": [user, plain], "add_generation_prompt": False, "enable_thinking": True},
             {"messages": [user, with_r], "add_generation_prompt": False, "enable_thinking": True})
    if r is not None and THINKING in _diff(*r)[1]:
        m = _WRAPPED.search(r[1])
        if m:
            start, end, tagged = m.group(1), m.group(2), True
        else:
            m = _DELIMITED.search(r[1])
            if m and m.group(1):
                end, tagged = m.group(1), True
    # compare_thinking_enabled
    r = both({"messages": [user], "add_generation_prompt": True, "enable_thinking": False},
             {"messages": [user], "add_generation_prompt": True, "enable_thinking": True})
    if r is not None:
        out_a, out_b = r
        left, right = _diff(out_a, out_b)
        lt, rt = _trim(left), _trim(right)
        if not lt and right:
            if rt and out_b.endswith(rt) and not start:
                start, tagged = right, True
        elif not rt and left:
            if lt and out_a.endswith(lt) and not end:
                seg = [s for s in _segments(out_a) if _trim(s[1])]
                if len(seg) >= 2 and seg[-1][1] == lt and seg[-2][0]:
                    start = seg[-2][1]
                end, tagged = left, True
        elif lt and rt:
            for base, extended in ((out_b, out_a), (out_a, out_b)):
                anchor = base[-64:]
                pos = extended.rfind(anchor)
                if pos < 0 or pos + len(anchor) >= len(extended):
                    continue
                extra = _trim(extended[pos + len(anchor):])
                if not extra:
                    continue
                seg = [s for s in _segments(extra) if _trim(s[1])]
                if len(seg) == 2 and seg[0][0] and seg[1][0]:
                    start = start or seg[0][1]
                    end = end or seg[1][1]
                    tagged = True
                    break
    # the template workarounds of chat-diff-analyzer.cpp that set reasoning markers
    if ("content.split('</think>')" in source and "reasoning_content" not in source
            and "<SPECIAL_12>" not in source and not tagged):
        start, end = "<think>", "</think>"
    if "Write your thoughts between <think></think> and write your response between <response></response>" in source:
        start, end = "<think>", "</think>"
    if all(t in source for t in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        start, end = "<think>\n", "</think>"
    if "laguna_glm_thinking" in source:
        start, end = _trim(start), _trim(end)
    return ReasoningMarkers(start, end)
