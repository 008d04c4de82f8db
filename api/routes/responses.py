"""The OpenAI Responses API: `POST /v1/responses` (alias `/responses`), whole or streamed, and the
token-counting routes of llama-server b1-0c1e570 (`handle_count_tokens`):
`/v1/chat/completions/input_tokens`, `/v1/responses/input_tokens` (and their aliases without `/v1`).

A Responses request is converted to a chat-completions request (api/convert_responses.py) and runs
the chat path (api/chat_task.py); its output is converted back.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.chat import ChatOutput
from api.chat_task import chat_task, prompt_tokens
from api.context import ApiContext, Ctx, random_id
from api.convert_responses import ResponsesStream, response_json, responses_to_chat, usage
from api.errors import answer, json_response
from api.inputs import read_json
from api.params import Fields
from api.results import collect
from api.sse import sse_event, stream_events
from runtime.tasks import CompletionResult, PromptProgress, Timings, TokenOut

router = APIRouter()


def _usage(res: CompletionResult) -> dict[str, Any]:
    return usage(res.n_prompt_tokens, res.n_decoded, res.timings.cache_n)


@router.post("/v1/responses")
@router.post("/responses")
async def responses(ctx: Ctx, request: Request) -> Response:
    body = responses_to_chat(await read_json(request))
    prep, task, _ = await chat_task(ctx, body)
    f = Fields(prep.body)
    task.timings_per_token = f.boolean("timings_per_token", False)
    task.return_progress = f.boolean("return_progress", False)
    model = ctx.cfg.model_name
    handle = ctx.engine.submit(task)
    parser = ChatOutput(prep)
    if not task.stream:
        _, res = await collect(handle)
        msg = parser.final_message(res.content)
        return await answer(response_json(msg, "resp_" + random_id(), model, _usage(res)))

    rs = ResponsesStream(model)

    def encode(events: list[tuple[str, dict[str, Any]]], timings: Timings | None,
               progress: PromptProgress | None = None) -> list[bytes]:
        if events:  # llama-server's telemetry goes on the last event of a batch
            if timings is not None:
                events[-1][1]["timings"] = timings.as_dict()
            if progress is not None:
                events[-1][1]["prompt_progress"] = progress.as_dict()
        return [sse_event(name, data) for name, data in events]

    def on_progress(p: PromptProgress) -> list[bytes]:
        timings = Timings(cache_n=p.cache, prompt_n=p.processed - p.cache, prompt_ms=float(p.time_ms))
        return encode(rs.begin(progress=True), timings if task.timings_per_token else None, p)

    def on_token(ev: TokenOut) -> list[bytes]:
        events = rs.begin() + rs.deltas(parser.add(ev.text))
        return encode(events, ev.timings)

    def on_final(res: CompletionResult) -> list[bytes]:
        events = rs.begin()  # no token was streamed (the first one ended the task)
        _, final = parser.stream.finish()  # deltas found only now are not streamed (as llama-server)
        events += rs.final(final.to_openai(), _usage(res))
        return encode(events, res.timings)

    return await stream_events(ctx.cfg.sse_ping_interval, handle, on_token, on_final, False,
                               on_progress=on_progress)


async def count_tokens(ctx: ApiContext, body: dict[str, Any]) -> int:
    """`handle_count_tokens`: the prompt the chat template makes of this chat request, in tokens."""
    return len((await prompt_tokens(ctx, body))[1])


@router.post("/chat/completions/input_tokens")
@router.post("/v1/chat/completions/input_tokens")
async def chat_input_tokens(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    return json_response({"input_tokens": await count_tokens(ctx, body), "object": "response.input_tokens"})


@router.post("/responses/input_tokens")
@router.post("/v1/responses/input_tokens")
async def responses_input_tokens(ctx: Ctx, request: Request) -> Response:
    body = responses_to_chat(await read_json(request))
    return json_response({"input_tokens": await count_tokens(ctx, body), "object": "response.input_tokens"})
