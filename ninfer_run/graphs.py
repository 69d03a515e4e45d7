"""CUDA Graphs for decode: plain steps, speculative verify forwards and MTP drafting, each captured
once per shape and replayed.

A decode step of the 27B launches thousands of small kernels; launched one by one from Python the
host, not the GPU, sets the pace. Captured once per shape (batch size 1 .. --max-concurrency for
plain steps, token count for verifies, draft count for the head; each on first use), a step becomes:
fill that shape's static buffers from the host (tokens, RoPE positions, each row's KV slot, block
table and length, GDN slab slot: one pinned image, six small copies), replay, read the results.
Every shape has its own graph, so no row is padding and no KV block or GDN state is set aside.

Sequences with images (M-RoPE positions) keep the eager path. On a CPU nothing is captured: the same
static forwards run eagerly, which is what the CPU tests compare with the eager model.
"""

from __future__ import annotations

import logging

import torch

from .kv.pool import BlockPool
from .state import SequenceState
from .static_step import GDNSlab, StaticBatch

log = logging.getLogger("ninfer.graphs")


class _Bucket:
    """One step shape (sequences x tokens each): its static buffers, their pinned host image, and (on
    CUDA) its graph with the hidden states and logits it leaves."""

    def __init__(self, batch: StaticBatch):
        self.batch = batch
        b, rows, width = batch.size, batch.tokens.shape[0], batch.tables.shape[1]
        pin = batch.tokens.is_cuda
        self.rows = torch.zeros(3, rows, dtype=torch.long, pin_memory=pin)  # tokens, positions, kv slots
        self.slots = torch.zeros(b, dtype=torch.long, pin_memory=pin)  # GDN slot of each sequence
        self.table = torch.zeros(b, width, dtype=torch.int32, pin_memory=pin)
        self.lens = torch.zeros(b, dtype=torch.int32, pin_memory=pin)
        self.owners: list[tuple[int, list[int]] | None] = [None] * b  # (id(state), its table as written)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None  # (hidden, logits) the graph writes
        # the host image is rewritten only once the copies out of it ran: with overlapped steps the
        # host stages a step before the one ahead of it has started on the device
        self.copied = torch.cuda.Event() if pin else None

    def stage(self, tokens: list[int] | torch.Tensor, states: list[SequenceState], slots: list[int]) -> None:
        """Write the step's rows (q_len tokens of each sequence) into the host image, copy it over.
        Tokens as a tensor (a verify's, drafted on the device) are copied as they are: no host wait."""
        if self.copied is not None:
            self.copied.synchronize()
        t = self.batch.q_len
        positions, kv_slots, tables_changed = [], [], False
        for b, st in enumerate(states):
            length, blocks = st.length, st.kv.blocks
            positions += range(length + st.position_offset, length + st.position_offset + t)
            kv_slots += (st.kv.slot(length + j) for j in range(t))
            if self.owners[b] != (id(st), blocks):  # only a new or grown table is rewritten (and copied)
                self.table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
                self.owners[b] = (id(st), list(blocks))
                tables_changed = True
        on_device = isinstance(tokens, torch.Tensor)
        self.rows.copy_(torch.tensor([[0] * len(positions) if on_device else tokens, positions, kv_slots]))
        self.slots.copy_(torch.tensor(slots))
        self.lens.copy_(torch.tensor([st.length + t for st in states], dtype=torch.int32))
        batch = self.batch
        for dst, src in ((batch.tokens, tokens if on_device else self.rows[0]), (batch.positions, self.rows[1]),
                         (batch.kv_slots, self.rows[2]), (batch.state_slots, self.slots), (batch.lens, self.lens)):
            dst.copy_(src, non_blocking=True)
        if tables_changed:
            batch.tables.copy_(self.table, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def forget(self, state_id: int) -> None:
        """A released sequence's rows must be rewritten even if a new one reuses its id."""
        self.owners = [None if o is not None and o[0] == state_id else o for o in self.owners]


class _Drafts:
    """One (observed rows k, draft count n) shape: the MTP head first observes the k verified rows the
    last step left (hidden states and their successor tokens; k = 0: none, it starts from the last
    observed hidden state and logits), then runs its n - 1 chained draft forwards (each fed the
    previous argmax on the device), as one step. Inputs: per row its position, KV slot and length;
    outputs: the n drafts, and the head's hidden state and logits after the observed rows."""

    def __init__(self, k: int, n: int, pool: BlockPool, hidden: int, vocab: int, dtype: torch.dtype, device):
        self.k, self.n = k, n
        self.batch = StaticBatch(1, pool, {-1: 0}, None, device)  # the head's pool, its one layer
        self.observed = StaticBatch(1, pool, {-1: 0}, None, device, q_len=k) if k else None
        self.hidden = torch.zeros(max(k, 1), hidden, dtype=dtype, device=device)  # observed rows (or the last)
        self.logits = torch.zeros(vocab, dtype=dtype, device=device)
        long = dict(dtype=torch.long, device=device)
        rows = k + n - 1  # observed, then drafted
        self.positions, self.kv_slots = torch.zeros(rows, **long), torch.zeros(rows, **long)
        self.lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.drafts = torch.zeros(n + 1, **long)  # the verify's tokens: the last accepted one, then the drafts
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None  # (hidden [1, H], logits [V]) after observing
        self.graph: torch.cuda.CUDAGraph | None = None
        pin = self.drafts.is_cuda  # the host images the copies read without waiting
        self.host_rows = torch.zeros(2, rows, dtype=torch.long, pin_memory=pin)  # positions, KV slots
        self.host_lens = torch.zeros(rows, dtype=torch.int32, pin_memory=pin)
        self.host_tokens = torch.zeros(max(k, 1) + 1, dtype=torch.long, pin_memory=pin)  # observed, then the last
        self.host_table = torch.zeros(1, pool.num_blocks, dtype=torch.int32, pin_memory=pin)
        # the host images are rewritten only once the last copies out of them ran (nothing else waits
        # between two sequences' drafts now)
        self.copied = torch.cuda.Event() if pin else None

    def stage(self, drafter, observe: tuple[torch.Tensor, list[int]] | None, last: int) -> None:
        if self.copied is not None:
            self.copied.synchronize()
        st = drafter.state
        start, blocks, offset = st.length, st.kv.blocks, st.position_offset
        rows = range(start, start + self.k + self.n - 1)
        self.host_tokens[-1] = last
        self.drafts[:1].copy_(self.host_tokens[-1:], non_blocking=True)
        if observe is not None:
            self.hidden.copy_(observe[0])
            self.host_tokens[: self.k] = torch.tensor(observe[1])
            self.observed.tokens.copy_(self.host_tokens[: self.k], non_blocking=True)
        else:
            self.hidden.copy_(drafter.hidden)
            self.logits.copy_(drafter.logits)
        self.host_rows.copy_(torch.tensor([[p + offset for p in rows], [st.kv.slot(p) for p in rows]]))
        self.host_lens.copy_(torch.tensor([p + 1 for p in rows], dtype=torch.int32))
        self.host_table[0, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        for dst, src in ((self.positions, self.host_rows[0]), (self.kv_slots, self.host_rows[1]),
                         (self.lens, self.host_lens), (self.batch.tables, self.host_table)):
            dst.copy_(src, non_blocking=True)
        if self.observed is not None:
            self.observed.tables.copy_(self.batch.tables)
        if self.copied is not None:
            self.copied.record()

    def run(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """Observe, then draft, on device tensors only (what the graph captures) -> the head's (hidden,
        logits) after the observed rows."""
        hidden, logits = self.hidden[-1:], self.logits
        if self.observed is not None:
            o = self.observed
            o.positions.copy_(self.positions[: self.k])
            o.kv_slots.copy_(self.kv_slots[: self.k])
            o.lens.copy_(self.lens[self.k - 1 : self.k])
            d, lg = model.mtp_rows(self.hidden, o.tokens, o)
            hidden, logits = d[-1:], lg[-1]
        b = self.batch
        token = logits.argmax(-1, keepdim=True)
        self.drafts[1:2].copy_(token)
        after = (hidden, logits)
        for s in range(self.n - 1):
            row = self.k + s
            b.tokens.copy_(token)
            b.positions.copy_(self.positions[row : row + 1])
            b.kv_slots.copy_(self.kv_slots[row : row + 1])
            b.lens.copy_(self.lens[row : row + 1])
            hidden, lg = model.mtp_rows(hidden, b.tokens, b)
            token = lg[-1].argmax(-1, keepdim=True)
            self.drafts[s + 2 : s + 3].copy_(token)
        return after


class GraphedDecoder:
    """Plain decode steps and speculative verify forwards (2 .. draft_tokens + 1 tokens each) of up to
    `max_batch` sequences, and the MTP head's drafts, through captured graphs (CUDA) or the same
    static forwards run eagerly (elsewhere)."""

    def __init__(self, model, pool: BlockPool, layers: dict[int, int], max_batch: int, dtype: torch.dtype,
                 draft_tokens: int = 0, mtp_pool: BlockPool | None = None):
        self.model, self.pool, self.layers, self.max_batch = model, pool, layers, max_batch
        self.dtype, self.mtp_pool = dtype, mtp_pool
        self.drafts: dict[tuple[int, int], _Drafts] = {}  # by (observed rows, drafts)
        self.device = pool.k.device
        self.capture = self.device.type == "cuda"
        shapes = model.gdn_state_shapes(dtype)
        # one slot per sequence; with speculative decoding each also keeps a verify's per-token states
        self.slab = GDNSlab(shapes, max_batch, self.device, steps=draft_tokens + 1 if draft_tokens else 0) \
            if shapes else None
        self.free_slots = list(range(max_batch))
        self.slot_of: dict[int, int] = {}  # id(state) -> its GDN slot
        self.states: dict[int, SequenceState] = {}
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None
        self.replays = 0

    @staticmethod
    def supports(state: SequenceState) -> bool:
        """Plain decode of this sequence can be graphed (no images: M-RoPE positions stay eager)."""
        return state.mm is None and not state.keep_steps

    def decode(self, tokens: list[int], states: list[SequenceState]) -> torch.Tensor:
        """The next token's logits [len(states), V] of each sequence."""
        return self.decode_rows(tokens, states)[1]

    def decode_rows(self, tokens: list[int], states: list[SequenceState]) -> tuple[torch.Tensor, torch.Tensor]:
        """decode -> (final-norm hidden [B, H], logits [B, V]): the graph's buffers, valid until its next replay."""
        if not 1 <= len(states) <= self.max_batch:
            raise ValueError(f"a graphed step takes 1..{self.max_batch} sequences, got {len(states)}")
        return self._step(tokens, states, 1)

    def verify(self, tokens: torch.Tensor, state: SequenceState) -> tuple[torch.Tensor, torch.Tensor]:
        """`model.forward`'s contract for a speculative verify (the last token and its drafts) of a
        keep_steps sequence: (hidden [T, H], logits [T, V]); state.steps holds each token's GDN state
        (views of the sequence's slot) for the rollback."""
        if not self._verifiable(state, tokens.shape[0]):
            return self.model.forward(tokens, state)
        return self._verify([tokens], [state])[0]

    def verify_batch(self, token_lists: list[torch.Tensor], states: list[SequenceState]):
        """`verify` for several sequences at once: one forward (the weights read once for all of them)
        when they verify the same number of tokens -> [(hidden, logits)] per sequence. Tokens: long
        tensors, host or device (propose_tokens')."""
        t = len(token_lists[0])
        if len(states) <= self.max_batch and all(len(x) == t and self._verifiable(st, t)
                                                 for x, st in zip(token_lists, states)):
            return self._verify(token_lists, states)
        return [self.verify(x, st) for x, st in zip(token_lists, states)]

    def _verifiable(self, state: SequenceState, tokens: int) -> bool:
        return state.mm is None and state.keep_steps and (self.slab is None or self.slab.steps >= tokens)

    def _verify(self, token_lists: list[torch.Tensor], states: list[SequenceState]):
        t = len(token_lists[0])
        tokens = torch.cat([x.to(self.device, non_blocking=True) for x in token_lists])
        hidden, logits = self._step(tokens, states, t)
        out = []
        for b, st in enumerate(states):
            if self.slab is not None:
                st.steps = self.slab.step_views(self.slot_of[id(st)], t)
            out.append((hidden[b * t : (b + 1) * t], logits[b * t : (b + 1) * t]))
        return out

    def propose(self, drafter, n: int, observe: tuple[torch.Tensor, list[int]] | None = None) -> list[int]:
        """`drafter.observe(*observe)` (if given: the verified hidden rows [k, H] and their successor
        tokens), then `drafter.propose(n)`, captured as one graph per (k, n)."""
        return self.propose_tokens(drafter, n, 0, observe)[1:].tolist()

    def propose_tokens(self, drafter, n: int, last: int, observe: tuple[torch.Tensor, list[int]] | None = None):
        """propose, as the verify's tokens: [last, *drafts], a long tensor left on the device (read
        with the verify's result, not before it is launched)."""
        k = 0 if observe is None else len(observe[1])
        if (n < 2 and not k) or self.mtp_pool is None or drafter.state.mm is not None:
            if observe is not None:
                drafter.observe(observe[0], torch.tensor(observe[1]))
            return torch.tensor([last, *drafter.propose(n)])
        drafter.state.kv.reserve(drafter.state.length + k + n - 1)
        if (k, n) not in self.drafts:
            c = self.model.cfg
            self.drafts[(k, n)] = _Drafts(k, n, self.mtp_pool, c.hidden_size, c.vocab_size, self.dtype, self.device)
        d = self.drafts[(k, n)]
        d.stage(drafter, observe, last)
        if self.capture and d.graph is None:
            d.graph, d.out = self._captured(lambda: d.run(self.model))  # writes the head's own new KV slots only
        if d.graph is not None:
            d.graph.replay()
            self.replays += 1
            after = d.out
        else:
            after = d.run(self.model)
        if k:  # the head has observed the rows: its state and last hidden state / logits move on
            drafter.state.length += k
            drafter.hidden, drafter.logits = after[0].clone(), after[1].clone()
        return d.drafts.clone()  # the next replay of this shape rewrites the buffer

    def _captured(self, fn):
        """fn warmed up twice on a side stream (Triton compiles, cuBLAS picks its kernels), then
        captured -> (graph, what the captured call returned: tensors the replays rewrite). If that
        fails, (None, None) and no more captures: every step then runs eagerly, as on a CPU."""
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                out = fn()
            return graph, out
        except Exception as err:  # noqa: BLE001 - a step that cannot be captured still runs, eagerly
            log.warning("CUDA graph capture failed (%s); steps run eagerly from now on", err)
            self.capture = False
            return None, None

    def _step(self, tokens: list[int] | torch.Tensor, states: list[SequenceState], q_len: int):
        for st in states:
            st.kv.reserve(st.length + q_len)
        slots = [self.attach(st) for st in states]
        bucket = self._bucket(len(states), q_len)
        bucket.stage(tokens, states, slots)
        if self.capture and bucket.graph is None:
            self._capture(bucket)  # on this step's real rows: nothing else is written
        if bucket.graph is not None:
            bucket.graph.replay()
            hidden, logits = bucket.out
            self.replays += 1
        else:
            hidden, logits = self.model.forward_static(bucket.batch)
        for st in states:
            st.length += q_len
            st.last_forward = q_len
        return hidden, logits

    def release(self, state: SequenceState, keep_state: bool = True) -> None:
        """The sequence stops decoding here: its GDN state is copied out of its slot, which is freed.
        keep_state=False: the state is done with (a finished run, its frontier already copied): its GDN
        entries are dropped instead - no copy of the 27B's 147 MiB a sequence, no memory the plan left out."""
        slot = self.slot_of.pop(id(state), None)
        if slot is None:
            return
        del self.states[id(state)]
        for bucket in self.buckets.values():
            bucket.forget(id(state))
        if self.slab is not None:
            if keep_state:
                self.slab.detach(state, slot)
            else:
                state.conv, state.recurrent, state.steps = {}, {}, {}
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

    def _bucket(self, size: int, q_len: int) -> _Bucket:
        if (size, q_len) not in self.buckets:
            batch = StaticBatch(size, self.pool, self.layers, self.slab, self.device, q_len)
            self.buckets[(size, q_len)] = _Bucket(batch)
        return self.buckets[(size, q_len)]

    def _capture(self, bucket: _Bucket) -> None:
        """Capture on the staged rows. The warm-up forwards rewrite the rows' new K/V slots with the same
        values, but they advance the GDN states: those are saved first and put back (capturing runs nothing)."""
        batch = bucket.batch
        saved = None if self.slab is None else self.slab.gather(batch.state_slots)
        bucket.graph, bucket.out = self._captured(lambda: self.model.forward_static(batch))
        if saved is not None:  # also after a failed capture: the eager step that follows needs them as they were
            self.slab.scatter(batch.state_slots, saved)
