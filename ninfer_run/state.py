"""Per-sequence model state carried between forward calls: KV for attention layers, conv and
recurrent state for Gated DeltaNet layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kv.pool import BlockPool
from .layers import QKNorm, causal_attention, output_gate, qk_norm_rope
from .static_step import StaticBatch
from .vision.prompt import MultimodalPrompt


class DenseKV:
    """Reference KV: full-precision tensors per layer, grown by concatenation."""

    def __init__(self):
        self._kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def append(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [T, H, D] at positions start.. and return all of this layer's k/v so far."""
        if layer in self._kv:
            old_k, old_v = self._kv[layer]
            k, v = torch.cat((old_k[:start], k)), torch.cat((old_v[:start], v))
        self._kv[layer] = (k, v)
        return k, v

    def attend(self, layer: int, start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k/v at positions start.. and return causal attention of q [T, Hq, D] over all of them."""
        keys, values = self.append(layer, start, k, v)
        return causal_attention(q, keys, values, q_offset=start)

    def release(self) -> None:
        self._kv.clear()


DENSE_PREFILL_ROWS = 64  # longer chunks: KV decoded once, then flash attention (kernels/paged_attention.py)


class PagedKV:
    """KV in the shared block pool; `layers` maps a model layer key to its pool layer."""

    def __init__(self, pool: BlockPool, layers: dict[int, int]):
        self.pool, self.layers = pool, layers
        self.blocks: list[int] = []
        # attention through the Triton kernel, reading the INT8 blocks in place (a CUDA pool)
        self.kernel = pool.k.is_cuda and pool.layout.dtype == "int8"

    def reserve(self, length: int) -> None:
        """Grow the block table to hold `length` tokens."""
        need = -(-length // self.pool.layout.block_size) - len(self.blocks)
        if need > 0:
            self.blocks += self.pool.allocate(need)

    def slot(self, position: int) -> int:
        """The pool's flat slot (block * block_size + offset) of a position the table holds."""
        bs = self.pool.layout.block_size
        return self.blocks[position // bs] * bs + position % bs

    def _write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> int:
        """Store k/v at positions start.. (growing the block table as needed); -> the new length."""
        end = start + k.shape[0]
        self.reserve(end)
        self.pool.write(self.layers[layer], self.blocks, start, k, v)
        return end

    def append(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._write(layer, start, k, v)
        return self.pool.read(self.layers[layer], self.blocks, end, k.dtype)

    def attend(self, layer: int, start: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k/v at positions start.. and return causal attention of q [T, Hq, D] over the sequence.
        On a CUDA INT8 pool the Triton kernel reads the blocks in place (kernels/paged_attention.py);
        chunks of more than DENSE_PREFILL_ROWS queries take the dense flash path instead."""
        if not self.kernel:
            keys, values = self.append(layer, start, k, v)
            return causal_attention(q, keys, values, q_offset=start)
        from .kernels.paged_attention import dense_prefill, paged_attention

        end = self._write(layer, start, k, v)
        if q.shape[0] > DENSE_PREFILL_ROWS:
            return dense_prefill(q, self.pool, self.layers[layer], self.blocks, end)
        table = torch.tensor([self.blocks], dtype=torch.int32, device=q.device)
        lens = torch.tensor([end], dtype=torch.int32, device=q.device)
        return paged_attention(q[None], self.pool, self.layers[layer], table, lens, one_shape=True)[0].to(q.dtype)

    def release(self) -> None:
        self.pool.release(self.blocks)
        self.blocks = []


@dataclass
class SequenceState:
    length: int = 0  # tokens held (KV slots / recurrent steps)
    position_offset: int = 0  # RoPE position of slot 0 (an MTP head that joins after a reused prefix)
    kv: DenseKV | PagedKV = field(default_factory=DenseKV)
    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    recurrent: dict[int, torch.Tensor] = field(default_factory=dict)
    # With keep_steps (spec.keeping_steps sets it for verify forwards only), GDN layers also record (conv,
    # recurrent) after every token of the forward, so the verify can roll back to any accepted prefix
    # without recomputing.
    keep_steps: bool = False
    steps: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    last_forward: int = 0
    verified_hidden: torch.Tensor | None = None  # hidden states of the last verify step's kept tokens
    mm: MultimodalPrompt | None = None  # images in the prompt: M-RoPE positions and their embeddings

    def rope_positions(self, count: int) -> torch.Tensor:
        """Positions of the next `count` tokens: [count], or [3, count] (M-RoPE) when the prompt has images."""
        index = torch.arange(self.length, self.length + count) + self.position_offset
        if self.mm is None:
            return index
        prompt = self.mm.positions.shape[1]
        out = (index + self.mm.rope_delta).expand(3, -1).clone()
        inside = index < prompt
        out[:, inside] = self.mm.positions[:, index[inside]]
        return out

    def image_embeddings(self, count: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows within the next `count` tokens, their image embeddings), or None if there are none."""
        if self.mm is None or self.mm.embeds is None:
            return None
        rows = self.mm.image_rows - (self.length + self.position_offset)
        inside = (rows >= 0) & (rows < count)
        return (rows[inside], self.mm.embeds[inside]) if bool(inside.any()) else None

    def rollback(self, keep: int) -> None:
        """Keep only the first `keep` (>= 1) tokens of the last forward; later KV slots are overwritten."""
        if not 1 <= keep <= self.last_forward:
            raise ValueError(f"can keep 1..{self.last_forward} tokens of the last forward, not {keep}")
        self.length -= self.last_forward - keep
        for layer, steps in self.steps.items():
            self.conv[layer], self.recurrent[layer] = steps[keep - 1]
        self.last_forward = keep


# A forward's rows by sequence, in row order: one sequence's T new tokens ([(state, T)]), or one
# decode token for each of B sequences ([(s1, 1), ..., (sB, 1)]) so that the weights are read once;
# or a StaticBatch (a captured decode step: its buffers say which sequences).
Segments = list[tuple[SequenceState, int]] | StaticBatch


def rope_positions(segments: Segments) -> torch.Tensor:
    """Positions of every row: [rows], or [3, rows] (M-RoPE) when any sequence has images."""
    if isinstance(segments, StaticBatch):
        return segments.positions
    parts = [state.rope_positions(n) for state, n in segments]
    if len(parts) == 1:
        return parts[0]
    if any(p.ndim == 2 for p in parts):
        parts = [p if p.ndim == 2 else p.expand(3, -1) for p in parts]
    return torch.cat(parts, dim=-1)


def per_sequence(segments: Segments, fn, *tensors: torch.Tensor) -> torch.Tensor:
    """fn(state, *each tensor's rows of that sequence) for every sequence, outputs in row order."""
    outs, row = [], 0
    for state, n in segments:
        outs.append(fn(state, *(t[row : row + n] for t in tensors)))
        row += n
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def attend(segments: Segments, key: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           gate: torch.Tensor | None = None, qk_norm: QKNorm | None = None) -> torch.Tensor:
    """Each sequence's rows attend over its own KV (stored at its positions first); `gate` [T, Hq, D]:
    the output times sigmoid(gate) (layers.output_gate; in the decode graphs' attention kernel); `qk_norm`:
    q and k normed and roped first (layers.qk_norm_rope; a captured step's in the KV write's launch)."""
    if isinstance(segments, StaticBatch):
        return segments.attend(key, q, k, v, gate, qk_norm)
    if qk_norm is not None:
        q, k = qk_norm_rope(q, k, *qk_norm)
    out = per_sequence(segments, lambda state, q, k, v: state.kv.attend(key, state.length, q, k, v), q, k, v)
    return out if gate is None else output_gate(out, gate)


def advance(segments: Segments) -> None:
    """Count the rows' tokens as held (a StaticBatch's sequences are advanced by its decoder, on the host)."""
    if isinstance(segments, StaticBatch):
        return
    for state, n in segments:
        state.length += n
        state.last_forward = n
