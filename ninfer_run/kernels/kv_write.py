"""A graphed step's K/V rows quantized to the pool's INT8 group-64 encoding and stored at their flat
slots, K and V in one Triton kernel (GPU). The torch form (kv/quant.quantize_kv twice, then four
indexed stores) is ~28 small kernels per attention layer and step: ~450 of a 27B decode step's.

Bit for bit the reference's: scale = fp16(amax / 127) (1 where 0), value = round-half-even(x / scale)
clamped to +-127, both divisions correctly rounded (div_rn, as torch divides; Triton's `/` is not) and
the rounding by the float32 1.5 * 2^23 addition (exact for |x / scale| <= 127.5)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv.pool import BlockPool
from ..kv.quant import GROUP
from .common import launch_dependents, programmatic, wait_for_inputs


@triton.jit
def _quantize_store(x_ptr, q_ptr, s_ptr, row, h, dest, H: tl.constexpr, D: tl.constexpr):
    groups = tl.arange(0, D // 64)
    d = groups[:, None] * 64 + tl.arange(0, 64)[None, :]  # [groups, 64]
    x = tl.load(x_ptr + (row * H + h) * D + d).to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)).to(tl.float16, fp_downcast_rounding="rtne")
    scale = tl.where(scale == 0, 1.0, scale.to(tl.float32)).to(tl.float16)
    y = tl.math.div_rn(x, scale.to(tl.float32)[:, None])
    y = (y + 12582912.0) - 12582912.0  # round half to even (float32 addition rounds so)
    q = tl.minimum(tl.maximum(y, -127.0), 127.0).to(tl.int8)
    tl.store(q_ptr + (dest * H + h) * D + d, q)
    tl.store(s_ptr + (dest * H + h) * (D // 64) + groups, scale)


@triton.jit(do_not_specialize=["layer"])  # (Triton would compile layer 1 apart)
def _kv_write_kernel(k_ptr, v_ptr, slots_ptr, kq_ptr, ks_ptr, vq_ptr, vs_ptr, layer, SLOTS_PER_LAYER,
                     H: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(PDL)
    wait_for_inputs(PDL)
    row, h = tl.program_id(0), tl.program_id(1)
    # flat (layer, block, offset); int64: a pool past 2^31 values wraps 32-bit offsets
    dest = (layer * SLOTS_PER_LAYER + tl.load(slots_ptr + row)).to(tl.int64)
    _quantize_store(k_ptr, kq_ptr, ks_ptr, row, h, dest, H, D)
    _quantize_store(v_ptr, vq_ptr, vs_ptr, row, h, dest, H, D)


def write_slots(pool: BlockPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """BlockPool.write_slots' contract for an INT8 pool: k/v [R, H, D] rows to flat slots [R]."""
    rows, heads, dim = k.shape
    assert pool.layout.dtype == "int8" and dim % GROUP == 0
    _kv_write_kernel[(rows, heads)](k.contiguous(), v.contiguous(), slots, pool.k, pool.k_scale, pool.v, pool.v_scale,
                                    layer, pool.num_blocks * pool.layout.block_size, H=heads, D=dim,
                                    **programmatic(k.device))
