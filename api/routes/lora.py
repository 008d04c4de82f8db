"""LoRA adapters: `GET /lora-adapters` (id, path, scale, task_name, prompt_prefix) and
`POST /lora-adapters` (`[{id, scale}]`: the server's scales for new tasks; unlisted adapters go to
0, as llama-server's construct_lora_list). A request may bring its own `lora` (api/params.py)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api import strict_json
from api.context import Ctx
from api.errors import ApiError, json_response
from api.params import Fields, f32

router = APIRouter()


@router.get("/lora-adapters")
async def get_lora_adapters(ctx: Ctx) -> Response:
    return json_response(ctx.engine.lora_adapters())


@router.post("/lora-adapters")
async def post_lora_adapters(ctx: Ctx, request: Request) -> Response:
    raw = await request.body()
    body = strict_json.loads(raw) if raw.strip() else None  # parse errors as llama-server's (api/strict_json.py)
    if not isinstance(body, list):
        raise ApiError("Request body must be an array")
    scales: dict[int, float] = {}
    for entry in body:
        f = Fields(entry if isinstance(entry, dict) else {})
        scales[f.integer("id", -1)] = f32(f.number("scale", 0.0))
    ctx.engine.set_lora(scales)
    return json_response({"success": True})
