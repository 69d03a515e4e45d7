"""A bounded load test on loopback: 16 concurrent clients, 208 requests over both dialects, some
cancelled mid-stream. Every other request completes, the pool drains, and /metrics adds up."""

import random
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

CLIENTS, PER_CLIENT, MAX_TOKENS = 16, 13, 6


def _metrics(base: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return out


def _client_work(base: str, seed: int, done: list, cancelled: list, errors: list) -> None:
    rng = random.Random(seed)
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    an = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    shared = "You are an agent working in a repository. " * 4
    history: list[dict] = []  # the client's chat conversation grows turn by turn: later turns reuse a frontier
    for i in range(PER_CLIENT):
        try:
            kind = rng.choice(["chat", "chat_stream", "completion", "messages", "messages_stream", "cancel"])
            question = f"{shared} task {seed}-{i}"
            if kind == "cancel":  # token-id prompt: its length is known although no usage comes back
                prompt = [rng.randrange(20, 500) for _ in range(rng.randrange(10, 40))]
                stream = oa.completions.create(model="tiny", prompt=prompt, max_tokens=500, stream=True)
                for k, _ in enumerate(stream):
                    if k == 2:
                        break
                stream.close()
                cancelled.append(len(prompt))
            elif kind.startswith("chat"):
                history.append({"role": "user", "content": question})
                kwargs = dict(model="tiny", messages=history, max_tokens=MAX_TOKENS)
                if kind == "chat":
                    r = oa.chat.completions.create(**kwargs)
                    u, answer = r.usage, r.choices[0].message.content
                else:
                    chunks = list(oa.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
                    u, answer = chunks[-1].usage, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                history.append({"role": "assistant", "content": answer})
                done.append((u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens))
            elif kind == "completion":
                r = oa.completions.create(model="tiny", prompt=question, max_tokens=MAX_TOKENS)
                done.append((r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.prompt_tokens_details.cached_tokens))
            else:
                kwargs = dict(model="tiny", messages=[{"role": "user", "content": question}], max_tokens=MAX_TOKENS)
                if kind == "messages":
                    m = an.messages.create(**kwargs)
                else:
                    with an.messages.stream(**kwargs) as s:
                        m = s.get_final_message()
                u = m.usage
                done.append((u.input_tokens + u.cache_read_input_tokens, u.output_tokens, u.cache_read_input_tokens))
        except Exception as e:  # noqa: BLE001 - collected and asserted on below
            errors.append(repr(e))


@pytest.mark.slow
def test_sixteen_clients_two_hundred_requests(make_server):
    with make_server(max_context=4096, max_concurrency=4) as (base, engine):
        done, cancelled, errors = [], [], []
        threads = [threading.Thread(target=_client_work, args=(base, s, done, cancelled, errors)) for s in range(CLIENTS)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        elapsed = time.monotonic() - start
        assert errors == [] and len(done) + len(cancelled) == CLIENTS * PER_CLIENT >= 200
        assert cancelled and all(out == MAX_TOKENS for _, out, _ in done)  # the scripted model never stops early
        for _ in range(200):
            if not engine.running and not engine.waiting:
                break
            time.sleep(0.05)
        assert not engine.running and not engine.waiting
        m = _metrics(base)
        assert m[("ninfer:requests_total", (("finish_reason", "length"),))] == len(done)
        assert m[("ninfer:requests_total", (("finish_reason", "cancelled"),))] == len(cancelled)
        assert m[("vllm:time_to_first_token_seconds_count", ())] == len(done) + len(cancelled)
        assert m[("vllm:prompt_tokens_total", ())] == sum(p for p, _, _ in done) + sum(cancelled)
        generated = m[("vllm:generation_tokens_total", ())]
        assert len(done) * MAX_TOKENS + 3 * len(cancelled) <= generated <= len(done) * MAX_TOKENS + 500 * len(cancelled)
        assert m[("vllm:prefix_cache_hits_total", ())] >= sum(c for _, _, c in done) > 0
        assert m[("vllm:num_requests_running", ())] == 0 and m[("vllm:num_requests_waiting", ())] == 0
        # nothing leaked: what the pool holds is the prefix cache's, and clearing it empties the pool
        pool = engine.cache.pool
        assert pool.num_blocks - pool.free_blocks == len({b for f in engine.cache.frontiers for b in f.blocks})
        engine.cache.clear()
        assert pool.free_blocks == pool.num_blocks
        print(f"{len(done)} completed + {len(cancelled)} cancelled requests in {elapsed:.1f} s")
