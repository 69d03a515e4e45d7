"""Prefix reuse: finished sequences leave a frontier (KV blocks + GDN state snapshot) for later ones.

A new prompt that extends a resident frontier's tokens starts from the frontier instead of
prefilling them. Hybrid models can resume only exactly at a frontier (recurrent state exists only
where a snapshot was taken), so a prompt that diverges earlier gets no hit there; pure-attention
models also reuse the full KV blocks of any shared prefix. Unlike vLLM's align mode, a miss on the
recurrent side never throws away attention hits of other frontiers, and the frontier is taken at the
very end of each request (prompt + response), which is what an agent's next turn extends.
Frontiers are evicted LRU when the pool needs blocks. Full blocks are shared (refcounted) and never
written again; the partial last block is copied for the new sequence (copy on write).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from ..state import PagedKV, SequenceState
from .host_slabs import HostSlabs
from .pool import BlockPool, PoolExhausted


@dataclass
class Frontier:
    tokens: tuple[int, ...]
    blocks: list[int]
    conv: dict[int, torch.Tensor]
    recurrent: dict[int, torch.Tensor]
    slab: torch.Tensor  # the host slab `conv` and `recurrent` lie in
    last_used: int = 0


@dataclass
class PrefixStats:
    lookups: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    full_hits: int = 0  # whole frontier reused
    partial_hits: int = 0  # attention-only block reuse
    misses: int = 0


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class PrefixCache:
    pool: BlockPool
    layers: dict[int, int]  # model KV layer key -> pool layer
    recurrent_layers: bool  # the model has GDN layers: resume only at frontiers
    max_frontiers: int = 64
    frontiers: list[Frontier] = field(default_factory=list)
    stats: PrefixStats = field(default_factory=PrefixStats)
    _clock: itertools.count = field(default_factory=itertools.count)
    slabs: HostSlabs = field(init=False)

    def __post_init__(self) -> None:
        self.slabs = HostSlabs(self.max_frontiers, self.pool.k.device)

    def insert(self, tokens: list[int], state: SequenceState) -> None:
        """Keep the finished sequence's state as a frontier (the cache takes over its blocks)."""
        if not isinstance(state.kv, PagedKV) or state.length != len(tokens):
            raise ValueError("a frontier needs paged KV covering exactly its tokens")
        keep = -(-len(tokens) // self.pool.layout.block_size)
        self.pool.release(state.kv.blocks[keep:])
        self._add(tokens, state.kv.blocks[:keep], state)
        state.kv.blocks = []

    def snapshot(self, tokens: list[int], state: SequenceState) -> None:
        """Keep a frontier at this point of a running sequence, which goes on using its blocks: the
        frontier shares (retains) them. Safe because a sequence never rewrites positions it already
        holds, and whoever resumes from the frontier copies its partial last block."""
        if not isinstance(state.kv, PagedKV) or state.length != len(tokens):
            raise ValueError("a snapshot needs paged KV covering exactly its tokens")
        if any(f.tokens == tuple(tokens) for f in self.frontiers):
            return
        blocks = state.kv.blocks[: -(-len(tokens) // self.pool.layout.block_size)]
        self.pool.retain(blocks)
        self._add(tokens, list(blocks), state)

    def _add(self, tokens: list[int], blocks: list[int], state: SequenceState) -> None:
        """A frontier owning `blocks` (one reference each) and a copy of the state's GDN snapshot, kept in
        host memory (147 MiB a snapshot on the 27B: the GPU's memory is for weights and KV; memory.py
        plans them there). The least recently used frontier goes first, so its slab takes the copy."""
        while len(self.frontiers) >= self.max_frontiers and self._evict_one():
            pass
        if self.max_frontiers < 1:
            self.pool.release(blocks)
            return
        conv, recurrent, slab = self.slabs.snapshot(state.conv, state.recurrent)
        self.frontiers.append(Frontier(tuple(tokens), blocks, conv, recurrent, slab, next(self._clock)))

    def _evict_one(self) -> bool:
        if not self.frontiers:
            return False
        victim = min(self.frontiers, key=lambda f: f.last_used)
        self.frontiers.remove(victim)
        self.pool.release(victim.blocks)
        self.slabs.give_back(victim.slab)
        return True

    def clear(self) -> None:
        """Drop every frontier; their blocks go back to the pool."""
        while self._evict_one():
            pass

    def make_room(self, blocks: int) -> None:
        """Evict LRU frontiers until `blocks` are free (PoolExhausted if even an empty cache is not enough)."""
        while self.pool.free_blocks < blocks:
            if not self._evict_one():
                raise PoolExhausted(f"KV pool exhausted: need {blocks} blocks, {self.pool.free_blocks} free, nothing to evict")

    def start(self, prompt: list[int]) -> tuple[SequenceState, int]:
        """A state for `prompt` that already holds the longest reusable prefix; returns (state, cached)."""
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(prompt)
        bs = self.pool.layout.block_size
        best, best_len, full = None, 0, False
        for f in self.frontiers:
            common = _common_prefix(f.tokens, prompt)
            if common == len(f.tokens) and common < len(prompt):
                usable, is_full = common, True
            elif not self.recurrent_layers:
                usable, is_full = min(common, len(prompt) - 1) // bs * bs, False
            else:
                continue
            if usable > best_len:
                best, best_len, full = f, usable, is_full
        state = SequenceState(kv=PagedKV(self.pool, self.layers))
        if best is None or best_len == 0:
            self.stats.misses += 1
            return state, 0
        best.last_used = next(self._clock)
        whole = best_len // bs
        shared = best.blocks[:whole]
        self.pool.retain(shared)
        state.kv.blocks = list(shared)
        if best_len % bs:  # copy on write: the new sequence will append into this block
            self.make_room(1)
            (fresh,) = self.pool.allocate(1)
            self.pool.copy_block(best.blocks[whole], fresh)
            state.kv.blocks.append(fresh)
        if full:
            state.conv, state.recurrent = self.slabs.restore(best.conv), self.slabs.restore(best.recurrent)
            self.stats.full_hits += 1
        else:
            self.stats.partial_hits += 1
        state.length = best_len
        self.stats.cached_tokens += best_len
        return state, best_len
