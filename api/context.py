"""What every route gets: one `ApiContext` per app (settings, engine, logger, readiness).

`create_app` (api/server.py) stores it as `app.state.server`; a route asks for it with a `Ctx`
parameter (a FastAPI dependency) instead of closing over the app's internals.
"""
from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from typing import Annotated, cast

from fastapi import Depends, Request

from api.engine_api import EngineAPI, TokenizerAPI
from api.log import Logger
from runtime.tasks import SamplingParams

from api.cli_info import BUILD_INFO  # noqa: F401 - re-exported (props)


@dataclass
class RequestDefaults:
    """A request's defaults for the fields the command line sets (--keep, --no-cache-prompt, -r)."""
    n_keep: int = 0
    cache_prompt: bool = True
    stop: list[str] = field(default_factory=list)  # -r/--reverse-prompt: stop strings of every request


@dataclass
class ServerConfig:
    """Server-side settings (the engine has its own EngineConfig)."""
    model_path: str = ""
    alias: str | None = None  # the first of `aliases`
    aliases: list[str] = field(default_factory=list)  # -a/--alias, sorted (llama-server's std::set)
    tags: list[str] = field(default_factory=list)  # --tags, sorted
    host: str = "127.0.0.1"
    hosts: list[str] = field(default_factory=lambda: ["127.0.0.1"])  # every --host address
    port: int = 8080
    api_keys: list[str] = field(default_factory=list)
    cors_origins: str = "*"  # api/cors.py: "*", "localhost" or a value sent as it is
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    ui_mcp_proxy: bool = False  # GET/POST /cors-proxy (api/routes/cors_proxy.py)
    metrics: bool = False
    slots: bool = True
    props: bool = False
    slot_save_path: str | None = None
    sse_ping_interval: float = 30.0
    max_body_size: int = 32 << 20  # bytes; 0 = no limit (api/guard.py)
    read_timeout: float = 3600.0  # --timeout: seconds per chunk of a request body
    shutdown_timeout: float = 5.0  # SIGTERM: seconds running requests get to finish
    embeddings: bool = False
    pooling: str = ""  # --pooling; "" = the model's own (GGUF {arch}.pooling_type, else none)
    embd_normalize: int = 2
    jinja: bool = True
    reasoning_format: str = "auto"
    reasoning_budget: int = -1
    enable_thinking: bool | None = None
    reasoning_budget_message: str = ""
    # --chat-template-kwargs / --reasoning / --reasoning-effort / --reasoning-preserve: the default
    # chat_template_kwargs, each value as JSON text (common_params::default_template_kwargs)
    template_kwargs: dict[str, str] = field(default_factory=dict)
    preserve_reasoning_specified: bool = False
    skip_chat_parsing: bool = False  # --skip-chat-parsing: everything the model writes is content
    prefill_assistant: bool = True  # a final assistant message is continued (--no-prefill-assistant: not)
    spm_infill: bool = False  # /infill puts the suffix first (--spm-infill)
    request_defaults: RequestDefaults = field(default_factory=RequestDefaults)
    ui_settings: dict = field(default_factory=dict)  # --ui-config: /props ui_settings
    n_predict: int = -1
    ui: bool = True  # the web chat page at / (api/routes/ui.py)
    public_path: str = ""  # --path: static files served instead of the built-in page (api/routes/ui.py)
    media_path: str = ""  # --media-path: the folder file:// media URLs may name ("": refused)
    spec_types: str = "none"  # --spec-type as generation_settings' "speculative.types" echo it
    media_marker: str = ""  # LLAMA_MEDIA_MARKER: the media marker ("": drawn at random per app)
    verbose: bool = False  # a request's default "verbose" (its __verbose field): log verbosity > 9, as -v sets
    defaults: SamplingParams = field(default_factory=SamplingParams)

    @property
    def model_name(self) -> str:
        return self.alias or self.model_path


def random_id(n: int = 32) -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


class ApiContext:
    """The server's settings, its engine and its logger, shared by the routes.

    The engine may still be loading when the app starts: the CLI's loader thread attaches it
    (`ctx.engine = ...`) and then calls `set_ready()`. Until then the middleware answers every
    route 503 `Loading model`, so a route always sees an engine.
    """

    def __init__(self, cfg: ServerConfig, engine: EngineAPI | None, log: Logger):
        self.cfg = cfg
        self._engine = engine
        self.log = log
        self.ready = False
        # llama-server draws a random marker for media placeholders in prompts once per server (the
        # text a chat's image / audio part becomes; /completion's multimodal_data prompts name it)
        self.media_marker = cfg.media_marker or "<__media_" + random_id() + "__>"

    @property
    def engine(self) -> EngineAPI:
        return cast(EngineAPI, self._engine)  # None only before ready (see the class docstring)

    @engine.setter
    def engine(self, engine: EngineAPI | None) -> None:
        self._engine = engine

    def set_ready(self) -> None:
        self.ready = True

    @property
    def tokenizer(self) -> TokenizerAPI:
        return self.engine.tokenizer


async def api_context(request: Request) -> ApiContext:
    """The app's ApiContext (a FastAPI dependency; async so that it runs on the event loop)."""
    return request.app.state.server


# a route parameter `ctx: Ctx` receives the ApiContext
Ctx = Annotated[ApiContext, Depends(api_context)]
