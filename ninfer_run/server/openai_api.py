"""OpenAI-compatible routes: /v1/models and /v1/chat/completions (streaming and not)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from ..chat import TemplateError
from ..engine import Request as EngineRequest
from ..engine import RequestRejected
from ..output_parser import OutputParser, parse_all
from ..sampling import SamplingParams


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param,
                                                                "code": None}})


def _messages(req: ChatRequest) -> list[dict]:
    out = []
    for m in req.messages:
        d = m.model_dump(exclude_none=True)
        if d["role"] == "developer":
            d["role"] = "system"
        if isinstance(d.get("content"), list):
            d["content"] = "".join(part.get("text", "") for part in d["content"] if part.get("type") == "text")
        for call in d.get("tool_calls") or []:
            fn = call.get("function", {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
        out.append(d)
    return out


def router(state) -> APIRouter:
    """`state` carries runner, chat, model name, tool-call style and the context limit."""
    api = APIRouter()

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "ninfer"}]}

    @api.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, http: Request):
        messages = _messages(req)
        tools = req.tools if req.tool_choice != "none" else None
        try:
            prompt_text = state.chat.render(messages, tools=tools)
        except TemplateError as e:
            return _error(400, f"chat template rejected the messages: {e}", param="messages")
        prompt = state.chat.encode(prompt_text)
        # keep a frontier where the generation prompt begins: the next turn shares everything before it
        conversation = state.chat.render(messages, tools=tools, add_generation_prompt=False)
        snapshot = len(state.chat.encode(conversation)) if prompt_text.startswith(conversation) else 0
        max_tokens = req.max_completion_tokens or req.max_tokens or max(1, state.max_context - len(prompt))
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        eng_req = EngineRequest(prompt=prompt, max_tokens=max_tokens, stop_token_ids=state.stop_token_ids,
                                params=SamplingParams(req.temperature, req.top_p, req.top_k, req.seed),
                                stop=(lambda toks: any(s in state.chat.decode(toks[-64:]) for s in stops)) if stops else None,
                                snapshot_at=(snapshot,) if 0 < snapshot < len(prompt) else ())
        in_reasoning = prompt_text.rstrip().endswith("<think>")
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        stream = state.runner.generate(eng_req)
        try:
            first = await stream.__anext__()
        except RequestRejected as e:
            return _error(400, str(e), param="messages")

        def usage(res):
            return {"prompt_tokens": res.prompt_tokens, "completion_tokens": len(res.tokens),
                    "total_tokens": res.prompt_tokens + len(res.tokens),
                    "prompt_tokens_details": {"cached_tokens": res.cached_tokens}}

        def finish_reason(res, saw_tools):
            return "tool_calls" if saw_tools else ("length" if res.finish_reason == "length" else "stop")

        if not req.stream:
            res = first[1]
            async for _ in stream:
                pass
            text = state.chat.decode([t for t in res.tokens if t not in state.stop_token_ids], skip_special_tokens=False)
            for s in stops:
                text = text.split(s, 1)[0]
            parsed = parse_all(text, state.tool_style, in_reasoning)
            message = {"role": "assistant", "content": parsed.content or (None if parsed.tool_calls else "")}
            if parsed.reasoning:
                message["reasoning_content"] = message["reasoning"] = parsed.reasoning
            if parsed.tool_calls:
                message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                          "function": {"name": c.name, "arguments": c.arguments_json}}
                                         for c in parsed.tool_calls]
            return {"id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
                    "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": finish_reason(res, bool(parsed.tool_calls))}],
                    "usage": usage(res)}

        async def events():
            parser = OutputParser(state.tool_style, in_reasoning)
            calls = 0
            res = first[1]

            def chunk(delta, finish=None, with_usage=False):
                body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
                if with_usage:
                    body = {**body, "choices": [], "usage": usage(res)}
                return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

            def render(d):
                nonlocal calls
                out = []
                if d.reasoning:
                    out.append(chunk({"reasoning_content": d.reasoning, "reasoning": d.reasoning}))
                if d.content:
                    out.append(chunk({"content": d.content}))
                for c in d.tool_calls:
                    out.append(chunk({"tool_calls": [{"index": calls, "id": f"call_{uuid.uuid4().hex[:24]}",
                                                      "type": "function",
                                                      "function": {"name": c.name, "arguments": c.arguments_json}}]}))
                    calls += 1
                return out

            yield chunk({"role": "assistant", "content": ""})
            decoded = ""
            all_tokens: list[int] = []
            pending = [first]
            try:  # leaving this block early (client disconnect) closes `stream`, which cancels the request
                while True:
                    new, res = pending.pop() if pending else await stream.__anext__()
                    all_tokens += [t for t in new if t not in state.stop_token_ids]
                    text = state.chat.decode(all_tokens)
                    if text.endswith("\ufffd") and not res.done:  # an incomplete UTF-8 sequence: wait for more
                        continue
                    piece, decoded = text[len(decoded):], text
                    for part in render(parser.feed(piece)):
                        yield part
                    if res.done:
                        break
            except StopAsyncIteration:
                pass
            finally:
                await stream.aclose()
            for part in render(parser.finish()):
                yield part
            yield chunk({}, finish=finish_reason(res, calls > 0))
            if req.stream_options and req.stream_options.include_usage:
                yield chunk({}, with_usage=True)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return api
