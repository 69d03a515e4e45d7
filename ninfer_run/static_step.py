"""The rows of a captured (CUDA-graph) step and the Gated DeltaNet state slab it reads.

A captured step cannot read host values: everything that changes between replays (tokens, RoPE
positions, KV slots, block tables, lengths, which GDN states) lives in fixed device buffers that
graphs.GraphedDecoder fills before each replay, and every sequence's GDN state lives in one slot
of a slab the step gathers from and writes back to by index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .kv.pool import BlockPool
from .layers import QKNorm, causal_attention, output_gate, qk_norm_rope

if TYPE_CHECKING:
    from .state import SequenceState


def runs_in_place(rows: torch.Tensor) -> bool:
    """Whether a static step's GDN layers take the in-place kernels (kernels/gdn_decode.py, Triton):
    on the GPU (the CPU tests also run them in Triton's interpreter)."""
    return rows.is_cuda


def _norm_rope_writes(pool: BlockPool, rows: torch.Tensor) -> bool:
    """Whether a static step's attention layers norm and rope q/k in the KV write's launch
    (kv_write.NORM_ROPE_WRITE): an INT8 pool, written in place (runs_in_place), a power-of-two head size."""
    if not (runs_in_place(rows) and pool.layout.dtype == "int8" and rows.shape[-1] & (rows.shape[-1] - 1) == 0):
        return False
    from .kernels import kv_write  # Triton: GPU installs (and the CPU tests' interpreter)

    return kv_write.NORM_ROPE_WRITE


class GDNSlab:
    """Gated DeltaNet states of up to `slots` sequences, per layer in one tensor each (conv
    [slots, K-1, C], recurrent [slots, Hv, Dk, Dv]): a captured step gathers its rows' states by slot
    index and writes them back in place. A sequence's SequenceState.conv/recurrent entries are views
    of its slot while it holds one. With `steps` > 0 each slot also keeps the state after each token
    of a speculative verify (up to `steps` tokens), for the rollback."""

    def __init__(self, shapes: dict[int, tuple[tuple[int, ...], torch.dtype, tuple[int, ...]]], slots: int, device,
                 steps: int = 0):
        self.steps = steps
        self.conv = {i: torch.zeros(slots, *c, dtype=dt, device=device) for i, (c, dt, _) in shapes.items()}
        self.recurrent = {i: torch.zeros(slots, *r, dtype=torch.float32, device=device) for i, (_, _, r) in shapes.items()}
        self.step_conv = {i: torch.zeros(slots, steps, *c, dtype=dt, device=device)
                          for i, (c, dt, _) in shapes.items()} if steps else {}
        self.step_recurrent = {i: torch.zeros(slots, steps, *r, dtype=torch.float32, device=device)
                               for i, (_, _, r) in shapes.items()} if steps else {}
        # each slot's views, made once: attach runs every step for every sequence, and compares identities
        self._views = [[(i, self.conv[i][slot], self.recurrent[i][slot]) for i in self.conv] for slot in range(slots)]
        self._step_views = [{i: [(self.step_conv[i][slot, j], self.step_recurrent[i][slot, j]) for j in range(steps)]
                             for i in self.conv} for slot in range(slots)] if steps else []

    def attach(self, state: SequenceState, slot: int) -> None:
        """Make `state`'s GDN entries views of `slot`, copying in whatever they held (a rollback or a
        restored prefix replaced them); entries that already are those views stay."""
        conv, recurrent = state.conv, state.recurrent
        for i, conv_view, recurrent_view in self._views[slot]:
            for held, view in ((conv, conv_view), (recurrent, recurrent_view)):
                current = held.get(i)
                if current is not view:
                    view.copy_(current) if current is not None else view.zero_()
                    held[i] = view

    def detach(self, state: SequenceState, slot: int) -> None:
        """Give `state` its own copies again (its slot is about to serve another sequence)."""
        for i, conv_view, recurrent_view in self._views[slot]:
            for held, view in ((state.conv, conv_view), (state.recurrent, recurrent_view)):
                if held.get(i) is view:
                    held[i] = view.clone()
        state.steps = {}  # views of the slot's verify states

    def gather(self, slots: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Copies of these slots' states, per layer (conv, recurrent)."""
        return {i: (self.conv[i].index_select(0, slots), self.recurrent[i].index_select(0, slots)) for i in self.conv}

    def scatter(self, slots: torch.Tensor, states: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        for i, (conv, recurrent) in states.items():
            self.conv[i].index_copy_(0, slots, conv)
            self.recurrent[i].index_copy_(0, slots, recurrent)

    def keep_step(self, layer: int, slots: torch.Tensor, step: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """The states after token `step` of a verify, of the sequences in `slots`."""
        self.step_conv[layer][slots, step] = conv
        self.step_recurrent[layer][slots, step] = recurrent

    def step_views(self, slot: int, tokens: int) -> dict[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """SequenceState.steps for the last verify of `tokens` tokens in `slot`."""
        return {i: views[:tokens] for i, views in self._step_views[slot].items()}


class StaticBatch:
    """The rows of a CUDA-graph step: `q_len` tokens (1 for decode, a verify's draft count + 1) of
    each of `size` sequences, everything the forward reads held in fixed device buffers that
    graphs.GraphedDecoder fills before each replay. The model's layers call it through the same
    functions as a list of segments (rope_positions, attend, advance) and its GDN layers through
    `gdn`. Rows are sequence-major: row b * q_len + j is token j of sequence b."""

    def __init__(self, size: int, pool: BlockPool, layers: dict[int, int], slab: GDNSlab | None, device,
                 q_len: int = 1):
        self.size, self.q_len, self.pool, self.layers, self.slab = size, q_len, pool, layers, slab
        long = dict(dtype=torch.long, device=device)
        rows = size * q_len
        self.tokens = torch.zeros(rows, **long)
        self.positions = torch.zeros(rows, **long)  # RoPE positions
        self.kv_slots = torch.zeros(rows, **long)  # flat pool slot of each row's new K/V
        self.state_slots = torch.zeros(size, **long)  # GDN slab slot of each sequence
        self.lens = torch.zeros(size, dtype=torch.int32, device=device)  # tokens after this step
        self.tables = torch.zeros(size, pool.num_blocks, dtype=torch.int32, device=device)  # block tables

    def attend(self, key: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               gate: torch.Tensor | None = None, qk_norm: QKNorm | None = None) -> torch.Tensor:
        """state.attend's contract for the batch's rows (`gate`: layers.output_gate applied; `qk_norm`: q and k
        normed and roped first, in the KV write's launch where it runs in place: kernels/kv_write.py)."""
        layer = self.layers[key]
        if qk_norm is not None and _norm_rope_writes(self.pool, q):
            from .kernels import kv_write

            q = kv_write.norm_rope_write_slots(self.pool, layer, self.kv_slots, q, k, v, *qk_norm)
        else:
            if qk_norm is not None:
                q, k = qk_norm_rope(q, k, *qk_norm)
            self.pool.write_slots(layer, self.kv_slots, k, v)
        if self.pool.k.is_cuda and self.pool.layout.dtype == "int8":
            from .kernels.paged_attention import paged_attention

            out = paged_attention(q.view(self.size, self.q_len, *q.shape[1:]), self.pool, layer, self.tables, self.lens,
                                  gate=gate)
            return out.flatten(0, 1).to(q.dtype)
        out = []  # the reference path (CPU: nothing is captured there, so host values may be read)
        for b, (length, table) in enumerate(zip(self.lens.tolist(), self.tables.tolist())):
            keys, values = self.pool.read(layer, table, length, q.dtype)
            rows = q[b * self.q_len : (b + 1) * self.q_len]
            out.append(causal_attention(rows, keys, values, q_offset=length - self.q_len))
        return torch.cat(out) if gate is None else output_gate(torch.cat(out), gate)

    def gdn(self, layer: int, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, step, step_in_place=None
            ) -> torch.Tensor:
        """The layer's recurrence over the rows: `step(layer, qkv, g, beta, windows, states)` -> (out,
        windows, states) once per token (a verify's tokens in order, each state kept for the rollback),
        the states gathered from the slab and written back. On the GPU `step_in_place(layer, qkv, g,
        beta, windows, states, slots, tokens, keep)` -> out runs instead: it updates the slab's rows
        itself (no gather, no scatter) and, for a verify, writes each token's states to the slab's step
        rows (keep: (step windows, step states))."""
        if step_in_place is not None and runs_in_place(qkv):
            keep = (self.slab.step_conv[layer], self.slab.step_recurrent[layer]) if self.q_len > 1 else None
            return step_in_place(layer, qkv, g, beta, self.slab.conv[layer], self.slab.recurrent[layer],
                                 self.state_slots, self.q_len, keep)
        conv = self.slab.conv[layer].index_select(0, self.state_slots)
        recurrent = self.slab.recurrent[layer].index_select(0, self.state_slots)
        if self.q_len == 1:
            out, conv, recurrent = step(layer, qkv, g, beta, conv, recurrent)
        else:  # token j of every sequence at once, in token order
            def token(t: torch.Tensor, j: int) -> torch.Tensor:
                return t.reshape(self.size, self.q_len, *t.shape[1:])[:, j]

            outs = []
            for j in range(self.q_len):
                o, conv, recurrent = step(layer, token(qkv, j), token(g, j), token(beta, j), conv, recurrent)
                self.slab.keep_step(layer, self.state_slots, j, conv, recurrent)
                outs.append(o)
            out = torch.stack(outs, dim=1).flatten(0, 1)  # back to sequence-major rows
        self.slab.scatter(self.state_slots, {layer: (conv, recurrent)})
        return out
