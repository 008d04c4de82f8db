"""Chat formats: templates, output parsing (whole and streamed) and tool-call grammars.

formats.py      format ids, reasoning formats, marker words, format detection from the template
template.py     the Jinja chat template (caps.py: its capability probing)
json_scan.py    a JSON scanner that tolerates a cut-off end
calls.py        a tool call as read from JSON and as returned in OpenAI form
parsers.py      per-format tool-call parsers and the one marker hold-back rule
message.py      model text -> content, reasoning_content, tool_calls
stream.py       text deltas -> OpenAI deltas (tool calls by index)
tool_grammar.py every tool-call grammar and its trigger words, and a JSON response's grammar
"""
from runtime.chat.caps import CAPS_KEYS
from runtime.chat.formats import (
    REASONING_FORMATS,
    ChatFormat,
    ReasoningFormat,
    ToolChoice,
    detect_format,
    thinking_forced_open,
)
from runtime.chat.message import ParsedMessage, parse_chat_output
from runtime.chat.stream import StreamingChatParser, merge_deltas
from runtime.chat.template import (
    ChatTemplate,
    default_chatml_template,
    fallback_chatml_template,
    message_workarounds,
    normalize_messages,
)
from runtime.chat.tool_grammar import (
    ToolGrammar,
    ToolGrammarError,
    hermes_grammar,
    json_response_grammar,
    tool_call_grammar,
    tool_call_triggers,
    tool_grammar_for,
)

__all__ = [
    "CAPS_KEYS", "REASONING_FORMATS", "ChatFormat", "ChatTemplate", "ParsedMessage", "ReasoningFormat",
    "StreamingChatParser", "ToolChoice", "ToolGrammar", "ToolGrammarError", "default_chatml_template", "fallback_chatml_template",
    "detect_format", "hermes_grammar", "json_response_grammar", "merge_deltas", "message_workarounds", "normalize_messages", "parse_chat_output",
    "thinking_forced_open", "tool_call_grammar", "tool_call_triggers", "tool_grammar_for",
]
