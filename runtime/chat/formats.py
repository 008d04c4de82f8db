"""Chat formats: which syntax a template's model writes tool calls and reasoning in.

`ChatFormat` names the formats as llama.cpp's `common_chat_format_name()` spells them (the names are
echoed as `chat_format` in `generation_settings`); `detect_format(source)` picks one from the template
text the way `common_chat_templates_apply` does. `ReasoningFormat` is llama.cpp's
`--reasoning-format`. The marker words of each format's syntax live here too, so that the output
parsers (`parsers.py`) and the grammars (`tool_grammar.py`) read one definition.
"""
from __future__ import annotations

import re
from enum import Enum


class _Named(str, Enum):
    """A `str` enum whose str() and format() give its value (enum.StrEnum, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class ChatFormat(_Named):
    """A chat format; a `str`, so a plain name compares, hashes and serializes the same."""
    CONTENT_ONLY = "Content-only"
    GENERIC = "Generic"
    MISTRAL_NEMO = "Mistral Nemo"
    LLAMA_3X = "Llama 3.x"
    LLAMA_3X_BUILTIN = "Llama 3.x with builtin tools"
    DEEPSEEK_R1 = "DeepSeek R1"
    FIREFUNCTION_V2 = "FireFunction v2"
    FUNCTIONARY_V3_2 = "Functionary v3.2"
    FUNCTIONARY_V3_1_LLAMA_3_1 = "Functionary v3.1 Llama 3.1"
    HERMES_2_PRO = "Hermes 2 Pro"
    COMMAND_R7B = "Command R7B"
    # b1-0c1e570's generated ("autoparser") format; here only for a JSON response: a request with a
    # json_schema / response_format gets its JSON, optionally in a ```json fence (`json_response_grammar`)
    PEG_NATIVE = "peg-native"
    # gpt-oss's harmony channels (common/parsers/gpt-oss.cpp; b1 echoes it as peg-native, as every
    # Jinja route here): runtime/chat/harmony.py
    GPT_OSS = "GPT-OSS"
    GEMMA4 = "peg-gemma4"


class ReasoningFormat(_Named):
    """llama.cpp --reasoning-format (see `message.py` for what each one does)."""
    NONE = "none"
    AUTO = "auto"
    DEEPSEEK = "deepseek"
    DEEPSEEK_LEGACY = "deepseek-legacy"


class ToolChoice(_Named):
    """OpenAI `tool_choice` (an object naming one function counts as required)."""
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"


# the accepted --reasoning-format / `reasoning_format` names (plain strings: argparse prints their repr)
REASONING_FORMATS: tuple[str, ...] = tuple(f.value for f in ReasoningFormat)

# formats whose templates think: only these get reasoning extracted
THINKING_FORMATS = frozenset({ChatFormat.HERMES_2_PRO, ChatFormat.DEEPSEEK_R1})


class Marker(_Named):
    """The words of the formats' reasoning and tool-call syntax."""
    THINK_START = "<think>"
    THINK_END = "</think>"
    GEMMA4_THOUGHT = "<|channel>thought"  # Gemma 4's reasoning channel (common/parsers/gemma4.cpp's thinking tags)
    GEMMA4_CHANNEL_END = "<channel|>"
    HERMES_CALL_OPEN = "<tool_call>"
    HERMES_CALL_CLOSE = "</tool_call>"
    HERMES_FUNCTION_OPEN = "<function="
    HERMES_FUNCTION_CLOSE = "</function>"
    PYTHON_TAG = "<|python_tag|>"  # Llama 3.x builtin tools
    MISTRAL_CALLS = "[TOOL_CALLS]"
    DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"  # DeepSeek R1
    DS_CALLS_END = "<｜tool▁calls▁end｜>"
    DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
    DS_CALL_END = "<｜tool▁call▁end｜>"
    DS_SEP = "<｜tool▁sep｜>"


def detect_format(source: str, has_tools: bool = True, tool_choice: str = ToolChoice.AUTO,
                  has_json_schema: bool = False, jinja: bool = True) -> ChatFormat:
    """The chat format llama.cpp picks for this template source (common_chat_templates_apply_jinja).

    Some formats are chosen from the template text alone (DeepSeek R1, Hermes 2 Pro, Llama 3.x,
    ...), others only when the request carries tools (Mistral Nemo, Generic); a template without
    any tool syntax and no tools is `Content-only`. A JSON schema (response_format) makes it
    `peg-native` for every template b1-0c1e570 runs through its generated parser (all but the
    specialised ones; templates that reason keep the formats below), with Jinja on (--no-jinja is
    llama-server's legacy route: the schema's grammar alone).
    """
    src = source
    if jinja and "<|channel|>" in src:  # b1's specialised templates come first: gpt-oss
        return ChatFormat.GPT_OSS
    if jinja and has_json_schema and ">>>all" not in src and Marker.THINK_START not in src:
        return ChatFormat.PEG_NATIVE
    if jinja and "'<|tool_call>call:'" in src and not has_tools:  # Gemma 4 (its tool calls: not yet)
        return ChatFormat.GEMMA4
    if Marker.DS_CALLS_BEGIN in src and not has_json_schema:
        return ChatFormat.DEEPSEEK_R1
    if "<|END_THINKING|><|START_ACTION|>" in src:
        return ChatFormat.COMMAND_R7B
    if Marker.HERMES_CALL_OPEN in src and not has_json_schema:
        return ChatFormat.HERMES_2_PRO
    if has_tools and has_json_schema:
        return ChatFormat.GENERIC
    if ">>>all" in src:
        return ChatFormat.FUNCTIONARY_V3_2
    if " functools[" in src:
        return ChatFormat.FIREFUNCTION_V2
    if "<|start_header_id|>" in src and Marker.HERMES_FUNCTION_OPEN in src:
        return ChatFormat.FUNCTIONARY_V3_1_LLAMA_3_1
    if "<|start_header_id|>ipython<|end_header_id|>" in src:
        return ChatFormat.LLAMA_3X
    if not has_tools or tool_choice == ToolChoice.NONE:
        return ChatFormat.CONTENT_ONLY
    if Marker.MISTRAL_CALLS in src:
        return ChatFormat.MISTRAL_NEMO
    return ChatFormat.GENERIC


_FORCED_OPEN_RE = re.compile(re.escape(Marker.THINK_START) + r"\s*$")


def thinking_forced_open(generation_prompt: str) -> bool:
    """True when the generation prompt ends inside an open `<think>` block (DeepSeek R1, QwQ)."""
    return bool(_FORCED_OPEN_RE.search(generation_prompt))
