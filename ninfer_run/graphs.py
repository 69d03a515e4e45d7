"""CUDA Graphs for plain decode: one captured forward per batch size, replayed every step.

A decode step of the 27B launches thousands of small kernels; launched one by one from Python the
host, not the GPU, sets the pace. Captured once per batch size (1 .. --max-concurrency, each on
first use), a step becomes: fill that size's StaticBatch buffers from the host (tokens, RoPE
positions, each row's KV slot, block table and length, GDN slab slot; pinned buffers, six small
copies), replay, read the logits. Every size has its own graph, so no row is padding and no KV
block or GDN state has to be set aside for padding rows.

Sequences with images (M-RoPE positions) or speculative decoding (per-token rollback states) keep
the eager path. On a CPU nothing is captured: `decode` runs the same static forward eagerly, which
is what the CPU tests check against the eager batched decode.
"""

from __future__ import annotations

import torch

from .kv.pool import BlockPool
from .state import GDNSlab, SequenceState, StaticBatch


class _Bucket:
    """One batch size: its static buffers, the pinned host image of them, and (on CUDA) its graph."""

    def __init__(self, batch: StaticBatch):
        self.batch = batch
        b, width = batch.size, batch.tables.shape[1]
        pin = batch.tokens.is_cuda
        self.meta = torch.zeros(4, b, dtype=torch.long, pin_memory=pin)  # tokens, positions, kv slots, GDN slots
        self.table = torch.zeros(b, width, dtype=torch.int32, pin_memory=pin)
        self.lens = torch.zeros(b, dtype=torch.int32, pin_memory=pin)
        self.owners: list[tuple[int, list[int]] | None] = [None] * b  # (id(state), its table as written) per row
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def stage(self, tokens: list[int], states: list[SequenceState], slots: list[int]) -> None:
        """Write the step's rows into the host image and copy it to the device buffers."""
        for row, st in enumerate(states):
            length, blocks = st.length, st.kv.blocks
            self.meta[:, row] = torch.tensor([tokens[row], length + st.position_offset, st.kv.slot(length), slots[row]])
            self.lens[row] = length + 1
            if self.owners[row] != (id(st), blocks):  # only a new or grown table is rewritten
                self.table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
                self.owners[row] = (id(st), list(blocks))
        b = self.batch
        b.tokens.copy_(self.meta[0], non_blocking=True)
        b.positions.copy_(self.meta[1], non_blocking=True)
        b.kv_slots.copy_(self.meta[2], non_blocking=True)
        b.state_slots.copy_(self.meta[3], non_blocking=True)
        b.tables.copy_(self.table, non_blocking=True)
        b.lens.copy_(self.lens, non_blocking=True)

    def forget(self, state_id: int) -> None:
        """A released sequence's rows must be rewritten even if a new one reuses its id."""
        self.owners = [None if o is not None and o[0] == state_id else o for o in self.owners]


class GraphedDecoder:
    """Plain decode steps of up to `max_batch` sequences through captured graphs (CUDA) or the same
    static forward run eagerly (elsewhere)."""

    def __init__(self, model, pool: BlockPool, layers: dict[int, int], max_batch: int, dtype: torch.dtype):
        self.model, self.pool, self.layers, self.max_batch = model, pool, layers, max_batch
        self.device = pool.k.device
        self.capture = self.device.type == "cuda"
        shapes = model.gdn_state_shapes(dtype)
        self.slab = GDNSlab(shapes, max_batch, self.device) if shapes else None  # one slot per sequence
        self.free_slots = list(range(max_batch))
        self.slot_of: dict[int, int] = {}  # id(state) -> its GDN slot
        self.states: dict[int, SequenceState] = {}
        self.buckets: dict[int, _Bucket] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None
        self.replays = 0

    @staticmethod
    def supports(state: SequenceState) -> bool:
        return state.mm is None and not state.keep_steps

    def decode(self, tokens: list[int], states: list[SequenceState]) -> torch.Tensor:
        """The next token's logits [len(states), V] of each sequence (their KV tables hold room for it)."""
        if not 1 <= len(states) <= self.max_batch:
            raise ValueError(f"a graphed step takes 1..{self.max_batch} sequences, got {len(states)}")
        for st in states:
            st.kv.reserve(st.length + 1)
        slots = [self.attach(st) for st in states]
        bucket = self._bucket(len(states))
        bucket.stage(tokens, states, slots)
        if self.capture and bucket.graph is None:
            self._capture(bucket)  # on this step's real rows: nothing else is written
        if bucket.graph is not None:
            bucket.graph.replay()
            logits = bucket.logits
            self.replays += 1
        else:
            logits = self.model.decode_static(bucket.batch)
        for st in states:
            st.length += 1
            st.last_forward = 1
        return logits[: len(states)]

    def release(self, state: SequenceState) -> None:
        """The sequence stops decoding here: its GDN state is copied out of its slot, which is freed."""
        slot = self.slot_of.pop(id(state), None)
        if slot is None:
            return
        del self.states[id(state)]
        for bucket in self.buckets.values():
            bucket.forget(id(state))
        if self.slab is not None:
            self.slab.detach(state, slot)
        self.free_slots.append(slot)

    def attach(self, state: SequenceState) -> int:
        """Give the sequence a GDN slot (its states become views of it; the engine does this at
        admission, so a prefill writes straight into the slot) -> the slot."""
        if id(state) not in self.slot_of:
            if not self.free_slots:
                raise RuntimeError("more decoding sequences than GDN slots (max_batch)")
            self.slot_of[id(state)] = self.free_slots.pop()
            self.states[id(state)] = state  # held so its id cannot be reused while it has a slot
        slot = self.slot_of[id(state)]
        if self.slab is not None:
            self.slab.attach(state, slot)
        return slot

    def _bucket(self, size: int) -> _Bucket:
        if size not in self.buckets:
            batch = StaticBatch(size, self.pool, self.layers, self.slab, self.device)
            self.buckets[size] = _Bucket(batch)
        return self.buckets[size]

    def _capture(self, bucket: _Bucket) -> None:
        """Warm up (Triton compiles, cuBLAS picks its kernels) and capture, on the staged rows. The
        warm-up forwards rewrite the rows' new K/V slots with the same values, but they advance the
        GDN states: those are saved first and put back."""
        batch = bucket.batch
        saved = None if self.slab is None else self.slab.gather(batch.state_slots)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.model.decode_static(batch)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if saved is not None:
            self.slab.scatter(batch.state_slots, saved)
        bucket.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(bucket.graph, pool=self.mempool):
            bucket.logits = self.model.decode_static(bucket.batch)
