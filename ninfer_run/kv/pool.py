"""The paged KV pool: fixed-size blocks in one preallocated tensor per K and V, sized by --max-context.

It is the only KV memory: sequences hold block tables into it; blocks are reference-counted so a
cached prefix can be shared. Encoding is INT8 group-64 (kv/quant.py) or bf16 for comparison.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from .quant import GROUP, dequantize_kv, quantize_kv

READ_SLICE = 16384  # tokens decoded at a time by read_head (its float32 temporaries scale with this)


class PoolExhausted(RuntimeError):
    """No free block is left; the caller evicts a cached prefix or refuses the request."""


@dataclass(frozen=True)
class KVLayout:
    layers: int  # attention layers that keep KV (GDN layers keep none)
    kv_heads: int
    head_dim: int
    block_size: int = 64
    dtype: str = "int8"  # or "bf16"

    @property
    def bytes_per_token(self) -> int:
        values = 2 * self.layers * self.kv_heads * self.head_dim
        return values + values // GROUP * 2 if self.dtype == "int8" else values * 2


class BlockPool:
    def __init__(self, layout: KVLayout, num_blocks: int, device: str | torch.device = "cpu"):
        if layout.dtype not in ("int8", "bf16"):
            raise ValueError(f"KV dtype must be int8 or bf16, got {layout.dtype!r}")
        if layout.dtype == "int8" and layout.head_dim % GROUP:
            raise ValueError(f"INT8 group-64 KV needs head_dim % 64 == 0, got {layout.head_dim}")
        self.layout, self.num_blocks = layout, num_blocks
        shape = (layout.layers, num_blocks, layout.block_size, layout.kv_heads, layout.head_dim)
        if layout.dtype == "int8":
            scale_shape = (*shape[:-1], layout.head_dim // GROUP)
            self.k = torch.zeros(shape, dtype=torch.int8, device=device)
            self.v = torch.zeros(shape, dtype=torch.int8, device=device)
            self.k_scale = torch.zeros(scale_shape, dtype=torch.float16, device=device)
            self.v_scale = torch.zeros(scale_shape, dtype=torch.float16, device=device)
        else:
            self.k = torch.zeros(shape, dtype=torch.bfloat16, device=device)
            self.v = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self._free = deque(range(num_blocks))
        self.refcount = [0] * num_blocks

    @classmethod
    def for_context(cls, layout: KVLayout, max_context: int, device="cpu") -> BlockPool:
        return cls(layout, -(-max_context // layout.block_size), device)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise PoolExhausted(f"KV pool exhausted: need {n} blocks, {len(self._free)} of {self.num_blocks} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self.refcount[b] = 1
        return blocks

    def retain(self, blocks: list[int]) -> None:
        for b in blocks:
            self.refcount[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            self.refcount[b] -= 1
            if self.refcount[b] == 0:
                self._free.append(b)
            elif self.refcount[b] < 0:
                raise RuntimeError(f"block {b} released more often than retained")

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's contents in every layer (copy on write for shared partial blocks)."""
        for t in (self.k, self.v, *((self.k_scale, self.v_scale) if self.layout.dtype == "int8" else ())):
            t[:, dst] = t[:, src]

    def device_table(self, blocks: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        """A block table on the pool's device, copied from pinned memory without waiting: a prefill
        chunk's layers then queue their KV writes and reads without a host sync each."""
        table = torch.tensor(blocks, dtype=dtype)
        return table.pin_memory().to(self.k.device, non_blocking=True) if self.k.is_cuda else table

    def _slots(self, blocks: list[int], start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, offset) of positions start..start+count-1, on the pool's device; only the block table
        crosses from the host (device_table)."""
        table = self.device_table(blocks)
        pos = torch.arange(start, start + count, device=self.k.device)
        bs = self.layout.block_size
        return table[pos // bs], pos % bs

    def write(self, layer: int, blocks: list[int], start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k/v [T, H, D] for positions start..start+T-1 of a sequence with this block table."""
        self._store(layer, *self._slots(blocks, start, k.shape[0]), k, v)

    def write_slots(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store row i of k/v [R, H, D] at flat slot slots[i] (block * block_size + offset), a device
        tensor: no host value is read, so a CUDA graph can capture the write. An INT8 pool on the GPU
        takes one Triton kernel for it (kernels/kv_write.py)."""
        if self.layout.dtype == "int8" and self.k.is_cuda:
            from ..kernels import kv_write

            return kv_write.write_slots(self, layer, slots, k, v)
        bs = self.layout.block_size
        self._store(layer, slots // bs, slots % bs, k, v)

    def _store(self, layer: int, b: torch.Tensor, s: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.layout.dtype == "int8":
            (kq, ks), (vq, vs) = quantize_kv(k), quantize_kv(v)
            self.k[layer, b, s], self.k_scale[layer, b, s] = kq, ks
            self.v[layer, b, s], self.v_scale[layer, b, s] = vq, vs
        else:
            self.k[layer, b, s], self.v[layer, b, s] = k.to(torch.bfloat16), v.to(torch.bfloat16)

    def _decoded(self, layer: int, index: tuple, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v at [layer, *index] (advanced indexing: blocks, slots[, head]), decoded to `dtype`."""
        at = (layer, *index)
        if self.layout.dtype == "int8":
            return (dequantize_kv(self.k[at], self.k_scale[at], dtype), dequantize_kv(self.v[at], self.v_scale[at], dtype))
        return self.k[at].to(dtype), self.v[at].to(dtype)

    def read_head(self, layer: int, blocks: list[int], length: int, head: int, dtype,
                  slice_tokens: int = READ_SLICE) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v [length, D] of one KV head, decoded `slice_tokens` at a time straight into `dtype`: the
        only full-length buffers are the two results (no float32 copy of the whole sequence)."""
        b, s = self._slots(blocks, 0, length)
        shape = (length, self.layout.head_dim)
        k, v = (torch.empty(shape, dtype=dtype, device=self.k.device) for _ in range(2))
        for start in range(0, length, slice_tokens):
            end = min(start + slice_tokens, length)
            k[start:end], v[start:end] = self._decoded(layer, (b[start:end], s[start:end], head), dtype)
        return k, v

    def read(self, layer: int, blocks: list[int], length: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v [length, H, D] of positions 0..length-1, decoded."""
        return self._decoded(layer, self._slots(blocks, 0, length), dtype)
