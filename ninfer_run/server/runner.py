"""Drives the engine on one background thread; async handlers submit, stream and cancel through it.

The engine is not thread-safe, so every engine call happens on this thread: submissions and
cancellations are queued, and token updates come back to the event loop through
`call_soon_threadsafe` into a per-request asyncio queue.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import AsyncIterator

from ..engine import Engine, QueueFull, Request, RequestRejected, Result


class EngineRunner:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._ops: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            busy = self.engine.waiting or self.engine.running
            try:
                op = self._ops.get(timeout=0 if busy else 0.05)
            except queue.Empty:
                op = None
            if op is not None:
                op()
                continue
            if busy:
                self.engine.step()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    async def generate(self, request: Request) -> AsyncIterator[tuple[list[int], Result]]:
        """Yields (new tokens, result) once when the request is admitted (no tokens yet), then after
        each step that produced tokens, until the result is done. Raises RequestRejected/QueueFull
        from submission. If the consumer stops early (client gone), the request is cancelled and its
        KV blocks freed on the engine thread."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        request.id = request.id or f"req-{uuid.uuid4().hex[:16]}"
        forwarded = 0  # engine thread only

        def on_update(res: Result) -> None:
            nonlocal forwarded
            new, forwarded = res.tokens[forwarded:], len(res.tokens)
            loop.call_soon_threadsafe(updates.put_nowait, (new, res))

        def submit() -> None:
            try:
                self.engine.submit(request)
            except (RequestRejected, QueueFull) as e:
                loop.call_soon_threadsafe(updates.put_nowait, e)

        request.on_update = on_update
        self._ops.put(submit)
        finished = False
        try:
            while not finished:
                item = await updates.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                new, result = item
                finished = result.done
                yield new, result
        finally:
            if not finished:  # the consumer went away: free the sequence now (a no-op if it just ended)
                self._ops.put(lambda: self.engine.cancel(request.id))
