"""Anthropic-compatible routes: /v1/messages (streaming and not) and /v1/messages/count_tokens.

Messages are translated to the chat template's conversation (tool_use -> tool_calls, tool_result ->
tool messages, thinking -> reasoning_content); the output goes through the same parsing as the
OpenAI routes. Usage follows Anthropic's accounting: `input_tokens` are the prompt tokens that were
computed, `cache_read_input_tokens` those reused from the prefix cache.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from ..output_parser import Delta
from ..sampling import SamplingParams
from .generation import ApiError, ChatPrompt, Generation, OutputStream, engine_request, finish_kind, render_chat
from .images import ImageSource, from_base64, from_url, prepare_images

PING_S = 15.0  # a ping event while a long prompt is prefilled, as Anthropic's API sends them
_STOP_REASON = {"tool_calls": "tool_use", "stop_sequence": "stop_sequence", "length": "max_tokens", "stop": "end_turn"}


class TextBlock(BaseModel):
    type: Literal["text"]
    text: str


class ImageBlock(BaseModel):
    type: Literal["image"]
    source: dict[str, Any]


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] | None = None
    is_error: bool | None = None


class ThinkingBlock(BaseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


class Message(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class Thinking(BaseModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class CountTokensRequest(BaseModel):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    metadata: dict[str, Any] | None = None


def _image_source(block: ImageBlock, where: str) -> ImageSource:
    source = block.source
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return from_base64(source["data"])
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return from_url(source["url"])
    raise ApiError(400, f"{where}: image source must be {{type: base64, data}} or {{type: url, url}}", param="messages")


def _content(blocks, where: str, sources: list[ImageSource]) -> str | list[dict]:
    """Text and image blocks -> text, or template items when there are images (sources collected in order)."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    items = []
    for j, b in enumerate(blocks):
        if isinstance(b, ImageBlock):
            sources.append(_image_source(b, f"{where}.{j}"))
            items.append({"type": "image"})
        else:
            items.append({"type": "text", "text": b.text})
    return items if any(item["type"] == "image" for item in items) else "".join(item["text"] for item in items)


def _conversation(req: CountTokensRequest) -> tuple[list[dict], list[ImageSource]]:
    """Anthropic messages -> the chat template's messages, and the images' sources in prompt order."""
    out: list[dict] = []
    sources: list[ImageSource] = []
    if req.system:
        out.append({"role": "system", "content": _content(req.system, "system", sources)})
    for i, m in enumerate(req.messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "user":
            content: list = []
            for j, b in enumerate(blocks):
                if isinstance(b, ToolResultBlock):
                    result = _content(b.content, f"messages.{i}.content.{j}", sources)
                    if b.is_error:
                        result = f"Error: {result}" if isinstance(result, str) else \
                            [{"type": "text", "text": "Error: "}, *result]
                    out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result})
                elif isinstance(b, (TextBlock, ImageBlock)):
                    content.append(b)
                else:
                    raise ApiError(400, f"messages.{i}: a user message cannot hold a {b.type} block", param="messages")
            if content:
                out.append({"role": "user", "content": _content(content, f"messages.{i}.content", sources)})
            continue
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        for b in blocks:
            if isinstance(b, TextBlock):
                msg["content"] += b.text
            elif isinstance(b, ThinkingBlock):
                msg["reasoning_content"] = msg.get("reasoning_content", "") + b.thinking
            elif isinstance(b, ToolUseBlock):
                msg.setdefault("tool_calls", []).append({"id": b.id, "type": "function",
                                                         "function": {"name": b.name, "arguments": b.input}})
            elif not isinstance(b, RedactedThinkingBlock):
                raise ApiError(400, f"messages.{i}: an assistant message cannot hold a {b.type} block",
                               param="messages")
        out.append(msg)
    return out, sources


async def _prompt(state, req: CountTokensRequest) -> ChatPrompt:
    use_tools = req.tools and not (req.tool_choice and req.tool_choice.type == "none")
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}} for t in req.tools] if use_tools else None
    kwargs = {} if req.thinking is None else {"enable_thinking": req.thinking.type != "disabled"}
    messages, sources = _conversation(req)
    return render_chat(state, messages, tools, kwargs, await prepare_images(state.vision, sources))


def _usage(res, output_tokens: int | None = None) -> dict:
    return {"input_tokens": res.prompt_tokens - res.cached_tokens,
            "output_tokens": len(res.tokens) if output_tokens is None else output_tokens,
            "cache_read_input_tokens": res.cached_tokens, "cache_creation_input_tokens": 0}


def _tool_use(call) -> dict:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name, "input": call.arguments}


def _event(kind: str, body: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"


def router(state) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        return {"input_tokens": len((await _prompt(state, req)).tokens)}

    @api.post("/v1/messages")
    async def messages(req: MessagesRequest, http: Request):
        prompt = await _prompt(state, req)
        stops = req.stop_sequences or []
        params = SamplingParams(req.temperature, req.top_p, req.top_k, None)
        gen = Generation(state, engine_request(state, prompt.tokens, req.max_tokens, params, stops, chat=prompt), http)
        await gen.admitted()
        mid = f"msg_{uuid.uuid4().hex[:24]}"
        if req.stream:
            return StreamingResponse(_events(state, prompt, stops, gen, mid), media_type="text/event-stream")
        out = OutputStream(state, stops, prompt.in_reasoning)
        parsed = out.complete(await gen.collect())
        content: list[dict] = []
        if parsed.reasoning:
            content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
        if parsed.content:
            content.append({"type": "text", "text": parsed.content})
        content += [_tool_use(c) for c in parsed.tool_calls]
        return {"id": mid, "type": "message", "role": "assistant", "model": state.model_name, "content": content,
                "stop_reason": _STOP_REASON[finish_kind(gen.result, out)], "stop_sequence": out.text.stop_sequence,
                "usage": _usage(gen.result)}

    return api


class _Blocks:
    """Content blocks as stream events: one block open at a time, a new one when the kind changes."""

    def __init__(self):
        self.index, self.open = -1, None

    def _start(self, block: dict) -> list[str]:
        events = self.close()
        self.index, self.open = self.index + 1, block["type"]
        return [*events, _event("content_block_start", {"index": self.index, "content_block": block})]

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"index": self.index})]

    def delta(self, d: Delta) -> list[str]:
        events = []
        if d.reasoning:
            if self.open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""})
            events.append(_event("content_block_delta", {"index": self.index,
                                                         "delta": {"type": "thinking_delta", "thinking": d.reasoning}}))
        if d.content:
            if self.open != "text":
                events += self._start({"type": "text", "text": ""})
            events.append(_event("content_block_delta", {"index": self.index,
                                                         "delta": {"type": "text_delta", "text": d.content}}))
        for call in d.tool_calls:
            block = _tool_use(call)
            events += self._start({**block, "input": {}})
            events.append(_event("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}}))
            events += self.close()
        return events


async def _events(state, prompt: ChatPrompt, stops: list[str], gen: Generation, mid: str):
    out, blocks = OutputStream(state, stops, prompt.in_reasoning), _Blocks()
    yield _event("message_start", {"message": {
        "id": mid, "type": "message", "role": "assistant", "model": state.model_name, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": _usage(gen.result, output_tokens=0)}})
    yield _event("ping", {})
    try:  # leaving early (client disconnect) closes the generation, which cancels the request
        async for new in gen.tokens(watch_disconnect=False, keepalive_s=PING_S):
            for part in [_event("ping", {})] if new is None else blocks.delta(out.feed(new)):
                yield part
    finally:
        await gen.close()
    if gen.result.finish_reason == "error":
        yield _event("error", {"error": {"type": "overloaded_error",
                                         "message": gen.result.error or "the engine failed the request"}})
        return
    for part in blocks.delta(out.finish()) + blocks.close():
        yield part
    yield _event("message_delta", {"delta": {"stop_reason": _STOP_REASON[finish_kind(gen.result, out)],
                                             "stop_sequence": out.text.stop_sequence}, "usage": _usage(gen.result)})
    yield _event("message_stop", {})
