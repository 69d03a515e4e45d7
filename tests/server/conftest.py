"""Servers on 127.0.0.1 over the tiny hybrid model: a plain one, and one whose output is scripted.

The scripted model is the real tiny model with its logits overridden after the prompt, so the
engine, chat template, parsers and both API dialects run for real while the model "says" a tool
call, a reasoning block or a stop string that random weights would never produce.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest

uvicorn = pytest.importorskip("uvicorn")

from ninfer_format import Artifact  # noqa: E402
from ninfer_run.chat import Chat  # noqa: E402
from ninfer_run.cli import _vision_support  # noqa: E402
from ninfer_run.engine import EngineConfig, build_engine  # noqa: E402
from ninfer_run.loader import load  # noqa: E402
from ninfer_run.server.app import create_app  # noqa: E402

KEY = "sk-test-key"


@contextmanager
def serving(app):
    """Run `app` with uvicorn on a free loopback port; yields the base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


class ScriptedModel:
    """The wrapped model's forward, except that from `prompt_len` on the greedy choice is `script`,
    then <|im_end|>. Positions come from the sequence state, so chunked prefill, prefix reuse and
    speculative verification all see the same script."""

    def __init__(self, model, end_token: int):
        self._model, self._end = model, end_token
        self.script: list[int] = []
        self.prompt_len = 1 << 30

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _script(self, logits, row: int, position: int) -> None:
        """Make the scripted token the argmax of `row`, which predicts the token after `position`."""
        k = position + 1 - self.prompt_len
        if k >= 0:
            logits[row] = -1e4
            logits[row, self.script[k] if k < len(self.script) else self._end] = 1e4

    def forward(self, tokens, state, last_logits=False):
        start = state.length
        hidden, logits = self._model.forward(tokens, state, last_logits)
        logits = logits.clone()
        first = tokens.shape[0] - logits.shape[0]  # the row of logits[0]
        for row in range(logits.shape[0]):
            self._script(logits, row, start + first + row)
        return hidden, logits

    def decode_batch_rows(self, tokens, states):
        starts = [state.length for state in states]
        hidden, logits = self._model.decode_batch_rows(tokens, states)
        logits = logits.clone()
        for row, start in enumerate(starts):
            self._script(logits, row, start)
        return hidden, logits

    def decode_batch(self, tokens, states):
        return self.decode_batch_rows(tokens, states)[1]


def _app(path, model, api_key=None, vision=None, **config):
    chat = Chat.from_artifact(Artifact(path))
    engine = build_engine(model, EngineConfig(**{"max_context": 2048, "max_concurrency": 4, "prefill_chunk": 128,
                                                 **config}), media=vision.media if vision else None)
    stop_ids = tuple(chat.encode("<|im_end|>"))
    return create_app(engine, chat, "tiny", "qwen3_xml", stop_ids, api_key=api_key, vision=vision), engine, chat


@pytest.fixture(scope="module")
def tiny_artifact(packed):
    return packed("tiny-qwen3.5", "int4")


@pytest.fixture(scope="module")
def server(tiny_artifact):
    """(base URL, engine): the tiny model with an API key."""
    app, engine, _ = _app(tiny_artifact, load(tiny_artifact).model, api_key=KEY)
    with serving(app) as base:
        yield base, engine


@pytest.fixture(scope="module")
def make_server(tiny_artifact):
    """make_server(**engine config) -> context manager yielding (base URL, engine), no API key. Its
    model never stops early (a scripted filler), so requests run exactly max_tokens steps."""
    loaded = load(tiny_artifact)
    chat = Chat.from_artifact(loaded.artifact)
    model = ScriptedModel(loaded.model, chat.encode("<|im_end|>")[0])
    model.prompt_len, model.script = 0, chat.encode(" word" * 4096)

    @contextmanager
    def make(**config):
        app, engine, _ = _app(tiny_artifact, model, **config)
        with serving(app) as base:
            yield base, engine

    return make


@pytest.fixture(scope="module")
def scripted(tiny_artifact):
    """(base URL, chat, arm): `arm(prompt_tokens, text)` makes the model answer `text` to that prompt."""
    loaded = load(tiny_artifact)
    chat = Chat.from_artifact(loaded.artifact)
    model = ScriptedModel(loaded.model, chat.encode("<|im_end|>")[0])
    app, _, _ = _app(tiny_artifact, model)

    def arm(prompt_tokens: int, text: str) -> None:
        model.prompt_len, model.script = prompt_tokens, chat.encode(text)

    with serving(app) as base:
        yield base, chat, arm


@pytest.fixture(scope="module")
def vision_server(tiny_artifact):
    """(base URL, engine, media encoder): the tiny model with its vision tower; image URLs allowed."""
    loaded = load(tiny_artifact, vision=True)
    support = _vision_support(loaded, 64, 256, allow_urls=True)
    app, engine, _ = _app(tiny_artifact, loaded.model, vision=support)
    with serving(app) as base:
        yield base, engine, support.media
