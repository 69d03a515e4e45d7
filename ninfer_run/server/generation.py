"""What both API dialects share: chat prompts, engine requests, incremental text, the request lifecycle.

Each dialect (openai_api.py, anthropic_api.py) only translates its JSON to and from these pieces, so
prompt rendering, stop strings, reasoning/tool-call parsing, cancellation on disconnect and error
statuses behave identically in both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request as HttpRequest

from ..chat import TemplateError
from ..engine import QueueFull, RequestRejected, Result
from ..engine import Request as EngineRequest
from ..output_parser import Delta, OutputParser, held_prefix, parse_all
from ..sampling import SamplingParams
from ..vision.preprocess import PreparedImage
from ..vision.prompt import MultimodalPrompt, PlaceholderMismatch, cache_key, expand, multimodal_prompt

_POLL_S = 0.25  # how often a waiting handler checks that its client is still connected


class ApiError(Exception):
    """An HTTP error; each dialect renders it in its own error shape."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class ClientGone(Exception):
    """The client disconnected; the request has been cancelled."""


@dataclass
class ChatPrompt:
    tokens: list[int]
    frontier_at: int  # where the generation prompt starts: the next turn shares everything before it
    in_reasoning: bool  # the prompt opened a <think> block
    mm: MultimodalPrompt | None = None  # images: M-RoPE positions (embeddings come at admission)
    key: list[int] | None = None  # the prompt as the prefix cache sees it (images by content)


def render_chat(state, messages: list[dict], tools: list[dict] | None, template_kwargs: dict,
                images: tuple[PreparedImage, ...] = ()) -> ChatPrompt:
    """The conversation through the chat template; each image's placeholder expanded to its tokens."""
    try:
        text = state.chat.render(messages, tools=tools, **template_kwargs)
        conversation = state.chat.render(messages, tools=tools, add_generation_prompt=False, **template_kwargs)
    except TemplateError as e:
        raise ApiError(400, f"chat template rejected the messages: {e}", param="messages") from None
    tokens = state.chat.encode(text)
    frontier = len(state.chat.encode(conversation)) if text.startswith(conversation) else 0
    in_reasoning = text.rstrip().endswith("<think>")
    if not images:
        return ChatPrompt(tokens, frontier if 0 < frontier < len(tokens) else 0, in_reasoning)
    v = state.vision
    try:
        expanded = expand(tokens, v.image_token_id, images, v.merge)
    except PlaceholderMismatch as e:
        raise ApiError(400, f"{e} (the chat template dropped or added images)", param="messages") from None
    before = sum(1 for t in tokens[:frontier] if t == v.image_token_id)
    frontier += sum(image.tokens(v.merge) - 1 for image in images[:before])
    mm = multimodal_prompt(expanded, v.image_token_id, images, v.merge)
    return ChatPrompt(expanded, frontier if 0 < frontier < len(expanded) else 0, in_reasoning, mm,
                      cache_key(expanded, v.image_token_id, images, v.merge))


def engine_request(state, prompt: list[int], max_tokens: int | None, params: SamplingParams, stops: list[str],
                   chat: ChatPrompt | None = None) -> EngineRequest:
    """max_tokens None: up to the end of the context. Stop strings end generation on the decoded tail.
    `chat` carries a chat prompt's images and prefix-cache key."""
    def hit_stop(tokens: list[int]) -> bool:
        tail = state.chat.decode(tokens[-64:])
        return any(s in tail for s in stops)

    return EngineRequest(prompt=prompt, max_tokens=max_tokens or max(1, state.max_context - len(prompt)),
                         params=params, stop_token_ids=state.stop_token_ids, stop=hit_stop if stops else None,
                         snapshot_at=(chat.frontier_at,) if chat and chat.frontier_at else (),
                         mm=chat.mm if chat else None, cache_key=chat.key if chat else None)


class TextStream:
    """Token ids -> text pieces. Decodes through a sliding window so a piece never ends inside a
    UTF-8 character, drops the stop tokens, and holds back text that may be the start of a stop
    string; once a stop string appears, the text is cut before it and `stop_sequence` names it."""

    def __init__(self, decode: Callable[[list[int]], str], stop_token_ids: tuple[int, ...], stops: list[str]):
        self._decode, self._skip, self._stops = decode, set(stop_token_ids), [s for s in stops if s]
        self._ids: list[int] = []
        self._prefix = self._read = 0
        self._held = ""
        self.stop_sequence: str | None = None

    def feed(self, tokens: list[int]) -> str:
        self._ids += [t for t in tokens if t not in self._skip]
        full = self._decode(self._ids[self._prefix :])
        if full.endswith("\ufffd"):  # an incomplete character: wait for the next token
            return ""
        return self._release(self._advance(full), final=False)

    def finish(self) -> str:
        return self._release(self._advance(self._decode(self._ids[self._prefix :])), final=True)

    def _advance(self, full: str) -> str:
        new = full[len(self._decode(self._ids[self._prefix : self._read])) :]
        self._prefix, self._read = self._read, len(self._ids)
        return new

    def _release(self, new: str, final: bool) -> str:
        if self.stop_sequence is not None:
            return ""
        text, self._held = self._held + new, ""
        hits = [(i, s) for s in self._stops if (i := text.find(s)) >= 0]
        if hits:
            i, self.stop_sequence = min(hits)
            return text[:i]
        keep = 0 if final else held_prefix(text, tuple(self._stops))
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]


class OutputStream:
    """Engine tokens -> parsed deltas (reasoning, content, tool calls) for streaming responses.
    `raw=True` (legacy completions) skips the parsing: everything is content."""

    def __init__(self, state, stops: list[str], in_reasoning: bool = False, raw: bool = False):
        self.text = TextStream(state.chat.decode, state.stop_token_ids, stops)
        self._parser = None if raw else OutputParser(state.tool_style, in_reasoning)
        self.saw_tool_calls = False

    def _parse(self, text: str, final: bool) -> Delta:
        if self._parser is None:
            return Delta(content=text)
        delta = self._parser.feed(text)
        if final:
            rest = self._parser.finish()
            delta = Delta(delta.reasoning + rest.reasoning, delta.content + rest.content,
                          delta.tool_calls + rest.tool_calls)
        self.saw_tool_calls |= bool(delta.tool_calls)
        return delta

    def feed(self, tokens: list[int]) -> Delta:
        return self._parse(self.text.feed(tokens), final=False)

    def complete(self, tokens: list[int]) -> Delta:
        """The whole output at once (non-streaming responses)."""
        text = self.text.feed(tokens) + self.text.finish()
        if self._parser is None:
            return Delta(content=text)
        delta = parse_all(text, self._parser.style, self._parser.in_reasoning)
        self.saw_tool_calls = bool(delta.tool_calls)
        return delta

    def finish(self) -> Delta:
        return self._parse(self.text.finish(), final=True)


def finish_kind(result: Result, out: OutputStream) -> str:
    """One of "tool_calls", "stop_sequence", "length", "stop"; each dialect names them its own way."""
    if out.saw_tool_calls:
        return "tool_calls"
    if out.text.stop_sequence is not None:
        return "stop_sequence"
    return "length" if result.finish_reason == "length" else "stop"


class Generation:
    """One engine request as an HTTP handler sees it: submitted, admitted, streamed, and cancelled
    when the client goes away (handlers poll for that; a streaming response is cancelled by Starlette)."""

    def __init__(self, state, request: EngineRequest, http: HttpRequest):
        self._updates = state.runner.generate(request)
        self._http = http
        self._pending: asyncio.Future | None = None
        self.result: Result | None = None

    async def _pull(self, watch_disconnect: bool, tick: float | None = None):
        """The next update; None after `tick` seconds without one."""
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._updates.__anext__())
        waited = 0.0
        while True:
            done, _ = await asyncio.wait({self._pending}, timeout=_POLL_S)
            if done:
                pending, self._pending = self._pending, None
                return pending.result()
            if watch_disconnect and await self._http.is_disconnected():
                await self.close()
                raise ClientGone()
            waited += _POLL_S
            if tick is not None and waited >= tick:
                return None

    async def admitted(self) -> Result:
        """Wait for admission. Errors: 400 (never runnable), 429 (queue full), 503 (expired waiting)."""
        try:
            _, self.result = await self._pull(watch_disconnect=True)
        except RequestRejected as e:
            raise ApiError(400, str(e), param="messages") from None
        except QueueFull as e:
            raise ApiError(429, str(e)) from None
        if self.result.finish_reason == "expired":
            raise ApiError(503, self.result.error or "expired while waiting for admission")
        return self.result

    async def tokens(self, watch_disconnect: bool, keepalive_s: float | None = None) -> AsyncIterator[list[int] | None]:
        """New tokens as they come (None: nothing for keepalive_s seconds) until the result is done."""
        while not self.result.done:
            update = await self._pull(watch_disconnect, keepalive_s)
            if update is None:
                yield None
                continue
            new, self.result = update
            if new:
                yield new

    async def close(self) -> None:
        if self._pending is not None:  # cancelling the pull closes the stream, which cancels the request
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)
            self._pending = None
        await self._updates.aclose()

    async def collect(self) -> list[int]:
        """All tokens (non-streaming responses); ApiError if the engine failed the request."""
        tokens: list[int] = []
        async for new in self.tokens(watch_disconnect=True):
            tokens += new
        if self.result.finish_reason == "error":
            raise ApiError(503, self.result.error or "the engine failed the request")
        return tokens
