"""A throwaway request run before the server takes traffic, so that what compiles or is captured on first
use happens at start-up and not inside a user's first time to first token.

What a first request would otherwise pay: Triton compiles the prefill kernels of a first chunk, of a
chunk that attends to earlier KV and of a ragged last chunk (their shapes specialise differently: fla-core's
l2norm kernel autotunes 25 configurations for each bucket of cdiv(tokens x heads, 65536), and a short last
chunk falls in a bucket no full chunk reaches), and the engine captures one sequence's decode (and
speculative) graphs. On a fresh H200 the first 100K prompt of the 27B took 27.4 s with those l2norm
compiles in it against 16.8 s after this warm-up (tools/results/gpu_notes.md, stop 19). Triton keeps its
compiled kernels on disk, so a restart pays much less.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .engine import Engine, Request
from .kv.prefix import PrefixStats
from .spec import SpecStats

RAGGED_TAIL = 17  # tokens of the last prefill chunk (chunks are longer): not a multiple of 16, as most prompts end


@dataclass(frozen=True)
class WarmUp:
    prompt_tokens: int
    new_tokens: int
    seconds: float


def warm_up(engine: Engine, vocab_size: int) -> WarmUp | None:
    """Run two full prefill chunks, a ragged third and a few decode steps through an idle engine, then
    leave no trace: no prefix-cache frontier (its blocks go back to the pool), zeroed prefix-cache and
    speculation statistics (what /metrics reports). A context too small for that takes a shorter prompt;
    None where it has no room for one."""
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
    result = engine.submit(Request(prompt, max_tokens=new_tokens, id="warm-up"))
    engine.run_until_done()
    if result.error is not None:
        raise RuntimeError(f"warm-up request failed: {result.error}")
    engine.cache.clear()
    engine.cache.stats, engine.spec_stats = PrefixStats(), SpecStats()
    return WarmUp(prompt_tokens, len(result.tokens), time.perf_counter() - start)
