"""A graphed step's K/V rows quantized to the pool's INT8 group-64 encoding and stored at their flat
slots, K and V in one Triton kernel (GPU); norm_rope_write_slots also norms and ropes q and k ahead of
the write in the same launch (NINFER_NORM_ROPE_WRITE). The torch form (kv/quant.quantize_kv twice, then four
indexed stores) is ~28 small kernels per attention layer and step: ~450 of a 27B decode step's.

Bit for bit the reference's: scale = fp16(amax / 127) (1 where 0), value = round-half-even(x / scale)
clamped to +-127, both divisions correctly rounded (div_rn, as torch divides; Triton's `/` is not) and
the rounding by the float32 1.5 * 2^23 addition (exact for |x / scale| <= 127.5)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..kv.pool import BlockPool
from ..kv.quant import GROUP
from .common import launch_dependents, programmatic, wait_for_inputs
from .norms import norm_row, normed_row, row_warps

# Whether a captured step's attention layers norm and rope q/k in the KV write's launch (norm_rope_write_slots;
# read at each call: bench.py --ab-norm-rope-write flips it). H100, stop 42, one machine: the step's graph C = 1
# 6.92 -> 6.91 ms, C = 8 9.91 -> 9.88 (a launch fewer an attention layer; PDL had hidden most of its cost)
NORM_ROPE_WRITE = os.environ.get("NINFER_NORM_ROPE_WRITE", "1") == "1"


@triton.jit
def _quantize_store(x_ptr, q_ptr, s_ptr, row, h, dest, H: tl.constexpr, D: tl.constexpr):
    groups = tl.arange(0, D // 64)
    d = groups[:, None] * 64 + tl.arange(0, 64)[None, :]  # [groups, 64]
    quantize_groups(tl.load(x_ptr + (row * H + h) * D + d).to(tl.float32), q_ptr, s_ptr, h, dest, H, D)


@triton.jit
def quantize_groups(x, q_ptr, s_ptr, h, dest, H: tl.constexpr, D: tl.constexpr):
    """x [D // 64, 64] float32 (values of the activation dtype) -> head h of flat slot `dest`: int8 values
    and fp16 group scales."""
    groups = tl.arange(0, D // 64)
    d = groups[:, None] * 64 + tl.arange(0, 64)[None, :]
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


@triton.jit(do_not_specialize=["layer"])
def _norm_rope_write_kernel(q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, yq_ptr, cos_ptr, sin_ptr, slots_ptr, kq_ptr, ks_ptr,
                            vq_ptr, vs_ptr, layer, SLOTS_PER_LAYER, Q_ROWS, K_ROWS, Q_STRIDE, K_STRIDE, eps, offset,
                            Q_HEADS, RD, H: tl.constexpr, D: tl.constexpr, OFFSET: tl.constexpr, PDL: tl.constexpr):
    """Programs 0 .. Q_ROWS - 1: q rows normed and roped into yq (norms._qk_norm_rope_kernel's); then K_ROWS k
    rows normed, roped and written to the pool, then K_ROWS v rows written (_kv_write_kernel's encoding)."""
    launch_dependents(PDL)
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    if row < Q_ROWS:
        norm_row(q_ptr, wq_ptr, q_ptr, yq_ptr, q_ptr, yq_ptr, cos_ptr, sin_ptr, row, D, Q_STRIDE, eps, offset, Q_HEADS,
                 RD, D, OFFSET, False, True, False, True)
    else:
        r = (row - Q_ROWS) % K_ROWS  # the [T, H] row of k or v
        h = r % H
        dest = (layer * SLOTS_PER_LAYER + tl.load(slots_ptr + r // H)).to(tl.int64)
        if row < Q_ROWS + K_ROWS:
            y = normed_row(k_ptr, wk_ptr, k_ptr, k_ptr, k_ptr, k_ptr, cos_ptr, sin_ptr, r, D, K_STRIDE, eps, offset, H,
                           RD, D, OFFSET, False, True, False, True)
            # the k row as its store would round it, then encoded as the write encodes a stored row
            y = y.to(k_ptr.dtype.element_ty, fp_downcast_rounding="rtne").to(tl.float32)
            quantize_groups(tl.reshape(y, (D // 64, 64)), kq_ptr, ks_ptr, h, dest, H, D)
        else:
            _quantize_store(v_ptr, vq_ptr, vs_ptr, r // H, h, dest, H, D)


def norm_rope_write_slots(pool: BlockPool, layer: int, slots: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, offset: float,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """norms.qk_norm_rope(q, k, ...) and write_slots(pool, layer, slots, normed k, v) in one launch (a step's
    attention layer: a launch and a wait fewer) -> the normed, roped q [T, Hq, D]. q [T, Hq, D] (rows evenly
    spaced), k/v [T, H, D], D a power of two."""
    t, hq, dim = q.shape
    heads = k.shape[1]
    assert pool.layout.dtype == "int8" and dim % GROUP == 0 and dim & (dim - 1) == 0 and v.shape == k.shape
    q2, k2 = q.reshape(-1, dim), k.reshape(-1, dim)
    q2 = q2 if q2.stride(-1) == 1 else q2.contiguous()
    k2 = k2 if k2.stride(-1) == 1 else k2.contiguous()
    yq = torch.empty(q2.shape, dtype=q.dtype, device=q.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    _norm_rope_write_kernel[(q2.shape[0] + 2 * k2.shape[0],)](
        q2, k2, v.contiguous(), q_weight.contiguous(), k_weight.contiguous(), yq, cos, sin, slots, pool.k,
        pool.k_scale, pool.v, pool.v_scale, layer, pool.num_blocks * pool.layout.block_size, q2.shape[0], k2.shape[0],
        q2.stride(0), k2.stride(0), eps, float(offset), hq, cos.shape[-1], H=heads, D=dim, OFFSET=bool(offset),
        num_warps=row_warps(dim), **programmatic(q.device))
    return yq.view(q.shape)
