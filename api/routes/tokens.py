"""Text <-> tokens without generating: `/tokenize`, `/detokenize`, `/apply-template` (the prompt size
of a chat request, `/v1/chat/completions/input_tokens`, is in api/routes/responses.py)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api import chat as chat_api
from api.context import Ctx
from api.errors import ApiError, answer, json_response, json_type_name
from api.inputs import as_token, off_loop, read_json, tokenize_mixed
from api.params import Fields

router = APIRouter()


@router.post("/tokenize")
async def tokenize(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    f = Fields(body)
    content = body.get("content")
    with_pieces = f.lenient("with_pieces", "boolean", False)  # json_value: a wrong type is the default
    toks: list[int] = []
    if "content" in body:  # b1's tokenize_mixed: ids in a list are echoed as given, even outside the vocabulary
        toks = await off_loop(tokenize_mixed, ctx.tokenizer, content, f.lenient("add_special", "boolean", False),
                              f.lenient("parse_special", "boolean", True), 500)
    if not with_pieces:
        return await off_loop(json_response, {"tokens": toks})
    return await off_loop(_with_pieces, ctx.tokenizer, toks)


def _with_pieces(tok: Any, toks: list[int]) -> Response:
    """/tokenize's `with_pieces` answer (run off the event loop: a 4 MB text is a million pieces)."""
    out = []
    for t in toks:
        if not 0 <= t < tok.n_vocab:  # b1: id_to_token.at(t)
            raise ApiError(f"vector::_M_range_check: __n (which is {t % (1 << 64)}) >= this->size() "
                           f"(which is {tok.n_vocab})", "server_error", 500)
        piece = tok.piece(t)
        try:
            p: Any = piece.decode("utf-8")
        except UnicodeDecodeError:
            p = list(piece)
        out.append({"id": t, "piece": p})
    return json_response({"tokens": out})


@router.post("/detokenize")
async def detokenize(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    raw = body.get("tokens")
    if raw is not None and not isinstance(raw, list):  # b1: get<llama_tokens>(), its 500
        raise ApiError(f"[json.exception.type_error.302] type must be array, but is {json_type_name(raw)}", "server_error", 500)
    return await off_loop(_detokenize, ctx.tokenizer, raw or [])  # 4M ids take seconds


def _detokenize(tok: Any, raw: list) -> Response:
    toks = [as_token(t, 500) for t in raw]  # numbers convert (1.5 -> 1), as nlohmann does
    n_vocab = tok.n_vocab
    for t in toks:
        if not 0 <= t < n_vocab:  # b1 answers a C++ range error (500); a 400 naming the id here
            raise ApiError(f"invalid token id {t!r}")
    # llama-server joins the pieces (tokens_to_str): no SPM leading-space removal
    return json_response({"content": tok.decode(toks, remove_leading_space=False) if toks else ""})


@router.post("/apply-template")
async def apply_template(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    prep = await off_loop(chat_api.prepare, ctx, body)
    return await answer({"prompt": prep.prompt})
