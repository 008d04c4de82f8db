"""A task's events -> response parts shared by the route families: the whole event list of a
non-streamed task, token probabilities, usage, finish reasons, and llama-server's native
completion objects (the final one and a streamed token's), which /v1/completions echoes too.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, NoReturn

from api.context import ApiContext
from api.engine_api import TaskHandleAPI, TokenizerAPI
from api.errors import ApiError
from runtime.tasks import CompletionResult, CompletionTask, PromptProgress, TaskError, TokenOut


def raise_task_error(err: TaskError) -> NoReturn:
    raise ApiError(err.message, err.type, err.code, dict(err.extra))


async def collect(handle: TaskHandleAPI) -> tuple[list[TokenOut], Any]:
    """All events of a task: the TokenOut list and the final event (result or embedding)."""
    tokens: list[TokenOut] = []
    done = False
    try:
        async for ev in handle.events():
            if isinstance(ev, TokenOut):
                tokens.append(ev)
                continue
            if isinstance(ev, PromptProgress):  # only streams ask for them
                continue
            done = True
            if isinstance(ev, TaskError):
                raise_task_error(ev)
            return tokens, ev
    finally:
        if not done:
            handle.cancel()
    raise ApiError("task ended without a result", "server_error", 500)


class ClientGone(ApiError):
    """The client closed the connection before its non-streamed result was ready (the answer
    goes nowhere)."""

    def __init__(self) -> None:
        super().__init__("client disconnected", "server_error", 499)


async def _disconnected(request: Any) -> None:
    """Returns when the client goes away (the body has been read: the next message is the end)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def collect_all(request: Any, handles: list[TaskHandleAPI]) -> list[tuple[list[TokenOut], Any]]:
    """`collect` of every handle; a client that disconnects meanwhile cancels the tasks (their slots
    are freed at the next step) and raises ClientGone."""
    work = asyncio.ensure_future(asyncio.gather(*(collect(h) for h in handles)))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
            work.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
            for h in handles:
                h.cancel()
        gone.cancel()
    if not work.done() or work.cancelled():
        raise ClientGone()
    return list(work.result())


def probs_json(tok: TokenizerAPI, toks: list[TokenOut], post_sampling: bool) -> list[dict[str, Any]]:
    """`completion_probabilities` / `logprobs.content` entries (the candidates' texts are their pieces)."""
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def val(lp: float | None) -> float:
        if lp is None:
            return 0.0
        if post_sampling:
            return math.exp(lp)
        return lp if math.isfinite(lp) else -3.4028234663852886e38

    out = []
    for t in toks:
        # as llama-server: the text this token sent (held-back bytes of earlier tokens included, ""
        # while it is itself held back), so that the tokens joined are the content
        sent = t.text.encode("utf-8", "surrogateescape")
        out.append({
            "id": t.id,
            "token": t.text,
            "bytes": list(sent),
            key: val(t.logprob),
            top_key: [{"id": p.id, "token": p.token, "bytes": list(p.bytes), key: val(p.logprob)}
                      for p in (t.probs or [])],
        })
    return out


def progress_json(ev: PromptProgress) -> dict[str, Any]:
    return {"total": ev.total, "cache": ev.cache, "processed": ev.processed, "time_ms": ev.time_ms}


def with_progress(chunk: dict[str, Any], ev: PromptProgress, timings: bool) -> dict[str, Any]:
    """A streamed chunk carrying `prompt_progress` (and `timings` with `timings_per_token`)."""
    if timings:
        chunk["timings"] = ev.timings.as_dict()
    chunk["prompt_progress"] = progress_json(ev)
    return chunk


def usage_json(res: CompletionResult) -> dict[str, Any]:
    return {
        "completion_tokens": res.n_decoded,
        "prompt_tokens": res.n_prompt_tokens,
        "total_tokens": res.n_decoded + res.n_prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": res.timings.cache_n},
    }


def finish_reason(res: CompletionResult, has_tool_calls: bool = False) -> str:
    if res.stop_type in ("eos", "word"):
        return "tool_calls" if has_tool_calls else "stop"
    return "length"


@dataclass
class NativeRequest:
    """What a native /completion response echoes besides the engine's result."""
    task: CompletionTask
    settings: dict[str, Any]
    prompt_text: str
    n_probs: int
    post_sampling: bool
    index: int = 0


def completion_final_json(ctx: ApiContext, req: NativeRequest, res: CompletionResult, toks: list[TokenOut],
                          stream: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "index": req.index,
        "content": "" if stream else res.content,
        "tokens": list(res.tokens) if (req.task.return_tokens and not stream) else [],
        "id_slot": res.id_slot,
        "stop": True,
        "model": ctx.cfg.model_name,
        "tokens_predicted": res.n_decoded,
        "tokens_evaluated": res.n_prompt_tokens,
        "generation_settings": req.settings,
        "prompt": req.prompt_text,
        "has_new_line": res.has_new_line,
        "truncated": res.truncated,
        "stop_type": res.stop_type,
        "stopping_word": res.stopping_word,
        "tokens_cached": res.tokens_cached,
        "timings": res.timings.as_dict(),
    }
    if not stream and req.n_probs > 0:
        d["completion_probabilities"] = probs_json(ctx.tokenizer, toks, req.post_sampling)
    return d


def partial_json(index: int, ev: TokenOut, n_prompt: int, probs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A streamed token as llama-server b1-0c1e570's native partial (its to_json_non_oaicompat): the
    token id always, the running count, then the timings and `probs` when there are any."""
    d: dict[str, Any] = {"index": index, "content": ev.text, "tokens": [ev.id], "stop": False, "id_slot": -1,
                         "tokens_predicted": ev.n_decoded, "tokens_evaluated": n_prompt}
    if ev.timings is not None:
        d["timings"] = ev.timings.as_dict()
    if probs:
        d["completion_probabilities"] = probs
    return d
