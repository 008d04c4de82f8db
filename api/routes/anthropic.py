"""The Anthropic Messages API: `POST /v1/messages`, whole or streamed, and
`POST /v1/messages/count_tokens`, as llama-server b1-0c1e570 serves them.

A request is converted to a chat-completions request (api/convert_anthropic.py) and runs the chat
path (api/chat_task.py); its output is converted back. The API key may come as `x-api-key`
(api/server.py); `anthropic-version` and the other `anthropic-*` headers are accepted and ignored.
Errors keep llama-server's envelope (`{"error": {"code", "message", "type"}}`, which the official
client reads); an error inside a stream is an `event: error` carrying the error object.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.chat import ChatOutput
from api.chat_task import chat_task, prompt_tokens
from api.context import Ctx, random_id
from api.convert_anthropic import AnthropicStream, anthropic_to_chat, message_json, usage
from api.errors import answer, json_response
from api.inputs import read_json
from api.results import collect
from api.sse import sse_error_event, sse_event, stream_events
from runtime.tasks import CompletionResult, TokenOut

router = APIRouter()


@router.post("/v1/messages")
async def messages(ctx: Ctx, request: Request) -> Response:
    body = anthropic_to_chat(await read_json(request))
    prep, task, _ = await chat_task(ctx, body)
    model = ctx.cfg.model_name
    msg_id = "chatcmpl-" + random_id()
    task.cmpl_id = msg_id  # /v1/chat/completions/control
    handle = ctx.engine.submit(task)
    parser = ChatOutput(prep)
    if not task.stream:
        _, res = await collect(handle)
        msg = parser.final_message(res.content)
        return await answer(message_json(msg, msg_id, model, res.stop_type, res.stopping_word,
                                          usage(res.n_prompt_tokens, res.timings.cache_n, res.n_decoded)))

    st = AnthropicStream(msg_id, model)
    n_prompt = len(task.prompt_tokens)

    def encode(events: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        return [sse_event(name, data) for name, data in events]

    def on_token(ev: TokenOut) -> list[bytes]:
        events = st.message_start(n_prompt, ev.n_cached)
        return encode(events + st.deltas(parser.add(ev.text)))

    def on_final(res: CompletionResult) -> list[bytes]:
        events = st.message_start(res.n_prompt_tokens, res.timings.cache_n)
        deltas, final = parser.stream.finish()
        return encode(events + st.final(deltas, final.to_openai(), res.stop_type, res.stopping_word, res.n_decoded))

    return await stream_events(ctx.cfg.sse_ping_interval, handle, on_token, on_final, False, sse_error_event)


@router.post("/v1/messages/count_tokens")
async def count_tokens(ctx: Ctx, request: Request) -> Response:
    body = anthropic_to_chat(await read_json(request))
    return json_response({"input_tokens": len((await prompt_tokens(ctx, body))[1])})
