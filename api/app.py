"""The llama-server compatible FastAPI application.

`create_app(cfg, engine, log)` builds the app around an `Engine` (runtime/engine.py) that may still
be loading: `Server.ready` stays False (every route answers 503 `Loading model`) until the CLI's
loader thread calls `Server.set_ready()`. Handlers talk to the engine only through plain data:
token ids, `runtime.tasks` dataclasses and dicts.
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import secrets
import string
import struct
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import chat as chat_api
from api import infill as infill_api
from api import metrics as metrics_api
from api.errors import ApiError, context_exceeded, dumps, error_object, invalid_api_key, json_response, \
    loading_model, not_found, not_supported
from api.log import Logger
from api.params import Fields, parse_sampling, parse_task, sampling_settings
from runtime.tasks import CompletionResult, CompletionTask, EmbeddingTask, SamplingParams, TaskError, TokenOut

BUILD_INFO = "b1-tritium"
PUBLIC_PATHS = {"/health", "/v1/health"}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class ServerConfig:
    """Server-side settings (the engine has its own EngineConfig)."""
    model_path: str = ""
    alias: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: list[str] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=lambda: ["*"])
    metrics: bool = False
    slots: bool = True
    props: bool = False
    slot_save_path: str | None = None
    sse_ping_interval: float = 30.0
    embeddings: bool = False
    pooling: str = "mean"
    embd_normalize: int = 2
    jinja: bool = True
    reasoning_format: str = "auto"
    reasoning_budget: int = -1
    enable_thinking: bool | None = None
    n_predict: int = -1
    defaults: SamplingParams = field(default_factory=SamplingParams)

    @property
    def model_name(self) -> str:
        return self.alias or self.model_path


def random_id(n: int = 32) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


class Server:
    """Everything the handlers share: config, engine, log, readiness."""

    def __init__(self, cfg: ServerConfig, engine: Any, log: Logger):
        self.cfg = cfg
        self.engine = engine
        self.log = log
        self.ready = False
        self.load_error: str | None = None

    def set_ready(self) -> None:
        self.ready = True

    # ---- token helpers -------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def piece_text(self, tok: int) -> str:
        return self.tokenizer.piece(tok).decode("utf-8", "ignore")

    def tokenize_prompt(self, prompt: Any) -> list[int]:
        """A /completion prompt: a string, a list of ids, or a list mixing ids and strings
        (`tokenize_mixed`: add_special for the first string piece, special tokens parsed)."""
        tok = self.tokenizer
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

    def split_prompts(self, prompt: Any) -> list[Any]:
        """A `prompt` field that holds several prompts (a list of strings or token lists) -> each one."""
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            if any(isinstance(p, list) for p in prompt) or len(prompt) > 1:
                return list(prompt)
        return [prompt]

    # ---- engine calls --------------------------------------------------------------------
    def check_context(self, n_tokens: int) -> None:
        n_ctx = self.engine.n_ctx_slot
        if n_tokens >= n_ctx:
            raise context_exceeded(n_tokens, n_ctx)

    def submit(self, task: CompletionTask | EmbeddingTask) -> Any:
        return self.engine.submit(task)


# ------------------------------------------------------------------------------------------
# event plumbing
# ------------------------------------------------------------------------------------------

def raise_task_error(err: TaskError) -> None:
    raise ApiError(err.message, err.type, err.code, dict(err.extra))


async def collect(handle: Any) -> tuple[list[TokenOut], Any]:
    """All events of a task: the TokenOut list and the final event (result or embedding)."""
    tokens: list[TokenOut] = []
    done = False
    try:
        async for ev in handle.events():
            if isinstance(ev, TokenOut):
                tokens.append(ev)
                continue
            done = True
            if isinstance(ev, TaskError):
                raise_task_error(ev)
            return tokens, ev
    finally:
        if not done:
            handle.cancel()
    raise ApiError("task ended without a result", "server_error", 500)


class EventPump:
    """Reads a task's events with a deadline, so that a stream can send pings while it waits."""

    def __init__(self, handle: Any):
        self.handle = handle
        self.it = handle.events().__aiter__()
        self.pending: asyncio.Future | None = None
        self.finished = False

    async def next(self, timeout: float | None) -> tuple[bool, Any]:
        """(True, event) or (False, None) when `timeout` seconds passed without one."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.it.__anext__())
        done, _ = await asyncio.wait({self.pending}, timeout=timeout)
        if not done:
            return False, None
        fut, self.pending = self.pending, None
        try:
            ev = fut.result()
        except StopAsyncIteration:
            self.finished = True
            raise ApiError("task ended without a result", "server_error", 500)
        if not isinstance(ev, TokenOut):
            self.finished = True
        return True, ev

    def close(self) -> None:
        if not self.finished:
            self.handle.cancel()
        if self.pending is not None:
            self.pending.cancel()


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode("utf-8", "replace")


async def stream_events(server: Server, handle: Any, on_token, on_final, done_marker: bool) -> Response:
    """SSE response for a generating task. The first event is awaited before the response starts,
    so an error before the first token is an ordinary HTTP error. `on_token(ev)` and
    `on_final(result)` return lists of JSON chunks."""
    pump = EventPump(handle)
    ping = server.cfg.sse_ping_interval if server.cfg.sse_ping_interval > 0 else None
    try:
        got, first = await pump.next(ping)
    except BaseException:
        pump.close()
        raise
    if got and isinstance(first, TaskError):
        pump.close()
        raise_task_error(first)

    async def gen() -> AsyncIterator[bytes]:
        try:
            ev: Any = first
            have = got
            while True:
                if not have:
                    yield b":\n\n"
                else:
                    if isinstance(ev, TokenOut):
                        for chunk in on_token(ev):
                            yield sse(chunk)
                    elif isinstance(ev, TaskError):
                        yield sse({"error": error_object(ev.message, ev.type, ev.code, ev.extra)})
                        return
                    else:
                        for chunk in on_final(ev):
                            yield sse(chunk)
                        if done_marker:
                            yield b"data: [DONE]\n\n"
                        return
                try:
                    have, ev = await pump.next(ping)
                except ApiError as e:
                    yield sse({"error": error_object(e.message, e.type, e.code, e.extra)})
                    return
        except Exception as e:  # an error after the first chunk: one error event, no [DONE]
            yield sse({"error": error_object(str(e), "server_error", 500)})
        finally:
            pump.close()

    return StreamingResponse(gen(), media_type="text/event-stream", headers=SSE_HEADERS)


# ------------------------------------------------------------------------------------------
# response builders
# ------------------------------------------------------------------------------------------

def probs_json(server: Server, toks: list[TokenOut], post_sampling: bool) -> list[dict[str, Any]]:
    """`completion_probabilities` / `logprobs.content` entries."""
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def val(lp: float | None) -> float:
        if lp is None:
            return 0.0
        if post_sampling:
            return math.exp(lp)
        return lp if math.isfinite(lp) else -3.4028234663852886e38

    out = []
    for t in toks:
        piece = server.tokenizer.piece(t.id)
        out.append({
            "id": t.id,
            "token": piece.decode("utf-8", "ignore"),
            "bytes": list(piece),
            key: val(t.logprob),
            top_key: [{"id": p.id, "token": p.token, "bytes": list(p.bytes), key: val(p.logprob)}
                      for p in (t.probs or [])],
        })
    return out


def usage_json(res: CompletionResult) -> dict[str, Any]:
    return {
        "completion_tokens": res.n_decoded,
        "prompt_tokens": res.n_prompt_tokens,
        "total_tokens": res.n_decoded + res.n_prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": res.timings.cache_n},
    }


@dataclass
class NativeRequest:
    """What a native /completion response echoes besides the engine's result."""
    task: CompletionTask
    settings: dict[str, Any]
    prompt_text: str
    n_probs: int
    post_sampling: bool
    index: int = 0


def completion_final_json(server: Server, req: NativeRequest, res: CompletionResult, toks: list[TokenOut],
                          stream: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "index": req.index,
        "content": "" if stream else res.content,
        "tokens": list(res.tokens) if (req.task.return_tokens and not stream) else [],
        "id_slot": res.id_slot,
        "stop": True,
        "model": server.cfg.model_name,
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
        d["completion_probabilities"] = probs_json(server, toks, req.post_sampling)
    return d


def finish_reason(res: CompletionResult, has_tool_calls: bool = False) -> str:
    if res.stop_type in ("eos", "word"):
        return "tool_calls" if has_tool_calls else "stop"
    return "length"


# ------------------------------------------------------------------------------------------
# the app
# ------------------------------------------------------------------------------------------

async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; a parse error is llama-server's 500 server_error."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ApiError(f"[json.exception.parse_error.101] parse error at line {e.lineno}, column {e.colno}: "
                       f"syntax error while parsing value - {e.msg}", "server_error", 500)
    except UnicodeDecodeError as e:
        raise ApiError(f"[json.exception.parse_error.101] parse error: invalid UTF-8: {e}", "server_error", 500)
    if not isinstance(data, dict):
        raise ApiError(f"[json.exception.type_error.302] type must be object, but is {type(data).__name__}",
                       "invalid_request_error", 400)
    return data


# llama-server draws a random marker per process for media placeholders in prompts (none here, but
# clients read the field)
MEDIA_MARKER = "<__media_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32)) + "__>"


def create_app(cfg: ServerConfig, engine: Any, log: Logger | None = None) -> FastAPI:
    server = Server(cfg, engine, log or Logger())
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    # ---- middleware: CORS, loading state, API key (server-http.cpp pre-routing order) -----
    def cors_headers(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is None:
            return {}
        if "*" in cfg.cors_origins or origin in cfg.cors_origins:
            return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true"}
        return {}

    @app.middleware("http")
    async def pre_routing(request: Request, call_next):
        cors = cors_headers(request)
        if request.method == "OPTIONS":
            headers = dict(cors)
            if cors:
                headers.update({"Access-Control-Allow-Methods": "GET, POST",
                                "Access-Control-Allow-Headers": "*"})
            return Response(b"", status_code=200, media_type="text/html", headers=headers)
        if not server.ready:
            resp = loading_model().response()
        elif cfg.api_keys and request.url.path not in PUBLIC_PATHS and not key_ok(request):
            resp = invalid_api_key().response()
        else:
            try:
                resp = await call_next(request)
            except ApiError as e:
                resp = e.response()
        resp.headers["Server"] = "llama.cpp"
        for k, v in cors.items():
            resp.headers[k] = v
        return resp

    def key_ok(request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth.startswith("Bearer ") else request.headers.get("x-api-key", "")
        return any(secrets.compare_digest(key.encode(), k.encode()) for k in cfg.api_keys)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, e: ApiError):
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException):
        if e.status_code in (404, 405):
            return not_found().response()
        return ApiError(str(e.detail), "server_error", e.status_code).response()

    @app.exception_handler(Exception)
    async def on_error(request: Request, e: Exception):
        server.log.srv("E", "operator()", f"got exception: {e!r}")
        return ApiError(str(e) or type(e).__name__, "server_error", 500).response()

    # ---- health, models, props -------------------------------------------------------------
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return json_response({"status": "ok"})

    @app.get("/models")
    @app.get("/v1/models")
    async def models():
        info = dict(server.engine.model_info)
        name = cfg.model_name
        meta = {
            "vocab_type": info.get("vocab_type", 0),
            "n_vocab": info.get("n_vocab", server.tokenizer.n_vocab),
            "n_ctx": server.engine.n_ctx_slot,
            "n_ctx_train": info.get("n_ctx_train", 0),
            "n_embd": info.get("n_embd", 0),
            "n_params": info.get("n_params", 0),
            "size": info.get("size", 0),
        }
        if "ftype" in info:
            meta["ftype"] = info["ftype"]
        return json_response({
            "models": [{
                "name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
                "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                            "parameter_size": "", "quantization_level": ""},
            }],
            "object": "list",
            "data": [{
                "id": name, "aliases": [name], "tags": [], "object": "model", "created": int(time.time()),
                "owned_by": "llamacpp", "meta": meta,
            }],
        })

    @app.get("/props")
    async def props():
        tok = server.tokenizer
        tmpl = server.engine.chat_template
        settings = sampling_settings(cfg.defaults, cfg.n_predict, False, "Content-only", "none", only_metrics=True)
        return json_response({
            "default_generation_settings": {"params": settings, "n_ctx": server.engine.n_ctx_slot},
            "total_slots": server.engine.n_slots,
            "model_alias": cfg.model_name,
            "model_ftype": server.engine.model_info.get("ftype", ""),
            "model_path": cfg.model_path,
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": MEDIA_MARKER,
            "endpoint_slots": cfg.slots,
            "endpoint_props": cfg.props,
            "endpoint_metrics": cfg.metrics,
            "ui": False,  # no web UI is served
            "ui_settings": {},
            "chat_template": chat_api.template_source(tmpl),
            "chat_template_caps": chat_api.template_caps(tmpl),
            "bos_token": chat_api.special_text(tok, tok.bos_id),
            "eos_token": chat_api.special_text(tok, tok.eos_id),
            "build_info": BUILD_INFO,
            "is_sleeping": False,
            "cors_proxy_enabled": False,
        })

    @app.post("/props")
    async def set_props(request: Request):
        if not cfg.props:
            raise not_supported("This server does not support changing global properties. Start it with `--props`")
        await read_json(request)
        return json_response({"success": True})

    # ---- tokenizer and template --------------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await read_json(request)
        f = Fields(body)
        content = body.get("content")
        with_pieces = f.boolean("with_pieces", False)
        toks: list[int] = []
        if content is not None:
            if isinstance(content, str):
                toks = list(server.tokenizer.encode(content, add_special=f.boolean("add_special", False),
                                                    parse_special=f.boolean("parse_special", True)))
            else:
                toks = server.tokenize_prompt(content)
        if not with_pieces:
            return json_response({"tokens": toks})
        out = []
        for t in toks:
            piece = server.tokenizer.piece(t)
            try:
                p: Any = piece.decode("utf-8")
            except UnicodeDecodeError:
                p = list(piece)
            out.append({"id": t, "piece": p})
        return json_response({"tokens": out})

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await read_json(request)
        toks = Fields(body).array("tokens", [])
        n_vocab = server.tokenizer.n_vocab
        for t in toks:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_vocab:
                raise ApiError(f"invalid token id {t!r}")
        # llama-server joins the pieces (tokens_to_str): no SPM leading-space removal
        return json_response({"content": server.tokenizer.decode(toks, remove_leading_space=False) if toks else ""})

    @app.post("/apply-template")
    async def apply_template(request: Request):
        body = await read_json(request)
        prep = chat_api.prepare(server, body)
        return json_response({"prompt": prep.prompt})

    # ---- native completion -------------------------------------------------------------------
    def require_generation() -> None:
        if cfg.embeddings:
            raise not_supported("This server does not support completions. Start it without `--embeddings`")

    def native_request(body: dict[str, Any], prompt_tokens: list[int], index: int = 0) -> NativeRequest:
        params = parse_sampling(body, cfg.defaults, server.tokenizer, server.engine.n_ctx_slot)
        task = parse_task(body, prompt_tokens, params, cfg.n_predict)
        f = Fields(body)
        settings = sampling_settings(params, task.n_predict, task.stream, "Content-only", "none",
                                     only_metrics=False, stop=task.stop, n_keep=task.n_keep,
                                     timings_per_token=f.boolean("timings_per_token", False),
                                     post_sampling_probs=f.boolean("post_sampling_probs", False))
        return NativeRequest(task, settings, server.tokenizer.decode(prompt_tokens), params.n_probs,
                             f.boolean("post_sampling_probs", False), index)

    async def native_stream(req: NativeRequest) -> Response:
        """SSE stream of one native request: a chunk per token, then the final object."""
        handle = server.submit(req.task)
        n_predicted = 0

        def on_token(ev: TokenOut) -> list[dict[str, Any]]:
            nonlocal n_predicted
            n_predicted += 1
            if not ev.text and not req.task.return_tokens and req.n_probs <= 0:
                return []
            # as llama-server b1-0c1e570 streams them: the token id always, the running count
            d: dict[str, Any] = {"index": req.index, "content": ev.text, "tokens": [ev.id],
                                 "stop": False, "id_slot": -1,
                                 "tokens_predicted": n_predicted, "tokens_evaluated": len(req.task.prompt_tokens)}
            if req.n_probs > 0:
                d["completion_probabilities"] = probs_json(server, [ev], req.post_sampling)
            return [d]

        return await stream_events(server, handle, on_token,
                                   lambda res: [completion_final_json(server, req, res, [], True)], False)

    @app.post("/completion")
    @app.post("/completions")
    async def completion(request: Request):
        require_generation()
        body = await read_json(request)
        if "prompt" not in body or body["prompt"] is None:
            raise ApiError('"prompt" must be provided')
        prompts = server.split_prompts(body["prompt"])
        reqs = []
        for i, p in enumerate(prompts):
            toks = server.tokenize_prompt(p)
            server.check_context(len(toks))
            reqs.append(native_request(body, toks, i))
        if reqs[0].task.stream:
            if len(reqs) > 1:
                raise ApiError("streaming is supported for a single prompt only")
            return await native_stream(reqs[0])
        handles = [server.submit(r.task) for r in reqs]
        outs = await asyncio.gather(*(collect(h) for h in handles))
        results = [completion_final_json(server, r, res, toks or res.probs, False) for r, (toks, res) in zip(reqs, outs)]
        return json_response(results[0] if len(results) == 1 else results)

    @app.post("/infill")
    async def infill(request: Request):
        require_generation()
        infill_api.check_model(server.tokenizer.fim_ids)
        body = await read_json(request)
        extra = infill_api.parse_extra(body.get("input_extra"))
        prefix, suffix = body.get("input_prefix", ""), body.get("input_suffix", "")
        if not isinstance(prefix, str) or not isinstance(suffix, str):
            raise ApiError('"input_prefix" and "input_suffix" must be strings')
        prompt = body.get("prompt", "")
        prompt_tokens = [] if prompt in ("", None) else list(server.tokenizer.encode(prompt, add_special=False, parse_special=True)) \
            if isinstance(prompt, str) else server.tokenize_prompt(prompt)
        toks = infill_api.format_infill(server.tokenizer, prefix, suffix, extra, prompt_tokens,
                                        server.engine.cfg.n_batch, cfg.n_predict, server.engine.n_ctx_slot)
        server.check_context(len(toks))
        req = native_request(body, toks, 0)
        if req.task.stream:
            return await native_stream(req)
        toks_out, res = await collect(server.submit(req.task))
        return json_response(completion_final_json(server, req, res, toks_out or res.probs, False))

    # ---- OpenAI text completion -------------------------------------------------------------
    @app.post("/v1/completions")
    async def oai_completion(request: Request):
        require_generation()
        body = await read_json(request)
        if body.get("prompt") is None:
            raise ApiError("'prompt' is required")
        if Fields(body).integer("n", 1) != 1:
            raise ApiError("Only one completion choice is allowed")
        prompts = server.split_prompts(body["prompt"])
        if len(prompts) != 1:
            raise ApiError("Only one prompt is supported")
        toks = server.tokenize_prompt(prompts[0])
        server.check_context(len(toks))
        body = dict(body)
        if body.get("logprobs") is not None:  # OpenAI: logprobs is the number of top candidates
            body["n_probs"] = Fields(body).integer("logprobs", 0)
        params = parse_sampling(body, cfg.defaults, server.tokenizer, server.engine.n_ctx_slot)
        task = parse_task(body, toks, params, cfg.n_predict, openai=True)
        cmpl_id = "chatcmpl-" + random_id()
        model = cfg.model_name

        def base(choice: dict[str, Any]) -> dict[str, Any]:
            return {"choices": [choice], "created": int(time.time()), "model": model,
                    "system_fingerprint": BUILD_INFO, "object": "text_completion", "id": cmpl_id}

        handle = server.submit(task)
        if task.stream:
            def on_token(ev: TokenOut) -> list[dict[str, Any]]:
                if not ev.text:
                    return []
                return [base({"text": ev.text, "index": 0, "logprobs": None, "finish_reason": None})]

            def on_final(res: CompletionResult) -> list[dict[str, Any]]:
                # llama-server b1-0c1e570 puts usage in this last chunk whether or not
                # stream_options.include_usage asks for it, before the id
                d = base({"text": "", "index": 0, "logprobs": None, "finish_reason": finish_reason(res)})
                cid = d.pop("id")
                d["usage"], d["id"] = usage_json(res), cid
                d["timings"] = res.timings.as_dict()
                return [d]

            return await stream_events(server, handle, on_token, on_final, True)
        toks_out, res = await collect(handle)
        logprobs = None
        if params.n_probs > 0:
            logprobs = {"content": probs_json(server, toks_out or res.probs, False)}
        d = base({"text": res.content, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason(res)})
        d["usage"] = usage_json(res)
        d["timings"] = res.timings.as_dict()
        d = {k: d[k] for k in ("choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings")}
        return json_response(d)

    # ---- chat completions -------------------------------------------------------------------
    @app.post("/chat/completions")
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        require_generation()
        body = await read_json(request)
        prep = chat_api.prepare(server, body)
        prompt_tokens = list(server.tokenizer.encode(prep.prompt, add_special=True, parse_special=True))
        server.check_context(len(prompt_tokens))
        params = parse_sampling(prep.body, cfg.defaults, server.tokenizer, server.engine.n_ctx_slot)
        chat_api.apply_grammar(server, prep, params)
        task = parse_task(prep.body, prompt_tokens, params, cfg.n_predict, openai=True)
        cmpl_id = "chatcmpl-" + random_id()
        model = cfg.model_name
        handle = server.submit(task)
        parser = chat_api.ChatOutput(prep)
        if task.stream:
            def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
                return {"choices": choices, "created": int(time.time()), "id": cmpl_id, "model": model,
                        "system_fingerprint": BUILD_INFO, "object": "chat.completion.chunk"}

            started = False

            def on_token(ev: TokenOut) -> list[dict[str, Any]]:
                nonlocal started
                out = []
                if not started:
                    started = True
                    out.append(chunk([{"finish_reason": None, "index": 0,
                                       "delta": {"role": "assistant", "content": None}}]))
                for delta in parser.add(ev.text):
                    c = {"finish_reason": None, "index": 0, "delta": delta}
                    if params.n_probs > 0 and prep.logprobs:
                        c["logprobs"] = {"content": probs_json(server, [ev], False)}
                    out.append(chunk([c]))
                return out

            def on_final(res: CompletionResult) -> list[dict[str, Any]]:
                out = []
                if not started:
                    out.append(chunk([{"finish_reason": None, "index": 0,
                                       "delta": {"role": "assistant", "content": None}}]))
                for delta in parser.finish():
                    out.append(chunk([{"finish_reason": None, "index": 0, "delta": delta}]))
                fin = chunk([{"finish_reason": finish_reason(res, parser.has_tool_calls), "index": 0, "delta": {}}])
                out.append(fin)
                if prep.include_usage:
                    u = chunk([])
                    u["usage"] = usage_json(res)
                    out.append(u)
                out[-1]["timings"] = res.timings.as_dict()
                return out

            return await stream_events(server, handle, on_token, on_final, True)
        toks_out, res = await collect(handle)
        msg = parser.final_message(res.content)
        choice: dict[str, Any] = {"finish_reason": finish_reason(res, bool(msg.get("tool_calls"))),
                                  "index": 0, "message": msg}
        if params.n_probs > 0 and prep.logprobs:
            choice["logprobs"] = {"content": probs_json(server, toks_out or res.probs, False)}
        return json_response({
            "choices": [choice], "created": int(time.time()), "model": model, "system_fingerprint": BUILD_INFO,
            "object": "chat.completion", "usage": usage_json(res), "id": cmpl_id,
            "timings": res.timings.as_dict(),
        })

    # ---- embeddings ----------------------------------------------------------------------------
    def embedding_inputs(body: dict[str, Any], oai: bool) -> list[list[int]]:
        raw = body.get("input") if body.get("input") is not None else body.get("content")
        if raw is None:
            raise ApiError('"input" or "content" must be provided')
        if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw)):
            items: list[Any] = [raw]
        elif isinstance(raw, list):
            items = raw
        else:
            raise ApiError('"input" must be a string, a list of tokens, or a list of strings')
        out = []
        for it in items:
            toks = server.tokenize_prompt(it)
            if not toks:
                raise ApiError("Input content cannot be empty")
            server.check_context(len(toks))
            out.append(toks)
        return out

    async def run_embeddings(body: dict[str, Any], oai: bool) -> tuple[list[list[int]], list[Any]]:
        if not cfg.embeddings:
            raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
        if oai and cfg.pooling == "none":
            raise ApiError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        inputs = embedding_inputs(body, oai)
        normalize = Fields(body).integer("embd_normalize", cfg.embd_normalize)
        handles = [server.submit(EmbeddingTask(t, cfg.pooling, normalize)) for t in inputs]
        outs = await asyncio.gather(*(collect(h) for h in handles))
        return inputs, [res for _, res in outs]

    @app.post("/v1/embeddings")
    async def oai_embeddings(request: Request):
        body = await read_json(request)
        inputs, results = await run_embeddings(body, True)
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, vecs in enumerate(results):
            vec = vecs[0]
            emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
            data.append({"embedding": emb, "index": i, "object": "embedding"})
        n = sum(len(t) for t in inputs)
        return json_response({"model": body.get("model") or cfg.model_name, "object": "list",
                              "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data})

    @app.post("/embedding")
    @app.post("/embeddings")
    async def native_embeddings(request: Request):
        body = await read_json(request)
        _, results = await run_embeddings(body, False)
        return json_response([{"index": i, "embedding": vecs} for i, vecs in enumerate(results)])

    # ---- slots and metrics ---------------------------------------------------------------------
    @app.get("/slots")
    async def slots(request: Request):
        if not cfg.slots:
            raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
        fail = request.query_params.get("fail_on_no_slot", "")
        if fail not in ("", "0", "false") and not server.engine.idle_slot_available():
            raise ApiError("no slot available", "unavailable_error", 503)
        slots = server.engine.slots_info()
        for d in slots:
            task = d.pop("task", None)
            if task is None:
                continue
            params = task.params if isinstance(task, CompletionTask) else cfg.defaults
            settings = sampling_settings(params, getattr(task, "n_predict", -1), getattr(task, "stream", False),
                                         "Content-only", "deepseek", only_metrics=True,
                                         n_keep=getattr(task, "n_keep", 0))
            # llama-server puts params between the prompt counts and next_token
            next_token = d.pop("next_token")
            d["params"], d["next_token"] = settings, next_token
        return json_response(slots)

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request):
        if not cfg.slot_save_path:  # llama-server refuses every slot action without it, erase included
            raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
        try:
            slot = int(id_slot)
        except ValueError:
            raise ApiError("Invalid slot ID")
        action = request.query_params.get("action", "")
        body = await read_json(request)
        if action in ("save", "restore"):
            filename = Fields(body).string("filename", "")
            if not valid_filename(filename):
                raise ApiError("Invalid filename")
        elif action == "erase":
            filename = ""
        else:
            raise ApiError("Invalid action")
        try:
            result = await asyncio.to_thread(server.engine.slot_action, slot, action, filename)
        except Exception as e:  # runtime.engine.SlotError carries (code, message, type)
            if all(hasattr(e, a) for a in ("code", "message", "type")):
                raise ApiError(e.message, e.type, e.code)
            raise
        return json_response(result)

    @app.get("/metrics")
    async def metrics():
        if not cfg.metrics:
            raise not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
        text = metrics_api.render(await asyncio.to_thread(server.engine.metrics))  # waits for a step boundary
        return Response(text.encode(), media_type="text/plain; version=0.0.4")

    return app


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename, reduced: a plain file name inside the save directory."""
    if not name or len(name.encode()) > 255 or name in (".", ".."):
        return False
    if "/" in name or "\\" in name or ".." in name or ":" in name:
        return False
    if name != name.strip() or name.endswith("."):
        return False
    return all(ord(c) >= 0x20 and c not in '<>"|?*' for c in name) and os.path.basename(name) == name
