"""A throwaway request run before the server takes traffic, so that what compiles or is captured on first
use happens at start-up and not inside a user's first time to first token.

What a first request would otherwise pay: Triton compiles the prefill kernels of a first chunk, of a
chunk that attends to earlier KV and of a ragged last chunk (their shapes specialise differently: fla-core's
l2norm kernel autotunes 25 configurations for each bucket of cdiv(tokens x heads, 65536), and a short last
chunk falls in a bucket no full chunk reaches), and the engine captures one sequence's decode (and
speculative) graphs. On a fresh H200 the first 100K prompt of the 27B took 27.4 s with those l2norm
compiles in it against 16.8 s after this warm-up (tools/results/gpu_notes.md, stop 19). Then an agent's
next turn: the same prompt and reply reused from the prefix cache and RAGGED_TURN new tokens, a ragged
chunk that attends to earlier KV through the dense path, split as the server splits a chat turn at
its generation prompt (a frontier there), so its last few tokens take the paged kernel as a short chunk.
The kernels do not specialise on lengths, so this one turn stands for all: the bench's next turn (2,049
new tokens on a 100K prefix) took 3.3-4.8 s with its compiles (stops 32-33), 0.53 s without (stop 34). Last, with
--max-concurrency C > 1, C short requests at once that finish one step apart, so the decode steps of
C, C - 1, .. 1 sequences are captured (and their kernels compiled) here rather than in the first step
that batches that many. Triton keeps its compiled kernels on disk, so a restart pays much less.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .engine import Engine, Request, Result
from .kv.prefix import PrefixStats
from .spec import SpecStats

RAGGED_TAIL = 17  # tokens of the last prefill chunk (chunks are longer): not a multiple of 16, as most prompts end
# the next turn's new tokens: more than state.DENSE_PREFILL_ROWS (the dense path) and, like RAGGED_TAIL,
# not a multiple of 16
RAGGED_TURN = 2 * 64 + 17
GENERATION_PROMPT = 3  # "<|im_start|>assistant\n": the short chunk after a chat turn's frontier (server/generation.py)


@dataclass(frozen=True)
class WarmUp:
    prompt_tokens: int
    new_tokens: int
    seconds: float
    turn_tokens: int = 0  # the next turn's prompt tokens not reused (0: no room for a next turn)
    turn_cached_tokens: int = 0
    batched: int = 0  # the most sequences decoded together (0: --max-concurrency 1)


def warm_up(engine: Engine, vocab_size: int) -> WarmUp | None:
    """Run two full prefill chunks, a ragged third and a few decode steps through an idle engine, then
    the next turn on that prefix (where the context has room), then leave no trace: no prefix-cache
    frontier (its blocks go back to the pool), zeroed prefix-cache and speculation statistics (what
    /metrics reports). A context too small for that takes a shorter prompt; None where it has no room
    for one."""
    if engine.running or engine.waiting:
        raise RuntimeError("warm_up needs an idle engine (it clears the prefix cache)")
    config = engine.config
    new_tokens = 2 * (config.draft_tokens + 1) + 1  # two decode (or speculative) steps after the first token
    room = config.max_context - new_tokens - config.draft_tokens - 1
    prompt_tokens = min(2 * config.prefill_chunk + RAGGED_TAIL, room)
    if prompt_tokens < 1:
        return None
    prompt = [(7919 * i + 13) % vocab_size for i in range(prompt_tokens)]  # any tokens do: kernels, not text
    start = time.perf_counter()
    [result] = _run(engine, Request(prompt, max_tokens=new_tokens, id="warm-up"))
    follow = prompt + result.tokens + [(7907 * i + 29) % vocab_size for i in range(RAGGED_TURN)]
    turn_tokens = turn_cached = 0
    if len(follow) + 1 + config.draft_tokens <= config.max_context:  # its first token (and a verify's room)
        [turn] = _run(engine, Request(follow, max_tokens=1, id="warm-up turn",
                                      snapshot_at=(len(follow) - GENERATION_PROMPT,)))
        turn_tokens, turn_cached = len(follow) - turn.cached_tokens, turn.cached_tokens
    batched = _batched(engine, vocab_size)
    engine.cache.clear()
    engine.cache.stats, engine.spec_stats = PrefixStats(), SpecStats()
    return WarmUp(prompt_tokens, len(result.tokens), time.perf_counter() - start, turn_tokens, turn_cached, batched)


def _batched(engine: Engine, vocab_size: int) -> int:
    """max_concurrency requests of RAGGED_TAIL tokens together, request i stopping after i + 2 new
    tokens, so every batch size from max_concurrency down to 1 decodes at least one step (plain steps
    give one token each; a speculative one, at most --spec-max-batch sequences, may give more and skip a
    size) -> the most decoded together (0 where there is no room or no concurrency)."""
    config = engine.config
    n = config.max_concurrency
    if n < 2 or RAGGED_TAIL + n + 1 + config.draft_tokens > config.max_context:
        return 0
    _run(engine, *(Request([(7901 * (i + 1) * j + 31) % vocab_size for j in range(RAGGED_TAIL)], max_tokens=i + 2,
                           id=f"warm-up batch {i}") for i in range(n)))
    return n


def _run(engine: Engine, *requests: Request) -> list[Result]:
    """Submit the requests together, run the engine until all are done -> their results (an error raises)."""
    results = [engine.submit(r) for r in requests]
    engine.run_until_done()
    for request, result in zip(requests, results):
        if result.error is not None:
            raise RuntimeError(f"{request.id} request failed: {result.error}")
    return results
