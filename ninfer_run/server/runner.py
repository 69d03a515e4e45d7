"""Drives the engine on one background thread; async handlers submit, stream and cancel through it.

The engine is not thread-safe, so every engine call happens on this thread: submissions and
cancellations are queued, and token updates come back to the event loop through
`call_soon_threadsafe` into a per-request asyncio queue.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator

from ..engine import Engine, Request, RequestRejected, Result


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
        """Yields (new tokens, result so far) until the result is done; cancels if the consumer stops."""
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        sent = 0

        def on_update(res: Result) -> None:
            loop.call_soon_threadsafe(updates.put_nowait, (list(res.tokens), res.done))

        request.on_update = on_update
        submitted: asyncio.Future = loop.create_future()

        def submit() -> None:
            try:
                res = self.engine.submit(request)
                loop.call_soon_threadsafe(submitted.set_result, res)
            except RequestRejected as e:
                loop.call_soon_threadsafe(submitted.set_exception, e)

        self._ops.put(submit)
        result = await submitted
        try:
            while True:
                tokens, done = await updates.get()
                yield tokens[sent:], result
                sent = len(tokens)
                if done:
                    return
        finally:
            if not result.done:  # the client went away: free the sequence now
                self._ops.put(lambda: self.engine.cancel(result.id))
