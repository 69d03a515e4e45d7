"""The ASGI app: routes of both dialects, API-key check (constant time), errors shaped per dialect,
/health and /metrics."""

from __future__ import annotations

import hmac
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from ..chat import Chat
from ..engine import Engine
from . import anthropic_api, openai_api
from .generation import ApiError, ClientGone
from .images import VisionSupport
from .metrics import CONTENT_TYPE, Metrics
from .runner import EngineRunner

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 422: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    429: "rate_limit_error", 503: "overloaded_error"}


@dataclass
class ServerState:
    runner: EngineRunner
    chat: Chat
    model_name: str
    tool_style: str
    max_context: int
    stop_token_ids: tuple[int, ...]
    api_key: str | None = None
    vision: VisionSupport | None = None  # None: requests with images get HTTP 400
    created: int = field(default_factory=lambda: int(time.time()))


def _anthropic(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


def error_response(request: Request, status: int, message: str, param: str | None = None) -> JSONResponse:
    """{"error": {...}} for OpenAI routes, {"type": "error", "error": {...}} for Anthropic ones."""
    if _anthropic(request):
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return JSONResponse(status_code=status, content={"type": "error", "error": {"type": kind, "message": message}})
    kind = _OPENAI_TYPES.get(status, "server_error")
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param,
                                                                "code": None}})


class _ApiKey:
    """Checks the key (Bearer or x-api-key, constant time) on /v1/ routes before anything else runs.
    Plain ASGI on purpose: Starlette's BaseHTTPMiddleware wraps `receive` so that handlers can no
    longer see a client disconnect while they wait."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if self.key and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            request = Request(scope)
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or \
                request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), self.key.encode()):
                await error_response(request, 401, "invalid or missing API key")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: Engine, chat: Chat, model_name: str, tool_style: str, stop_token_ids: tuple[int, ...],
               api_key: str | None = None, vision: VisionSupport | None = None) -> FastAPI:
    state = ServerState(EngineRunner(engine), chat, model_name, tool_style, engine.config.max_context,
                        stop_token_ids, api_key, vision)
    metrics = Metrics(engine, model_name)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        state.runner.close()

    app = FastAPI(title="ninfer-run", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.ninfer = state

    app.add_middleware(_ApiKey, key=api_key)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        malformed = first.get("type") == "json_invalid"
        message = f"{where or 'request'}: {first.get('msg', 'invalid request')}"
        # OpenAI-compatible servers answer a well-formed body with wrong fields 422; Anthropic's API says 400
        status = 400 if malformed or _anthropic(request) else 422
        return error_response(request, status, message, where or None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(request, exc.status, exc.message, exc.param)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nobody reads it: the request was cancelled

    @app.get("/health")
    async def health():
        c = engine.counters()
        return {"status": "ok", "model": model_name, "pool_used_blocks": c["pool_used_blocks"],
                "pool_blocks": c["pool_blocks"], "queue_depth": c["queue_depth"],
                "running": c["prefilling"] + c["decoding"]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    app.include_router(openai_api.router(state))
    app.include_router(anthropic_api.router(state))
    return app
