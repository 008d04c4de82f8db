"""Embedding routes (`--embeddings` servers): OpenAI's `/v1/embeddings` (floats or base64) and
llama-server's `/embedding` (alias `/embeddings`), one EmbeddingTask per input (images / audio with
--mmproj: a prompt's media is read in chunks as for completions, so a pooled vector is, as
llama-server's, that of the text after the last media chunk)."""
from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.context import ApiContext, Ctx
from api.errors import ApiError, answer, not_supported
from api.chat import media_options
from api.chat_task import media_prompt
from api.inputs import INVALID_TOKENS, check_context, check_task_count, is_int, off_loop, prompt_with_media, read_json
from api.media import _value, content_load_media
from api.params import Fields
from api.results import collect
from runtime.tasks import EmbeddingTask

router = APIRouter()


async def embedding_inputs(ctx: ApiContext, body: dict[str, Any], pooling: str) -> list[tuple[list[int], list[Any]]]:
    """`input` (or `content`): a string, a token list, a prompt object (`prompt_string`, with
    `multimodal_data` on a server with --mmproj), an object of OpenAI content parts (`content`:
    text, image_url, input_audio), or a list of these -> each one's token ids and media chunks."""
    raw = body.get("input") if body.get("input") is not None else body.get("content")
    if raw is None:
        raise ApiError('"input" or "content" must be provided')
    if isinstance(raw, list) and not any(is_int(x) for x in raw):
        items: list[Any] = raw
    else:
        items = [raw]
    check_task_count(len(items))
    out = [await _input_tokens(ctx, it) for it in items]
    if not out:
        raise ApiError('"input" must not be empty')
    for toks, _ in out:
        if not toks:
            raise ApiError("Input content cannot be empty")
        if EmbeddingTask(toks, pooling).splittable:  # the others must fit one ubatch: the engine's check
            check_context(len(toks), ctx.engine.n_ctx_slot)
    return out


async def _input_tokens(ctx: ApiContext, item: Any) -> tuple[list[int], list[Any]]:
    """One input, as b1's handle_embeddings_impl tokenizes it (tokenize_oai_content_array for an
    object with `content`, else tokenize_input_subprompt)."""
    if not (isinstance(item, dict) and "content" in item):
        try:
            return await prompt_with_media(ctx, item)
        except ApiError as e:
            raise _unhandled(e) from None
    content = item["content"]
    if not isinstance(content, list):
        raise ApiError('"content" must be an array')
    opts = media_options(ctx) or {"modalities": {}, "media_path": "", "marker": ctx.media_marker}
    files: list[bytes] = []
    parts = await off_loop(content_load_media, content, opts["modalities"], opts["media_path"], files,
                           opts["marker"])
    prompt = "".join(_value(p, "text", "") for p in parts)
    if files:
        try:
            mp = await media_prompt(ctx, prompt, files)
        except ApiError as e:
            raise _unhandled(e) from None
        return list(mp.tokens), list(mp.chunks)
    return list(await off_loop(ctx.tokenizer.encode, prompt, add_special=True, parse_special=True)), []


def _unhandled(e: ApiError) -> ApiError:
    """b1 tokenizes the embeddings' inputs outside any handler: the prompt's std::runtime_errors
    (and JSON type errors) reach the HTTP wrapper as 500s, where /completion answers 400. Token
    ids outside the vocabulary are refused later, when the task starts: a 400 there too."""
    if e.code == 400 and e.message != INVALID_TOKENS:
        return ApiError(e.message, "server_error", 500)
    return e


async def run_embeddings(ctx: ApiContext, body: dict[str, Any], oai: bool) -> tuple[list[list[int]], list[Any]]:
    """The inputs' token lists and, for each, the engine's vectors (one per token with pooling none)."""
    cfg = ctx.cfg
    if not cfg.embeddings:
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    pooling = cfg.pooling or ctx.engine.model_info.get("pooling", "none")  # --pooling, else the model's
    if oai and pooling == "none":
        raise ApiError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    inputs = await embedding_inputs(ctx, body, pooling)
    normalize = Fields(body).integer("embd_normalize", cfg.embd_normalize)
    handles = [ctx.engine.submit(EmbeddingTask(t, pooling, normalize, media)) for t, media in inputs]
    outs = await asyncio.gather(*(collect(h) for h in handles))
    return [t for t, _ in inputs], [res for _, res in outs]


@router.post("/v1/embeddings")
async def oai_embeddings(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    inputs, results = await run_embeddings(ctx, body, True)
    b64 = body.get("encoding_format") == "base64"
    data = []
    for i, vecs in enumerate(results):
        vec = vecs[0]
        emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
        data.append({"embedding": emb, "index": i, "object": "embedding"})
    n = sum(len(t) for t in inputs)
    return await answer({"model": body.get("model") or ctx.cfg.model_name, "object": "list",
                          "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data})


@router.post("/embedding")
@router.post("/embeddings")
async def native_embeddings(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    _, results = await run_embeddings(ctx, body, False)
    return await answer([{"index": i, "embedding": vecs} for i, vecs in enumerate(results)])
