"""`GET /metrics` (`--metrics`): the engine's counters and gauges as llama-server's Prometheus
text (rendered by api/metrics.py)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response

from api import metrics as metrics_api
from api.context import Ctx
from api.errors import not_supported

router = APIRouter()


@router.get("/metrics")
async def metrics(ctx: Ctx) -> Response:
    if not ctx.cfg.metrics:
        raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
    values = await asyncio.to_thread(ctx.engine.metrics)  # waits for a step boundary of the engine
    # llama-server sends when its metrics started counting (tritium: Unix seconds)
    headers = {"Process-Start-Time-Unix": str(int(values.get("t_start", 0)))}
    return Response(metrics_api.render(values).encode(), media_type="text/plain; version=0.0.4", headers=headers)
