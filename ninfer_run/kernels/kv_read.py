"""One KV head's keys and values decoded from the INT8 group-64 pool into two contiguous [length, D]
tensors in one Triton kernel (GPU): what a long prefill chunk's flash attention reads (paged_attention.
dense_prefill), once per KV head and layer. The torch form (BlockPool.read_head: an indexed gather, int8
and scales to float32, a product, a cast and a copy per slice of 16K tokens) is ~8 kernels a slice, each
a pass over float32 temporaries; in stop 13's profile of a 100K prompt (17 s, H200) copies took 1.0 s,
indexing 0.2 and products 0.1, mostly these (an estimate: read_head was not timed apart; bench_kernels
now times both forms).

Bit for bit read_head's: the int8 value times its fp16 scale in float32 is exact (8 x 11 significant
bits), then rounded once to the output dtype, round-half-even as torch casts."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv.pool import BlockPool

TOKENS = 32  # positions a program decodes: 8K values of K and V each at the 27B's D = 256


@triton.jit
def pool_row(layer, num_blocks, block, offset, head, HKV: tl.constexpr, BS: tl.constexpr):
    """The row (of D values) of `head` at `offset` in `block` of `layer` in the pool's [layers, blocks,
    BS, HKV, D] tensors. int64: a pool past 2^31 values (the 27B's 16 layers from 131,072 tokens) wraps
    32-bit offsets."""
    return ((layer * num_blocks + block).to(tl.int64) * BS + offset) * HKV + head


@triton.jit
def _decode_rows(x_ptr, s_ptr, out_ptr, slot, pos, live, D: tl.constexpr):
    """Rows `slot` of one pool tensor [.., D] int8 and its scales [.., D // 64] -> out rows `pos`."""
    groups = tl.arange(0, D // 64)[None, :, None]
    within = tl.arange(0, 64)[None, None, :]
    mask = live[:, None, None]
    x = tl.load(x_ptr + slot[:, None, None] * D + groups * 64 + within, mask=mask, other=0).to(tl.float32)
    scale = tl.load(s_ptr + slot[:, None, None] * (D // 64) + groups, mask=mask, other=0).to(tl.float32)
    value = (x * scale).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(out_ptr + pos.to(tl.int64)[:, None, None] * D + groups * 64 + within, value, mask=mask)


@triton.jit(do_not_specialize=["layer", "head", "length"])  # one compile for every layer, head and length
def _read_head_kernel(table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, k_out, v_out, layer, head, length, num_blocks,
                      HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, TOKENS: tl.constexpr):
    pos = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    live = pos < length
    block = tl.load(table_ptr + pos // BS, mask=live, other=0)
    slot = pool_row(layer, num_blocks, block, pos % BS, head, HKV, BS)
    _decode_rows(k_ptr, ks_ptr, k_out, slot, pos, live, D)
    _decode_rows(v_ptr, vs_ptr, v_out, slot, pos, live, D)


def read_head(pool: BlockPool, layer: int, table: torch.Tensor, length: int, head: int,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockPool.read_head's contract for an INT8 pool, the block table as a device tensor (int32 [>=
    ceil(length / block size)]) -> k, v [length, D] in `dtype`."""
    layout = pool.layout
    assert layout.dtype == "int8" and layout.head_dim % 64 == 0
    k, v = (torch.empty(length, layout.head_dim, dtype=dtype, device=pool.k.device) for _ in range(2))
    _read_head_kernel[(triton.cdiv(length, TOKENS),)](
        table, pool.k, pool.v, pool.k_scale, pool.v_scale, k, v, layer, head, length, pool.num_blocks,
        HKV=layout.kv_heads, D=layout.head_dim, BS=layout.block_size, TOKENS=TOKENS)
    return k, v
