"""Google Cloud Platform (Vertex AI) compatibility, as llama-server b1-0c1e570 (server-http.cpp
`register_gcp_compat`): with `AIP_MODE=PREDICTION` in the environment the server listens on
`AIP_HTTP_PORT` (default 8080), answers `AIP_HEALTH_ROUTE` like /health and takes
`POST AIP_PREDICT_ROUTE` (default /predict):

    {"instances": [{"@requestFormat": "chatCompletions", ...request...}, ...]}
 -> {"predictions": [response body, ...]}

`@requestFormat` names a POST route by its camelCase alias (`/v1/chat/completions` ->
`chatCompletions`) or by its path; each instance is run through the app like a request of its own
(same headers, `stream` forced off), concurrently; a failed instance is its error object.
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from api.errors import dumps, error_object

MAX_INSTANCES = 128


@dataclass
class GcpSettings:
    enabled: bool
    path_health: str
    path_predict: str
    port: int


def _path_env(name: str, default: str) -> str:
    v = os.environ.get(name, "")
    if not v:
        return default
    return v if v.startswith("/") else "/" + v


def gcp_settings() -> GcpSettings:
    port = os.environ.get("AIP_HTTP_PORT", "") or "8080"
    return GcpSettings(os.environ.get("AIP_MODE", "") == "PREDICTION", _path_env("AIP_HEALTH_ROUTE", ""),
                       _path_env("AIP_PREDICT_ROUTE", "/predict"), int(port))


def gcp_alias(path: str) -> str:
    """`path_to_gcp_format`: /v1/chat/completions -> chatCompletions."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s[1:] if s.startswith("/") else s
    out, cap = [], False
    for c in s:
        if c == ":" or c == "{":
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def _error(message: str, type: str) -> dict[str, Any]:
    return {"error": error_object(message, type, 400 if type == "invalid_request_error" else 500)}


async def _call(app: FastAPI, request: Request, path: str, body: bytes) -> tuple[int, bytes, str]:
    """One POST through the whole app (middleware included), in process."""
    scope = dict(request.scope)
    scope.update({"path": path, "raw_path": path.encode(), "method": "POST", "query_string": b""})
    sent = False
    status, chunks, ctype = 500, [], ""

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, ctype
        if message["type"] == "http.response.start":
            status = message["status"]
            ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"").decode()
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks), ctype


def register_gcp(app: FastAPI) -> None:
    """Adds the predict (and health) routes when AIP_MODE=PREDICTION."""
    gcp = gcp_settings()
    if not gcp.enabled:
        return
    aliases: dict[str, str] = {}
    paths = set()
    from api.routes import ROUTERS

    for r in [r for router in ROUTERS for r in router.routes]:
        if isinstance(r, APIRoute) and "POST" in r.methods:
            aliases.setdefault(gcp_alias(r.path), r.path)
            paths.add(r.path)

    async def instance(request: Request, inst: Any) -> Any:
        if not isinstance(inst, dict):
            return _error("each instance must be a JSON object", "invalid_request_error")
        fmt = inst.get("@requestFormat")
        if not isinstance(fmt, str):
            return _error("each instance must include a string @requestFormat", "invalid_request_error")
        payload = {k: v for k, v in inst.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # the predict route does not stream
        path = aliases.get(fmt) or (fmt if fmt in paths else None)
        if path is None:
            return _error(f"no handler registered for @requestFormat: {fmt}", "invalid_request_error")
        status, body, ctype = await _call(request.app, request, path, dumps(payload).encode())
        if ctype.startswith("text/event-stream"):
            return _error("predict route does not support streaming responses", "invalid_request_error")
        if not body:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return body.decode("utf-8", "replace")

    async def predict(request: Request) -> Response:
        try:
            data = json.loads(await request.body())
        except ValueError as e:
            return Response(dumps(_error(str(e), "invalid_request_error")).encode(), 400,
                            media_type="application/json; charset=utf-8")
        msg = None
        if not isinstance(data, dict):
            msg = "request body must be a JSON object"
        elif not isinstance(data.get("instances"), list):
            msg = "request body must include an array field named instances"
        elif len(data["instances"]) > MAX_INSTANCES:
            msg = f"instances array exceeds maximum size of {MAX_INSTANCES}"
        if msg is not None:
            return Response(dumps(_error(msg, "invalid_request_error")).encode(), 400,
                            media_type="application/json; charset=utf-8")
        preds = await asyncio.gather(*(instance(request, i) for i in data["instances"]))
        return Response(dumps({"predictions": list(preds)}).encode(), media_type="application/json; charset=utf-8")

    app.add_api_route(gcp.path_predict, predict, methods=["POST"])
    if gcp.path_health:
        async def health() -> Response:
            return Response(b'{"status":"ok"}', media_type="application/json; charset=utf-8")
        app.add_api_route(gcp.path_health, health, methods=["GET"])
