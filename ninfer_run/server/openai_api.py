"""OpenAI-compatible routes: /v1/models, /v1/chat/completions and /v1/completions (streaming and not)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from ..output_parser import Delta
from ..sampling import SamplingParams
from .generation import ApiError, ChatPrompt, Generation, OutputStream, engine_request, finish_kind, render_chat
from .images import ImageSource, from_url, prepare_images

KEEPALIVE_S = 15.0  # an SSE comment while a long prompt is prefilled, so proxies keep the stream open
_FINISH = {"tool_calls": "tool_calls", "stop_sequence": "stop", "length": "length", "stop": "stop"}


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else (self.stop or [])


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension, e.g. {"enable_thinking": true}


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    suffix: None = None  # fill-in-the-middle is not supported
    logprobs: None = None


def _content(content: list[dict], where: str, sources: list[ImageSource]) -> str | list[dict]:
    """Content parts -> text, or template items when there are images (their sources collected in order)."""
    items = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            items.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            if not isinstance(url, str):
                raise ApiError(400, f"{where}.content.{j}.image_url.url must be a string", param=f"{where}.content")
            sources.append(from_url(url))
            items.append({"type": "image"})
        else:
            raise ApiError(400, f"{where}.content.{j}: unsupported content part type {kind!r} (text, image_url)",
                           param=f"{where}.content")
    if any(item["type"] == "image" for item in items):
        return items
    return "".join(item["text"] for item in items)


def _chat_messages(req: ChatRequest) -> tuple[list[dict], list[ImageSource]]:
    out, sources = [], []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True)
        if d["role"] == "developer":
            d["role"] = "system"
        if isinstance(d.get("content"), list):
            d["content"] = _content(d["content"], f"messages.{i}", sources)
        for call in d.get("tool_calls") or []:
            fn = call.get("function", {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
        out.append(d)
    return out, sources


def _template_kwargs(req: ChatRequest) -> dict:
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("enable_thinking", req.reasoning_effort not in ("none", "minimal"))
    return kwargs


def _usage(res) -> dict:
    return {"prompt_tokens": res.prompt_tokens, "completion_tokens": len(res.tokens),
            "total_tokens": res.prompt_tokens + len(res.tokens),
            "prompt_tokens_details": {"cached_tokens": res.cached_tokens}}


def _tool_call(call, index: int | None = None) -> dict:
    d = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": call.name, "arguments": call.arguments_json}}
    return d if index is None else {"index": index, **d}


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _sse_error(message: str) -> str:
    return _sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})


def router(state) -> APIRouter:
    """`state` is the app's ServerState (runner, chat, model name, tool-call style, context limit)."""
    api = APIRouter()

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "ninfer", "max_model_len": state.max_context}]}

    @api.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, http: Request):
        tools = req.tools if req.tool_choice != "none" else None
        messages, sources = _chat_messages(req)
        images = await prepare_images(state.vision, sources)
        prompt = render_chat(state, messages, tools, _template_kwargs(req), images)
        stops = req.stops()
        gen = Generation(state, engine_request(state, prompt.tokens, req.max_completion_tokens or req.max_tokens,
                                               req.sampling(), stops, chat=prompt), http)
        await gen.admitted()
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if not req.stream:
            return _chat_response(state, prompt, stops, gen, await gen.collect(), rid, created)
        return StreamingResponse(_chat_events(state, req, prompt, stops, gen, rid, created),
                                 media_type="text/event-stream")

    @api.post("/v1/completions")
    async def completions(req: CompletionRequest, http: Request):
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request (n=1): send a string, a list of one string, or token ids",
                               param="prompt")
            prompt = prompt[0]
        tokens = state.chat.encode(prompt) if isinstance(prompt, str) else list(prompt)
        echo = (prompt if isinstance(prompt, str) else state.chat.decode(tokens)) if req.echo else ""
        stops = req.stops()
        gen = Generation(state, engine_request(state, tokens, req.max_tokens, req.sampling(), stops), http)
        await gen.admitted()
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def body(text: str, finish: str | None) -> dict:
            return {"id": rid, "object": "text_completion", "created": created, "model": state.model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

        if not req.stream:
            out = OutputStream(state, stops, raw=True)
            text = out.complete(await gen.collect()).content
            return {**body(echo + text, _FINISH[finish_kind(gen.result, out)]), "usage": _usage(gen.result)}

        async def events():
            out = OutputStream(state, stops, raw=True)
            try:
                if echo:
                    yield _sse(body(echo, None))
                async for new in gen.tokens(watch_disconnect=False, keepalive_s=KEEPALIVE_S):
                    text = out.feed(new).content if new is not None else None
                    if text is None:
                        yield ": keep-alive\n\n"
                    elif text:
                        yield _sse(body(text, None))
            finally:
                await gen.close()
            if gen.result.finish_reason == "error":
                yield _sse_error(gen.result.error or "the engine failed the request")
                return
            yield _sse(body(out.finish().content, _FINISH[finish_kind(gen.result, out)]))
            if req.stream_options and req.stream_options.include_usage:
                yield _sse({**body("", None), "choices": [], "usage": _usage(gen.result)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return api


def _chat_response(state, prompt: ChatPrompt, stops: list[str], gen: Generation, tokens: list[int], rid: str,
                   created: int) -> dict:
    out = OutputStream(state, stops, prompt.in_reasoning)
    parsed = out.complete(tokens)
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or (None if parsed.tool_calls else "")}
    if parsed.reasoning:
        message["reasoning_content"] = message["reasoning"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in parsed.tool_calls]
    return {"id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": _FINISH[finish_kind(gen.result, out)]}],
            "usage": _usage(gen.result)}


async def _chat_events(state, req: ChatRequest, prompt: ChatPrompt, stops: list[str], gen: Generation, rid: str,
                       created: int):
    out = OutputStream(state, stops, prompt.in_reasoning)
    calls = 0

    def chunk(delta: dict, finish: str | None = None) -> str:
        return _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    def render(d: Delta) -> list[str]:
        nonlocal calls
        parts = []
        if d.reasoning:
            parts.append(chunk({"reasoning_content": d.reasoning, "reasoning": d.reasoning}))
        if d.content:
            parts.append(chunk({"content": d.content}))
        for c in d.tool_calls:
            parts.append(chunk({"tool_calls": [_tool_call(c, calls)]}))
            calls += 1
        return parts

    yield chunk({"role": "assistant", "content": ""})
    try:  # leaving early (client disconnect) closes the generation, which cancels the request
        async for new in gen.tokens(watch_disconnect=False, keepalive_s=KEEPALIVE_S):
            if new is None:
                yield ": keep-alive\n\n"
                continue
            for part in render(out.feed(new)):
                yield part
    finally:
        await gen.close()
    if gen.result.finish_reason == "error":
        yield _sse_error(gen.result.error or "the engine failed the request")
        return
    for part in render(out.finish()):
        yield part
    yield chunk({}, finish=_FINISH[finish_kind(gen.result, out)])
    if req.stream_options and req.stream_options.include_usage:
        yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                    "choices": [], "usage": _usage(gen.result)})
    yield "data: [DONE]\n\n"
