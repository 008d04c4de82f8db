"""Built-in chat templates chosen by name (`--chat-template llama3`), as Jinja sources that render
what llama.cpp's legacy `llama_chat_apply_template` writes for that name (src/llama-chat.cpp of
b1-0c1e570): message contents trimmed, the assistant turn opened with add_generation_prompt.

Only a few names are known here; any other value of --chat-template is taken as Jinja source.
"""
from __future__ import annotations

_C = "(message['content'] or '') | trim"

NAMED_TEMPLATES: dict[str, str] = {
    # Meta Llama 3
    "llama3": (
        "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
        "{{ " + _C + " }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # CohereForAI/c4ai-command-r-plus
    "command-r": (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{{ " + _C + " }}<|END_OF_TURN_TOKEN|>"
        "{% elif message['role'] == 'user' %}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ " + _C + " }}<|END_OF_TURN_TOKEN|>"
        "{% elif message['role'] == 'assistant' %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{{ " + _C + " }}"
        "<|END_OF_TURN_TOKEN|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
    ),
}


def named_template(name: str) -> str | None:
    """The Jinja source of a built-in template name, None for any other value."""
    return NAMED_TEMPLATES.get(name)
