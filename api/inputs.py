"""Request bodies and prompts -> plain data: the JSON body, prompt token ids, the context check.

Shared by the route families (native, OpenAI, tokens, embeddings); every failure is an ApiError
with llama-server's message.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from fastapi import Request

from api import strict_json
from api.context import ServerConfig
from api.engine_api import TokenizerAPI
from api.errors import ApiError, context_exceeded, not_supported

OFF_LOOP_BYTES = 256 << 10  # bodies (and prompts) larger than this are parsed / tokenized in a worker thread


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, parsed as strictly as llama-server (api/strict_json.py):
    a parse error is its 500 server_error. A large body is parsed off the event loop."""
    raw = await request.body()
    if not raw.strip():
        return {}
    data = await asyncio.to_thread(strict_json.loads, raw) if len(raw) > OFF_LOOP_BYTES else strict_json.loads(raw)
    if not isinstance(data, dict):
        raise ApiError(f"[json.exception.type_error.302] type must be object, but is {type(data).__name__}",
                       "invalid_request_error", 400)
    return data


async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run CPU-heavy request work (tokenizing a prompt) in a worker thread: the event loop keeps
    serving other requests (/health answers while a 50 MB prompt is tokenized)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def tokenize_prompt(tok: TokenizerAPI, prompt: Any) -> list[int]:
    """A /completion prompt: a string, a list of ids, a list mixing ids and strings
    (`tokenize_mixed`: add_special for the first string piece, special tokens parsed), or an object
    `{"prompt_string": ...}` (with `multimodal_data`: refused, no multimodal model here)."""
    if isinstance(prompt, dict):
        if "prompt_string" not in prompt:
            raise ApiError('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt '
                           'string, or a list of mixed strings & tokens.')
        if "multimodal_data" in prompt:
            raise ApiError("Multimodal data provided, but model does not support multimodal requests.")
        return tokenize_prompt(tok, prompt["prompt_string"])
    if isinstance(prompt, str):
        return list(tok.encode(prompt, add_special=True, parse_special=True))
    if isinstance(prompt, list):
        out: list[int] = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                out.extend(tok.encode(p, add_special=(i == 0), parse_special=True))
            elif isinstance(p, int) and not isinstance(p, bool):
                if not 0 <= p < tok.n_vocab:
                    raise ApiError(f"invalid token id {p} (n_vocab = {tok.n_vocab})")
                out.append(p)
            else:
                raise ApiError('"prompt" must be a string, a list of tokens, or a list of mixed strings & tokens')
        return out
    raise ApiError('"prompt" must be a string, a list of tokens, a list of mixed strings & tokens, or a list of prompts')


def split_prompts(prompt: Any) -> list[Any]:
    """A `prompt` field -> its prompts: a list without numbers (strings, token lists, prompt
    objects) holds one prompt per element (llama-server's tokenize_input_prompts)."""
    if isinstance(prompt, list):
        if not prompt:
            raise ApiError('"prompt" must not be empty')
        if not any(isinstance(p, (int, float)) and not isinstance(p, bool) for p in prompt):
            return list(prompt)
    return [prompt]


def check_context(n_tokens: int, n_ctx_slot: int) -> None:
    """A prompt must leave room in its slot: llama-server's exceed_context_size_error otherwise."""
    if n_tokens >= n_ctx_slot:
        raise context_exceeded(n_tokens, n_ctx_slot)


def require_generation(cfg: ServerConfig) -> None:
    """Generation routes are off on an `--embeddings` server."""
    if cfg.embeddings:
        raise not_supported("This server does not support completions. Start it without `--embeddings`")
