"""Prefix reuse: logits with a reused frontier equal logits without; hit rates on agent-like turns."""

import pytest
import torch

from ninfer_run.engine import EngineConfig, build_engine
from ninfer_run.state import PagedKV, SequenceState


@pytest.fixture(scope="module")
def models(tiny_model):
    return {model_id: tiny_model(model_id) for model_id in ("tiny-qwen3.5", "tiny-qwen3")}


def _cache(model, blocks=64, block_size=16, max_frontiers=32):
    config = EngineConfig(max_context=blocks * block_size, block_size=block_size, max_frontiers=max_frontiers)
    return build_engine(model, config).cache


def _fresh_logits(model, cache, tokens):
    state = SequenceState(kv=PagedKV(cache.pool, cache.layers))
    _, logits = model.forward(torch.tensor(tokens), state)
    state.kv.release()
    return logits


def _turn(model, cache, prompt, reply_len=6):
    """One request: prefill what is not cached, greedy reply, leave a frontier. -> (cached, prefill logits, tokens)."""
    state, cached = cache.start(prompt)
    _, logits = model.forward(torch.tensor(prompt[cached:]), state)
    prefill_logits, tokens = logits, list(prompt)
    for _ in range(reply_len):
        tokens.append(int(logits[-1].argmax()))
        _, logits = model.forward(torch.tensor(tokens[-1:]), state)
    cache.insert(tokens, state)
    return cached, prefill_logits, tokens


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
def test_reuse_gives_the_same_logits_and_reports_cached_tokens(models, model_id):
    model = models[model_id]
    cache = _cache(model)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 512, (37,), generator=g).tolist()
    cached, _, history = _turn(model, cache, prompt)
    assert cached == 0
    follow = history + torch.randint(0, 512, (11,), generator=g).tolist()
    cached, logits, _ = _turn(model, cache, follow)
    assert cached == len(history) == 43
    reference = _fresh_logits(model, cache, follow)[cached:]
    assert float((logits - reference).abs().max()) <= 1e-4 * float(reference.abs().max())  # fp32 noise of other matmul shapes


def test_hybrid_needs_the_frontier_dense_reuses_blocks(models):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 512, (50,), generator=g).tolist()
    diverged = prompt[:40] + torch.randint(0, 512, (9,), generator=g).tolist()
    for model_id, expect in (("tiny-qwen3.5", 0), ("tiny-qwen3", 32)):
        model = models[model_id]
        cache = _cache(model)
        _turn(model, cache, prompt)
        cached, logits, _ = _turn(model, cache, diverged)
        assert cached == expect, model_id  # dense: the 2 full shared blocks of 16; hybrid: no snapshot at 40
        reference = _fresh_logits(model, cache, diverged)[cached:]
        assert float((logits - reference).abs().max()) <= 1e-4 * float(reference.abs().max())  # fp32 noise of other matmul shapes


def test_lru_eviction_frees_blocks_under_pressure(models):
    model = models["tiny-qwen3.5"]
    cache = _cache(model, blocks=12, block_size=16)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):  # each turn holds 3 blocks as a frontier
        cache.make_room(4)
        _turn(model, cache, torch.randint(0, 512, (40,), generator=g).tolist())
    assert len(cache.frontiers) <= 4 and cache.pool.free_blocks + sum(len(f.blocks) for f in cache.frontiers) == 12
    oldest = cache.frontiers[0].tokens
    cache.make_room(cache.pool.free_blocks + 3)
    assert all(f.tokens != oldest for f in cache.frontiers)


def test_agent_session_hit_rate(models, record_property):
    """Five turns, each extending the last prompt + reply: everything but the new text is reused."""
    model = models["tiny-qwen3.5"]
    cache = _cache(model, blocks=64)
    g = torch.Generator().manual_seed(4)
    history = torch.randint(0, 512, (30,), generator=g).tolist()
    for _ in range(5):
        _, _, history = _turn(model, cache, history)
        history = history + torch.randint(0, 512, (8,), generator=g).tolist()
    s = cache.stats
    rate = s.cached_tokens / s.prompt_tokens
    record_property("agent_session_cached_fraction", rate)
    print(f"hit rate: {s.full_hits} of {s.lookups} lookups, {s.cached_tokens}/{s.prompt_tokens} prompt tokens cached ({rate:.0%})")
    assert s.full_hits == 4 and s.misses == 1 and rate > 0.6


def test_an_evicted_frontiers_slab_holds_the_next_snapshot(models):
    """One frontier allowed: each turn's snapshot goes into the slab of the frontier it evicts, and
    resuming from it still gives the logits of a fresh prefill."""
    model = models["tiny-qwen3.5"]
    cache = _cache(model, max_frontiers=1)
    g = torch.Generator().manual_seed(5)
    _turn(model, cache, torch.randint(0, 512, (30,), generator=g).tolist())
    first_slab = cache.frontiers[0].slab
    _, _, history = _turn(model, cache, torch.randint(0, 512, (30,), generator=g).tolist())
    assert len(cache.frontiers) == 1 and cache.slabs.created == 1
    assert cache.frontiers[0].slab.data_ptr() == first_slab.data_ptr()
    follow = history + torch.randint(0, 512, (7,), generator=g).tolist()
    cached, logits, _ = _turn(model, cache, follow)
    assert cached == len(history)
    reference = _fresh_logits(model, cache, follow)[cached:]
    assert float((logits - reference).abs().max()) <= 1e-4 * float(reference.abs().max())
