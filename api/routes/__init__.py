"""The HTTP routes, one module per family, each an `APIRouter` whose handlers take the app's
`ApiContext` (`ctx: Ctx`). `ROUTERS` lists them in registration order (api/server.py)."""
from __future__ import annotations

from api.routes import cors_proxy, embeddings, lora, metrics, native, openai, props, rerank, slots, tokens, ui

ROUTERS = (props.router, tokens.router, native.router, openai.router, embeddings.router, rerank.router, slots.router,
           metrics.router, lora.router, cors_proxy.router)

# the Responses API, the Anthropic Messages API and the token-counting routes (issue 16)
from api.routes import anthropic, responses  # noqa: E402

ROUTERS += (responses.router, anthropic.router, ui.router)  # the web page's catch-all paths last
