"""The Anthropic routes with the official `anthropic` client, on 127.0.0.1 (tiny model, CPU)."""

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")

from tests.server.conftest import KEY  # noqa: E402

TOOLS = [{"name": "read_file", "description": "read a file",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
CALL = "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.py\n</parameter>\n</function>\n</tool_call>"


def _client(base, key=KEY):
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)


def test_message_usage_counts_and_cache_reads(server):
    base, _ = server
    c = _client(base)
    system = "You are a careful coding agent. " * 20
    messages = [{"role": "user", "content": "hello"}]
    count = c.messages.count_tokens(model="tiny", system=system, messages=messages).input_tokens
    r1 = c.messages.create(model="tiny", system=system, messages=messages, max_tokens=8, extra_body={"temperature": 0})
    assert r1.type == "message" and r1.role == "assistant" and r1.stop_reason in ("end_turn", "max_tokens")
    assert r1.usage.input_tokens + r1.usage.cache_read_input_tokens == count
    assert r1.usage.cache_read_input_tokens == 0 and r1.usage.cache_creation_input_tokens == 0
    assert 1 <= r1.usage.output_tokens <= 8
    text = "".join(b.text for b in r1.content if b.type == "text")
    follow = messages + [{"role": "assistant", "content": text or "ok"}, {"role": "user", "content": "and then?"}]
    count2 = c.messages.count_tokens(model="tiny", system=system, messages=follow).input_tokens
    r2 = c.messages.create(model="tiny", system=system, messages=follow, max_tokens=4, extra_body={"temperature": 0})
    assert r2.usage.cache_read_input_tokens > 0
    assert r2.usage.input_tokens + r2.usage.cache_read_input_tokens == count2


def test_stream_events_and_final_message_match_non_streaming(server):
    base, _ = server
    c = _client(base)
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "count to ten"}], max_tokens=12, extra_body={"temperature": 0})
    full = c.messages.create(**kwargs)
    with c.messages.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop")
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in full.content]
    assert final.stop_reason == full.stop_reason and final.usage.output_tokens == full.usage.output_tokens


def test_errors_are_anthropic_shaped(server):
    base, _ = server
    with pytest.raises(anthropic.AuthenticationError):
        _client(base, "wrong").messages.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4)
    c = _client(base)
    with pytest.raises(anthropic.BadRequestError, match="exceeds the context of 2048 tokens"):
        c.messages.create(model="tiny", messages=[{"role": "user", "content": "x " * 3000}], max_tokens=4)
    with pytest.raises(anthropic.BadRequestError, match="vision"):
        c.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    r = httpx.post(f"{base}/v1/messages", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
                   headers={"x-api-key": KEY})
    body = r.json()
    assert r.status_code == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def _armed(scripted, body: dict, text: str):
    """Arm the scripted model for this request (prompt length from count_tokens) and return a client."""
    base, _, arm = scripted
    c = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    arm(c.messages.count_tokens(model="tiny", **body).input_tokens, text)
    return c


def test_tool_use_streaming_and_not(scripted):
    body = {"messages": [{"role": "user", "content": "show me main"}], "tools": TOOLS}
    c = _armed(scripted, body, "Reading it.\n\n" + CALL)
    r = c.messages.create(model="tiny", max_tokens=200, **body)
    assert r.stop_reason == "tool_use"
    assert [b.type for b in r.content] == ["text", "tool_use"] and r.content[0].text == "Reading it."
    assert r.content[1].name == "read_file" and r.content[1].input == {"path": "src/main.py"}
    assert r.content[1].id.startswith("toolu_")
    with c.messages.stream(model="tiny", max_tokens=200, **body) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"path": "src/main.py"}


def test_tool_result_turn_and_thinking(scripted):
    """A full agent turn: tool_use + tool_result history, thinking enabled, answer after reasoning."""
    body = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "tools": TOOLS, "messages": [
        {"role": "user", "content": "what is in main?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "look first", "signature": "s"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                           "input": {"path": "main.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(42)"}]}]}
    c = _armed(scripted, body, "It prints.\n</think>\n\nIt prints 42.")
    r = c.messages.create(model="tiny", max_tokens=100, **body)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == "It prints.\n" and r.content[1].text == "It prints 42."
    assert r.stop_reason == "end_turn"
    with c.messages.stream(model="tiny", max_tokens=100, **body) as stream:
        deltas = {e.delta.type for e in stream if e.type == "content_block_delta"}
        final = stream.get_final_message()
    assert deltas == {"thinking_delta", "text_delta"}
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in r.content]


def test_stop_sequences(scripted):
    body = {"messages": [{"role": "user", "content": "say it"}]}
    c = _armed(scripted, body, "alpha beta ### gamma")
    r = c.messages.create(model="tiny", max_tokens=50, stop_sequences=["###"], **body)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "###"
    assert r.content[0].text == "alpha beta "
    with c.messages.stream(model="tiny", max_tokens=50, stop_sequences=["###"], **body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "alpha beta " and final.stop_sequence == "###"
