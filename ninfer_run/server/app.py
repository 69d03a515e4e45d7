"""The ASGI app: routes, API-key check (constant time), OpenAI-shaped errors, /health."""

from __future__ import annotations

import hmac
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..chat import Chat
from ..engine import Engine
from . import openai_api
from .runner import EngineRunner


@dataclass
class ServerState:
    runner: EngineRunner
    chat: Chat
    model_name: str
    tool_style: str
    max_context: int
    stop_token_ids: tuple[int, ...]
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))


def create_app(engine: Engine, chat: Chat, model_name: str, tool_style: str, stop_token_ids: tuple[int, ...],
               api_key: str | None = None) -> FastAPI:
    state = ServerState(EngineRunner(engine), chat, model_name, tool_style, engine.config.max_context,
                        stop_token_ids, api_key)
    @asynccontextmanager
    async def lifespan(_app):
        yield
        state.runner.close()

    app = FastAPI(title="ninfer-run", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.ninfer = state

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if state.api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or \
                request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), state.api_key.encode()):
                return JSONResponse(status_code=401, content={"error": {"message": "invalid or missing API key",
                                                                        "type": "authentication_error",
                                                                        "param": None, "code": "invalid_api_key"}})
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse(status_code=422, content={"error": {
            "message": f"{where or 'request'}: {first.get('msg', 'invalid request')}", "type": "invalid_request_error",
            "param": where or None, "code": None}})

    @app.get("/health")
    async def health():
        c = engine.counters()
        return {"status": "ok", "model": model_name, "pool_used_blocks": c["pool_used_blocks"],
                "pool_blocks": c["pool_blocks"], "queue_depth": c["queue_depth"]}

    app.include_router(openai_api.router(state))
    return app
