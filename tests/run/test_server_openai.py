"""The server with the official `openai` client, on 127.0.0.1 (tiny model, CPU)."""

import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from ninfer_format import Artifact  # noqa: E402
from ninfer_run.chat import Chat  # noqa: E402
from ninfer_run.engine import EngineConfig, build_engine  # noqa: E402
from ninfer_run.loader import load  # noqa: E402
from ninfer_run.server.app import create_app  # noqa: E402

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def server(packed):
    path = packed("tiny-qwen3.5", "int4")
    loaded = load(path)
    chat = Chat.from_artifact(Artifact(path))
    engine = build_engine(loaded.model, EngineConfig(max_context=2048, max_concurrency=4, prefill_chunk=128))
    stop_ids = tuple(chat.encode("<|im_end|>"))
    app = create_app(engine, chat, "tiny", "qwen3_xml", stop_ids, api_key=KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", engine
    srv.should_exit = True
    thread.join(timeout=10)


def _client(base, key=KEY):
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0)


def test_models_and_auth(server):
    base, _ = server
    assert [m.id for m in _client(base).models.list()] == ["tiny"]
    with pytest.raises(openai.AuthenticationError):
        _client(base, "wrong").models.list()


def test_chat_completion_usage_and_cached_tokens(server):
    base, _ = server
    c = _client(base)
    messages = [{"role": "system", "content": "be brief " * 30}, {"role": "user", "content": "hello"}]
    r1 = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert r1.choices[0].finish_reason in ("length", "stop") and r1.usage.completion_tokens <= 8
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    follow = messages + [{"role": "assistant", "content": r1.choices[0].message.content or ""},
                         {"role": "user", "content": "more"}]
    r2 = c.chat.completions.create(model="tiny", messages=follow, max_tokens=4, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens > 0


def test_streaming_matches_non_streaming(server):
    base, _ = server
    c = _client(base)
    messages = [{"role": "user", "content": "count"}]
    full = c.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
    reasoning = "".join((getattr(ch.choices[0].delta, "reasoning_content", None) or "") for ch in chunks if ch.choices)
    assert text == (full.choices[0].message.content or "") and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert reasoning == (getattr(full.choices[0].message, "reasoning_content", None) or "")


def test_errors_are_openai_shaped(server):
    base, _ = server
    c = _client(base)
    with pytest.raises(openai.BadRequestError, match="exceeds the context"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x " * 3000}], max_tokens=4)
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=9)


def test_disconnect_cancels_and_frees_blocks(server):
    base, engine = server
    c = _client(base)
    stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go on"}], max_tokens=1500,
                                       temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    for _ in range(100):
        if not engine.running and not engine.waiting:
            break
        time.sleep(0.05)
    assert not engine.running
    frontier_blocks = len({b for f in engine.cache.frontiers for b in f.blocks})  # frontiers may share blocks
    assert engine.cache.pool.num_blocks - engine.cache.pool.free_blocks == frontier_blocks
