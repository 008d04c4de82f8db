"""Slots: `GET /slots` (`--slots`, on by default) and the slot file actions
`POST /slots/{id}?action=save|restore|erase` (`--slot-save-path`).

A file name is checked with the runtime's `valid_slot_filename` (llama.cpp's
fs_validate_filename) before the engine is asked, as llama-server checks it before the slot id;
the engine's `SlotError(code, message, type)` becomes the same error envelope.
"""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.context import Ctx
from api.errors import ApiError, json_response, not_supported
from api.inputs import read_json
from api.params import Fields, sampling_settings
from runtime.serving import SlotError, valid_slot_filename
from runtime.tasks import CompletionTask

router = APIRouter()


@router.get("/slots")
async def slots(ctx: Ctx, request: Request) -> Response:
    cfg = ctx.cfg
    if not cfg.slots:
        raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
    fail = request.query_params.get("fail_on_no_slot", "")
    if fail not in ("", "0", "false") and not ctx.engine.idle_slot_available():
        raise ApiError("no slot available", "unavailable_error", 503)
    out = ctx.engine.slots_info()
    for d in out:
        task = d.pop("task", None)
        if task is None:
            continue
        params = task.params if isinstance(task, CompletionTask) else cfg.defaults
        settings = sampling_settings(params, getattr(task, "n_predict", -1), getattr(task, "stream", False),
                                     getattr(task, "chat_format", "Content-only"), "deepseek", only_metrics=True,
                                     n_keep=getattr(task, "n_keep", cfg.request_defaults.n_keep), n_discard=getattr(task, "n_discard", 0),
                                     generation_prompt=getattr(task, "generation_prompt", ""),
                                     spec_types=cfg.spec_types)
        # llama-server puts params between the prompt counts and next_token
        next_token = d.pop("next_token")
        d["params"], d["next_token"] = settings, next_token
    return json_response(out)


@router.post("/slots/{id_slot}")
async def slot_action(ctx: Ctx, id_slot: str, request: Request) -> Response:
    if not ctx.cfg.slot_save_path:  # llama-server refuses every slot action without it, erase included
        raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
    try:
        slot = int(id_slot)
    except ValueError:
        raise ApiError("Invalid slot ID")
    action = request.query_params.get("action", "")
    body = await read_json(request)
    if action in ("save", "restore"):
        filename = Fields(body).string("filename", "")
        if not valid_slot_filename(filename):
            raise ApiError("Invalid filename")
    elif action == "erase":
        filename = ""
    else:
        raise ApiError("Invalid action")
    try:
        result = await asyncio.to_thread(ctx.engine.slot_action, slot, action, filename)
    except SlotError as e:
        raise ApiError(e.message, e.type, e.code)
    return json_response(result)
