"""The reference engine: batching gives the same tokens as single runs; admission, limits, cancel, reuse."""

import pytest
import torch

from ninfer_run.engine import EngineConfig, QueueFull, Request, RequestRejected, build_engine
from ninfer_run.spec import generate_greedy


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("tiny-qwen3.5", "int4")


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _engine(model, max_context=256, clock=None, **kw):
    return build_engine(model, EngineConfig(max_context=max_context, block_size=16, **kw),
                        **({"clock": clock} if clock else {}))


def _prompts(n, seed=0, length=20):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (length + 3 * i,), generator=g).tolist() for i in range(n)]


def test_batched_chunked_results_equal_single_runs(model):
    engine = _engine(model, max_context=512, max_concurrency=2, prefill_chunk=7)
    prompts = _prompts(3)
    results = [engine.submit(Request(p, max_tokens=10)) for p in prompts]
    engine.step()
    assert engine.counters()["queue_depth"] == 1 and len(engine.running) == 2
    engine.run_until_done()
    for p, r in zip(prompts, results):
        assert r.finish_reason == "length" and r.tokens == generate_greedy(model, torch.tensor(p), 10)
    line = results[0].log_line()
    assert line.startswith(f"{results[0].id} prompt=20 cached=0 ttft=") and "decode=" in line and "accept=- out=10" in line


def test_context_limit_is_checked_up_front(model):
    engine = _engine(model, max_context=64)
    with pytest.raises(RequestRejected, match="prompt of 60 tokens \\+ max_tokens 10 = 70 exceeds the context of 64"):
        engine.submit(Request(list(range(60)), max_tokens=10))
    with pytest.raises(RequestRejected, match="empty"):
        engine.submit(Request([], max_tokens=10))


def test_fifo_admission_expires_with_a_clear_error(model):
    clock = FakeClock()
    engine = _engine(model, clock=clock, max_concurrency=1, pending_timeout_ms=500)
    a = engine.submit(Request(_prompts(1)[0], max_tokens=50))
    b = engine.submit(Request(_prompts(1, seed=1)[0], max_tokens=5))
    engine.step()
    clock.t = 0.6
    engine.step()
    assert b.finish_reason == "expired" and "expired while waiting for admission (500 ms)" in b.error
    engine.run_until_done()
    assert a.finish_reason == "length"


def test_admission_queue_is_bounded(model):
    engine = _engine(model, max_concurrency=1, max_queued=2)
    prompts = _prompts(4)
    first = [engine.submit(Request(p, max_tokens=3)) for p in prompts[:2]]
    with pytest.raises(QueueFull, match="2 requests are already waiting"):
        engine.submit(Request(prompts[2], max_tokens=3))
    engine.step()  # one admitted: there is room in the queue again
    late = engine.submit(Request(prompts[3], max_tokens=3))
    engine.run_until_done()
    assert all(r.finish_reason == "length" for r in [*first, late])


def test_cancel_frees_blocks_at_once(model):
    engine = _engine(model, max_concurrency=2)
    a = engine.submit(Request(_prompts(1)[0], max_tokens=100))
    engine.step()
    engine.step()
    used = engine.counters()["pool_used_blocks"]
    assert used > 0
    engine.cancel(a.id)
    assert a.finish_reason == "cancelled" and engine.counters()["pool_used_blocks"] == 0 and not engine.running


def test_stop_tokens_and_stop_callback(model):
    prompt = _prompts(1, seed=3)[0]
    ref = generate_greedy(model, torch.tensor(prompt), 12)
    engine = _engine(model)
    r1 = engine.submit(Request(prompt, max_tokens=12, stop_token_ids=(ref[4],)))
    r2 = engine.submit(Request(prompt, max_tokens=12, stop=lambda toks: len(toks) == 3))
    engine.run_until_done()
    assert r1.finish_reason == "stop" and r1.tokens == ref[: ref.index(ref[4]) + 1]
    assert r2.finish_reason == "stop" and r2.tokens == ref[:3]


def test_follow_up_request_reuses_the_frontier(model):
    engine = _engine(model, max_context=512)
    prompt = _prompts(1, seed=5)[0]
    first = engine.submit(Request(prompt, max_tokens=6))
    engine.run_until_done()
    follow = prompt + first.tokens + [7, 8, 9]
    second = engine.submit(Request(follow, max_tokens=6))
    engine.run_until_done()
    assert second.cached_tokens == len(prompt) + len(first.tokens) - 1
    assert second.tokens == generate_greedy(model, torch.tensor(follow), 6)


def test_mtp_speculative_engine_matches_plain_greedy(model):
    prompts = _prompts(3, seed=11)
    engine = _engine(model, max_context=512, max_concurrency=3, prefill_chunk=9, draft_tokens=2, spec_max_batch=3)
    refs = [generate_greedy(model, torch.tensor(p), 12) for p in prompts]
    results = [engine.submit(Request(p, max_tokens=12)) for p in prompts[:2]]
    results.append(engine.submit(Request(prompts[2], max_tokens=12, stop_token_ids=(refs[2][5],))))
    engine.run_until_done()
    assert results[0].tokens == refs[0] and results[1].tokens == refs[1]
    assert results[2].tokens == refs[2][: refs[2].index(refs[2][5]) + 1] and results[2].finish_reason == "stop"
    assert all(r.drafted > 0 and f"accept={r.accepted / r.drafted:.2f}" in r.log_line() for r in results)
    c = engine.counters()
    assert c["spec_tokens_per_step"] >= 1.0 and 0.0 <= c["spec_acceptance_rate"] <= 1.0
    # the frontier left after a speculative run is consistent: a follow-up reuses it and stays exact
    follow = prompts[0] + results[0].tokens + [1, 2, 3]
    again = engine.submit(Request(follow, max_tokens=5))
    engine.run_until_done()
    assert again.cached_tokens > len(prompts[0]) and again.tokens == generate_greedy(model, torch.tensor(follow), 5)
    assert engine.mtp_pool.free_blocks == engine.mtp_pool.num_blocks  # the MTP head's KV is returned


@pytest.mark.parametrize("graphs", [False, True])
def test_a_full_pool_fails_one_sequence_of_a_batched_step_not_the_engine(model, graphs):
    """Two sequences need a new block in the same step and one is free: the one that cannot have it
    fails with the pool's error; the other goes on, exact."""
    prompts = [p[:20] for p in _prompts(2, seed=17)]  # 2 blocks of 16 each; at 32 tokens both need a third
    engine = _engine(model, max_context=80, max_concurrency=2, cuda_graphs=graphs)  # 5 blocks
    results = [engine.submit(Request(p, max_tokens=16)) for p in prompts]
    engine.run_until_done()
    failed = [r for r in results if r.finish_reason == "error"]
    assert len(failed) == 1 and "KV pool exhausted" in failed[0].error and len(failed[0].tokens) == 13
    ok = next(r for r in results if r.finish_reason == "length")
    alone = _engine(model, max_context=256, cuda_graphs=graphs)  # the same sequence with room to spare
    want = alone.submit(Request(prompts[results.index(ok)], max_tokens=16))
    alone.run_until_done()
    assert ok.tokens == want.tokens


def test_speculation_pauses_beyond_spec_max_batch_and_the_head_catches_up(model, monkeypatch):
    from ninfer_run.spec import MTPDrafter
    from ninfer_run.state import SequenceState

    seen: dict[int, tuple[list, list]] = {}  # per drafter: the hidden rows and tokens it observed, in order
    observe = MTPDrafter.observe

    def spy(self, hidden, next_tokens):
        rows, tokens = seen.setdefault(id(self), ([], []))
        rows.append(hidden.float().clone())
        tokens += next_tokens.tolist()
        return observe(self, hidden, next_tokens)

    monkeypatch.setattr(MTPDrafter, "observe", spy)
    prompts = _prompts(2, seed=13)
    engine = _engine(model, max_context=512, max_concurrency=2, draft_tokens=2, spec_max_batch=1)
    long = engine.submit(Request(prompts[0], max_tokens=16))
    short = engine.submit(Request(prompts[1], max_tokens=4))
    engine.run_until_done()
    assert long.tokens == generate_greedy(model, torch.tensor(prompts[0]), 16) and len(short.tokens) == 4
    assert short.drafted == 0 < long.drafted  # two decoding: both plain; then the long one speculates
    # the long one's head saw every verified position once, in order, the paused ones included
    rows, tokens = next(v for v in seen.values() if v[1][: len(prompts[0]) - 1] == prompts[0][1:])
    sequence = prompts[0] + long.tokens
    assert len(tokens) >= len(prompts[0]) - 1 + 4 and tokens == sequence[1 : len(tokens) + 1]
    want, _ = model.forward(torch.tensor(sequence[: len(tokens)]), SequenceState())
    got = torch.cat(rows)  # the engine's KV is INT8 (~1e-3 away); a row off by one position is ~1 away
    assert float((got - want.float()).norm() / want.float().norm()) < 1e-2
    assert engine.mtp_pool.free_blocks == engine.mtp_pool.num_blocks


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
def test_decode_batch_equals_one_sequence_at_a_time(tiny_model, model_id):
    """decode_batch (one forward, the sequences' rows stacked) gives each sequence the logits and
    the state its own forward would: different lengths, their own KV, conv and recurrent state."""
    from ninfer_run.state import SequenceState

    m = tiny_model(model_id)
    prompts = _prompts(4, seed=5)
    alone, together = [SequenceState() for _ in prompts], [SequenceState() for _ in prompts]
    for p, a, b in zip(prompts, alone, together):
        m.forward(torch.tensor(p), a)
        m.forward(torch.tensor(p), b)
    tokens = torch.tensor([7, 8, 9, 10])
    for _ in range(3):
        want = torch.cat([m.forward(tokens[i : i + 1], s)[1] for i, s in enumerate(alone)])
        got = m.decode_batch(tokens, together)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), float((got - want).abs().max())
        tokens = want.argmax(-1)
    assert [s.length for s in together] == [s.length for s in alone] == [len(p) + 3 for p in prompts]


def test_engine_batched_decode_matches_sequential(model, monkeypatch):
    batch_sizes = []
    decode_batch_rows = model.decode_batch_rows

    def spy(tokens, states):
        batch_sizes.append(len(states))
        return decode_batch_rows(tokens, states)

    monkeypatch.setattr(model, "decode_batch_rows", spy)
    prompts = _prompts(4, seed=9)
    outputs = {}
    for batched in (False, True):
        engine = _engine(model, max_context=1024, max_concurrency=4, batched_decode=batched)
        results = [engine.submit(Request(p, max_tokens=12, stop_token_ids=(5,))) for p in prompts]
        engine.run_until_done()
        outputs[batched] = [(r.tokens, r.finish_reason) for r in results]
    assert outputs[True] == outputs[False]
    assert batch_sizes and max(batch_sizes) == 4  # only the batched engine called it, with all four


def test_decode_batch_refuses_speculative_states(model):
    from ninfer_run.state import SequenceState

    states = [SequenceState(), SequenceState(keep_steps=True)]
    with pytest.raises(ValueError, match="speculative"):
        model.decode_batch(torch.tensor([1, 2]), states)
    assert [s.length for s in states] == [0, 0] and states[0].conv == {}  # refused before any state changed


def test_speculative_engine_keeps_per_token_states_only_in_verify(model, monkeypatch):
    """Per-token GDN states (for the rollback) are kept by the verify forwards alone: a prompt's
    prefill chunks take the chunked path and keep nothing (a 100K prompt would otherwise keep 100K
    states per layer)."""
    from ninfer_run.models import qwen3_5

    calls = []
    rule = qwen3_5.gated_delta_rule

    def spy(*args, keep_steps=False):
        calls.append((args[2].shape[0], keep_steps))
        return rule(*args, keep_steps=keep_steps)

    monkeypatch.setattr(qwen3_5, "gated_delta_rule", spy)
    engine = _engine(model, max_context=1024, draft_tokens=3, prefill_chunk=32)
    result = engine.submit(Request(_prompts(1, seed=4, length=70)[0], max_tokens=8))
    engine.run_until_done()
    assert result.finish_reason == "length"
    kept = [t for t, keep in calls if keep]
    assert kept and max(kept) <= 4  # verify forwards: the last token and up to 3 drafts
    assert {t for t, keep in calls if not keep} == {32, 6}  # the prompt's chunks (70 = 32 + 32 + 6)


@pytest.mark.parametrize("graphs", [False, True])
def test_warm_up_runs_two_chunks_and_a_ragged_one_and_leaves_no_trace(model, graphs):
    """The start-up requests (ninfer_run/warmup.py): 2 chunks + 17 tokens and speculative steps, then the
    next turn reusing that prefix with 145 new tokens (its last 3 a chunk apart), then an engine indistinguishable from a fresh one:
    no frontier, every KV block free, statistics zeroed, and the next request neither reuses anything nor
    decodes differently."""
    from ninfer_run.kv.prefix import PrefixStats
    from ninfer_run.spec import SpecStats
    from ninfer_run.warmup import GENERATION_PROMPT, warm_up

    engine = _engine(model, max_context=512, prefill_chunk=32, draft_tokens=2, cuda_graphs=graphs)
    chunks = []
    forward = engine.model.forward
    engine.model.forward = lambda tokens, *a, **kw: (chunks.append(len(tokens)), forward(tokens, *a, **kw))[1]
    try:
        done = warm_up(engine, model.cfg.vocab_size)
    finally:
        engine.model.forward = forward
    assert (done.prompt_tokens, done.new_tokens) == (2 * 32 + 17, 7)
    assert chunks[:3] == [32, 32, 17]  # the prefill chunks (then the decode and verify forwards)
    # the next turn: prompt + reply reused up to the prefix cache's last full block, the rest prefilled
    assert done.turn_cached_tokens > 2 * 32 and done.turn_tokens + done.turn_cached_tokens == 2 * 32 + 17 + 7 + 145
    # ... split where a chat turn's generation prompt starts, as the server splits it: a short last chunk
    assert chunks[-6:] == [32, 32, 32, 32, done.turn_tokens - 4 * 32 - GENERATION_PROMPT, GENERATION_PROMPT]
    assert not engine.cache.frontiers and engine.cache.pool.free_blocks == engine.cache.pool.num_blocks
    assert engine.mtp_pool.free_blocks == engine.mtp_pool.num_blocks
    assert engine.cache.stats == PrefixStats() and engine.spec_stats == SpecStats()
    prompt = _prompts(1, seed=3)[0]
    result = engine.submit(Request(prompt, max_tokens=6))
    engine.run_until_done()
    assert result.cached_tokens == 0 and result.tokens == generate_greedy(model, torch.tensor(prompt), 6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton compiles on CUDA (its interpreter compiles nothing)")
def test_after_the_warm_up_prompts_and_turns_of_other_lengths_compile_nothing(packed):
    """What the warm-up is for: prompts, their decode and an agent's next turns (split before a short
    generation prompt, as the server splits a chat turn) whose lengths differ from the warm-up's, in
    every divisibility by 16 that Triton specialises integer arguments on unless told not to, use no
    Triton kernel the warm-up did not (each would be a compile inside a first token: the bench's next
    turn took 3.3-4.8 s for 0.3 s of work, stops 32-33)."""
    from ninfer_run.kernels.common import counting_compiles
    from ninfer_run.loader import load
    from ninfer_run.warmup import warm_up

    model = load(packed("tiny-qwen3.5", "nvfp4"), device="cuda", dtype=torch.bfloat16).model
    engine = build_engine(model, EngineConfig(max_context=4096, prefill_chunk=256))
    assert warm_up(engine, model.cfg.vocab_size).turn_tokens > 64
    g = torch.Generator().manual_seed(5)
    with counting_compiles() as compiled:
        for length, new, tail in ((700, 301, 5), (256 + 64 + 16, 1007, 2), (43, 80, 9)):
            prompt = torch.randint(0, 512, (length,), generator=g).tolist()
            first = engine.submit(Request(prompt, max_tokens=4))
            engine.run_until_done()
            follow = prompt + first.tokens + torch.randint(0, 512, (new,), generator=g).tolist()
            turn = engine.submit(Request(follow, max_tokens=4, snapshot_at=(len(follow) - tail,)))
            engine.run_until_done()
            assert first.finish_reason == turn.finish_reason == "length" and turn.cached_tokens > 0
    assert compiled is not None and not compiled, dict(compiled)


def test_warm_up_decodes_every_batch_size_up_to_max_concurrency(model):
    """With --max-concurrency 3 the warm-up ends with 3 short requests finishing a step apart, so the
    graphed decode steps of 3, 2 and 1 sequences exist before the first request (captured on CUDA), and
    the engine is left as fresh: every KV block and GDN slot free, no frontier."""
    from ninfer_run.warmup import warm_up

    engine = _engine(model, max_context=512, prefill_chunk=32, max_concurrency=3, cuda_graphs=True)
    sizes = []
    decode_rows = engine.graphs.decode_rows
    engine.graphs.decode_rows = lambda tokens, states: (sizes.append(len(states)), decode_rows(tokens, states))[1]
    done = warm_up(engine, model.cfg.vocab_size)
    assert done.batched == 3 and sizes[-3:] == [3, 2, 1]
    assert {(3, 1), (2, 1), (1, 1)} <= set(engine.graphs.buckets)
    assert not engine.cache.frontiers and engine.cache.pool.free_blocks == engine.cache.pool.num_blocks
    assert len(engine.graphs.free_slots) == 3 and not engine.running and not engine.waiting
    assert warm_up(_engine(model, max_context=512, prefill_chunk=32), model.cfg.vocab_size).batched == 0


def test_warm_up_fits_the_context_or_is_skipped(model):
    from ninfer_run.warmup import warm_up

    engine = _engine(model, max_context=40, prefill_chunk=16)  # room for 40 - 3 - 1 = 36 prompt tokens
    done = warm_up(engine, model.cfg.vocab_size)
    assert (done.prompt_tokens, done.turn_tokens) == (36, 0)  # and none for a next turn
    assert warm_up(_engine(model, max_context=4, prefill_chunk=16), model.cfg.vocab_size) is None
    busy = _engine(model, max_context=256)
    busy.submit(Request(_prompts(1)[0], max_tokens=4))
    with pytest.raises(RuntimeError, match="idle engine"):
        warm_up(busy, model.cfg.vocab_size)


def _spy_decode_rows(engine):
    """Counts the graphed steps whose tokens came from the device (the step before, unread by the host)."""
    fed = []
    decode_rows = engine.graphs.decode_rows
    engine.graphs.decode_rows = lambda tokens, states: (fed.append(isinstance(tokens, torch.Tensor)),
                                                        decode_rows(tokens, states))[1]
    return fed


def test_overlapped_steps_give_the_tokens_of_steps_read_one_by_one(model):
    """Graphed steps launched before the host reads the last one's tokens give the same tokens and
    finish reasons: a batch that shrinks as runs end by length, by a stop token the host reads a step
    late and by a stop callback, and a sampled run joining it."""
    from ninfer_run.sampling import SamplingParams

    prompts = _prompts(5, seed=21)
    ref = generate_greedy(model, torch.tensor(prompts[1]), 9)
    requests = [dict(max_tokens=7), dict(max_tokens=9, stop_token_ids=(ref[5],)),
                dict(max_tokens=12, stop=lambda toks: len(toks) == 4), dict(max_tokens=16),
                dict(max_tokens=6, params=SamplingParams(temperature=0.8, seed=3))]
    outputs, fed = {}, {}
    for overlap in (False, True):
        engine = _engine(model, max_context=1024, max_concurrency=3, cuda_graphs=True, overlap_steps=overlap)
        fed[overlap] = _spy_decode_rows(engine)
        results = [engine.submit(Request(p, **kw)) for p, kw in zip(prompts, requests)]
        engine.run_until_done()
        outputs[overlap] = [(r.tokens, r.finish_reason) for r in results]
        assert engine._launched is None and not engine.running
    assert outputs[True] == outputs[False]
    assert outputs[True][1] == (ref[: ref.index(ref[5]) + 1], "stop")
    assert sum(fed[True]) >= 8 and not any(fed[False])  # steps fed from the device, only when overlapping


def test_sampled_runs_overlap_and_draw_as_steps_read_one_by_one(model):
    """Sampled runs (seeded; top-k, top-p) are drawn on the device and fed to the next step from there,
    with the tokens each seed gives when every step is read first."""
    from ninfer_run.sampling import SamplingParams

    params = [SamplingParams(temperature=0.9, top_k=20, seed=5), SamplingParams(temperature=0.7, top_p=0.8, seed=6)]
    outputs, fed = {}, {}
    for overlap in (False, True):
        engine = _engine(model, max_context=1024, max_concurrency=2, cuda_graphs=True, overlap_steps=overlap)
        fed[overlap] = _spy_decode_rows(engine)
        results = [engine.submit(Request(p, max_tokens=10, params=q)) for p, q in zip(_prompts(2, seed=8), params)]
        engine.run_until_done()
        outputs[overlap] = [r.tokens for r in results]
    assert outputs[True] == outputs[False] and outputs[True][0] != outputs[True][1]
    assert sum(fed[True]) >= 6 and not any(fed[False])


def test_a_stop_read_a_step_late_leaves_a_frontier_with_the_stop_token(model):
    """The stop token was fed before the host saw it: the frontier holds the whole output and a next
    turn over it reuses all of it, exactly. An end by length is known ahead: no step past it."""
    prompt = _prompts(1, seed=23)[0]
    ref = generate_greedy(model, torch.tensor(prompt), 8)
    engine = _engine(model, max_context=512, cuda_graphs=True)
    engine.submit(Request(prompt[:-1], max_tokens=6))
    engine.run_until_done()
    assert [len(f.tokens) for f in engine.cache.frontiers] == [len(prompt) - 1 + 5]  # the last token unfed
    first = engine.submit(Request(prompt, max_tokens=8, stop_token_ids=(ref[4],)))
    engine.run_until_done()
    assert first.finish_reason == "stop" and first.tokens == ref[: ref.index(ref[4]) + 1]
    follow = prompt + first.tokens + [7, 8, 9]
    second = engine.submit(Request(follow, max_tokens=5))
    engine.run_until_done()
    assert second.cached_tokens == len(prompt) + len(first.tokens)
    fresh = _engine(model, max_context=512, cuda_graphs=True, overlap_steps=False)
    want = fresh.submit(Request(follow, max_tokens=5))  # the whole prompt prefilled, nothing reused
    fresh.run_until_done()
    assert want.cached_tokens == 0 and second.tokens == want.tokens


def test_a_cancel_between_overlapped_steps_loses_nothing_of_the_others(model):
    prompts = _prompts(2, seed=25)
    engine = _engine(model, max_context=512, max_concurrency=2, cuda_graphs=True)
    fed = _spy_decode_rows(engine)
    a, b = (engine.submit(Request(p, max_tokens=10)) for p in prompts)
    while len(b.tokens) < 4:
        engine.step()
    assert engine._launched is not None and fed[-1]  # a step is in flight, fed from the device
    engine.cancel(a.id)
    engine.run_until_done()
    want = [generate_greedy(model, torch.tensor(p), 10) for p in prompts]
    assert a.finish_reason == "cancelled" and a.tokens == want[0][: len(a.tokens)]
    assert b.finish_reason == "length" and b.tokens == want[1]
    frontier_blocks = sum(len(f.blocks) for f in engine.cache.frontiers)
    assert engine.counters()["pool_used_blocks"] == frontier_blocks  # a's blocks went back to the pool


def test_a_batch_of_the_same_size_but_other_runs_is_not_fed_the_last_ones_tokens(model):
    """A stops on tokens read a step late just as C's prefill ends: the next batch, [B, C], is as large
    as the launched [A, B] but must be fed B's and C's own tokens."""
    g = torch.Generator().manual_seed(27)
    # A and B: three chunks of 8, C: five, so C's first token comes in the step that reads A's stop
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (20, 20, 36)]
    requests = [dict(max_tokens=9, stop=lambda toks: len(toks) == 2), dict(max_tokens=8), dict(max_tokens=6)]
    outputs = {}
    for overlap in (False, True):
        engine = _engine(model, max_context=1024, max_concurrency=3, prefill_chunk=8, cuda_graphs=True,
                         overlap_steps=overlap)
        batches = []
        decode_rows = engine.graphs.decode_rows
        engine.graphs.decode_rows = lambda tokens, states: (batches.append([id(s) for s in states]),
                                                            decode_rows(tokens, states))[1]
        results = [engine.submit(Request(p, **kw)) for p, kw in zip(prompts, requests)]
        engine.run_until_done()
        outputs[overlap] = [(r.tokens, r.finish_reason) for r in results]
    assert any(len(a) == len(b) == 2 and a != b for a, b in zip(batches, batches[1:]))  # the case arose
    assert outputs[True] == outputs[False]
