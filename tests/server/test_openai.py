"""The OpenAI routes with the official `openai` client, on 127.0.0.1 (tiny model, CPU)."""

import json
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.server.conftest import KEY  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}, "lines": {"type": "integer"}}}}}]
CALL = "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.py\n</parameter>\n" \
       "<parameter=lines>\n40\n</parameter>\n</function>\n</tool_call>"


def _client(base, key=KEY):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def _wait_idle(engine):
    for _ in range(200):
        if not engine.running and not engine.waiting:
            return
        time.sleep(0.05)
    raise AssertionError("the engine did not go idle")


def test_models_and_auth(server):
    base, _ = server
    assert [m.id for m in _client(base).models.list()] == ["tiny"]
    with pytest.raises(openai.AuthenticationError):
        _client(base, "wrong").models.list()
    assert httpx.get(f"{base}/health").json()["status"] == "ok"  # health needs no key


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


def test_legacy_completions(server):
    base, _ = server
    c = _client(base)
    full = c.completions.create(model="tiny", prompt="def main():", max_tokens=10, temperature=0)
    assert full.object == "text_completion" and full.usage.completion_tokens == 10
    assert full.choices[0].finish_reason == "length"
    chunks = list(c.completions.create(model="tiny", prompt="def main():", max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == full.choices[0].text
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    echoed = c.completions.create(model="tiny", prompt="def main():", max_tokens=10, temperature=0, echo=True)
    assert echoed.choices[0].text == "def main():" + full.choices[0].text
    ids = c.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError, match="one prompt per request"):
        c.completions.create(model="tiny", prompt=["a", "b"], max_tokens=3)


def test_errors_are_openai_shaped(server):
    base, _ = server
    c = _client(base)
    with pytest.raises(openai.BadRequestError, match="exceeds the context of 2048 tokens"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x " * 3000}], max_tokens=4)
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=9)
    r = httpx.post(f"{base}/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "robot"}]},
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 422 and r.json()["error"]["param"].startswith("messages.0.role")


def test_disconnect_cancels_and_frees_blocks(server):
    base, engine = server
    stream = _client(base).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go on"}],
                                                   max_tokens=1500, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    _wait_idle(engine)
    frontier_blocks = len({b for f in engine.cache.frontiers for b in f.blocks})  # frontiers may share blocks
    assert engine.cache.pool.num_blocks - engine.cache.pool.free_blocks == frontier_blocks


def test_disconnect_before_the_first_token_cancels_too(make_server):
    """A non-streaming request whose client leaves while it waits for admission is dropped."""
    with make_server(max_concurrency=1) as (base, engine):
        finished = []
        engine.on_finish.append(finished.append)
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        busy = threading.Thread(target=lambda: c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "long"}], max_tokens=300, temperature=0))
        busy.start()
        while not engine.running:
            time.sleep(0.01)
        with pytest.raises(openai.APITimeoutError):
            c.with_options(timeout=0.5).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "queued"}], max_tokens=5)
        busy.join()
        _wait_idle(engine)
        assert sorted(r.finish_reason for r in finished) == ["cancelled", "length"]


def test_queue_full_is_429_and_expiry_is_503(make_server):
    with make_server(max_concurrency=1, max_queued=1, pending_timeout_ms=300) as (base, engine):
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        outcomes = {}

        def ask(name, tokens):
            try:
                c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": name}],
                                          max_tokens=tokens, temperature=0)
                outcomes[name] = "ok"
            except openai.APIStatusError as e:
                outcomes[name] = (e.status_code, e.body["type"], e.message)

        busy = threading.Thread(target=ask, args=("busy", 200))
        busy.start()
        while not engine.running:
            time.sleep(0.01)
        waiting = threading.Thread(target=ask, args=("waiting", 5))
        waiting.start()
        while not engine.waiting:
            time.sleep(0.01)
        ask("refused", 5)
        waiting.join()
        busy.join()
        assert outcomes["busy"] == "ok"
        assert outcomes["refused"][:2] == (429, "rate_limit_error") and "max-queued-requests 1" in outcomes["refused"][2]
        assert outcomes["waiting"][:2] == (503, "server_error") and "expired while waiting" in outcomes["waiting"][2]


def _armed(scripted, messages, text, tools=None, **template_kwargs):
    base, chat, arm = scripted
    arm(len(chat.encode(chat.render(messages, tools=tools, **template_kwargs))), text)
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def test_tool_calls_streaming_and_not(scripted):
    messages = [{"role": "user", "content": "show me main"}]
    c = _armed(scripted, messages, "Let me look.\n\n" + CALL, tools=TOOLS)
    r = c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=200, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
    [call] = choice.message.tool_calls
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "src/main.py", "lines": 40}
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=200,
                                            temperature=0, stream=True))
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [(0, "read_file", {"path": "src/main.py", "lines": 40})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks).strip() == "Let me look."


def test_reasoning_split_and_stop_strings(scripted):
    messages = [{"role": "user", "content": "think first"}]
    c = _armed(scripted, messages, "I should greet.\n</think>\n\nHello there. STOP and more", enable_thinking=True)
    kwargs = dict(model="tiny", messages=messages, max_tokens=100, temperature=0, stop=["STOP"],
                  extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    r = c.chat.completions.create(**kwargs)
    msg = r.choices[0].message
    assert msg.reasoning_content == "I should greet.\n" and msg.content == "Hello there. "
    assert r.choices[0].finish_reason == "stop"
    chunks = list(c.chat.completions.create(stream=True, **kwargs))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Hello there. "
    assert "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks) == "I should greet.\n"
