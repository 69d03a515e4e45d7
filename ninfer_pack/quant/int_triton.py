"""Groupwise int4/int8 slab quantization as one Triton kernel (GPU), bit-exact with `intgroup.int_slab`.

`int_slab` (pure torch) is the reference; tests/quant/test_gpu.py compares the two on fresh random
inputs. It reproduces compressed-tensors' arithmetic in the weight's dtype: every bf16 rounding of
the reference is an explicit round-to-nearest-even cast here, divisions are IEEE (`div_rn`), and
`round` is half-to-even via the 1.5 * 2^23 trick (exact for |v| < 2^22; our values are < 2^9).
One program handles BR rows x one group of G columns, including the packing (8 nibbles per int32
along K; zero points 8 rows per int32 along N).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BR = 32
_EPS = {torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}


@triton.jit
def _rb(v, BF16: tl.constexpr):
    if BF16:
        return v.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    return v


@triton.jit
def _rne(v):
    return (v + 12582912.0) - 12582912.0


@triton.jit
def _int_slab_kernel(x_ptr, q_ptr, s_ptr, z_ptr, R, K, G: tl.constexpr, BR: tl.constexpr, BITS: tl.constexpr,
                     SYM: tl.constexpr, BF16: tl.constexpr, EPS: tl.constexpr):
    pr = tl.program_id(0)
    pg = tl.program_id(1)
    groups = K // G
    rows = pr * BR + tl.arange(0, BR)
    live = rows < R
    cols = pg * G + tl.arange(0, G)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    QMIN: tl.constexpr = -(1 << (BITS - 1))
    QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
    lo = tl.minimum(tl.min(x, axis=1), 0.0)
    hi = tl.maximum(tl.max(x, axis=1), 0.0)
    if SYM:
        s = _rb(tl.math.div_rn(tl.maximum(-lo, hi), (QMAX - QMIN) / 2), BF16)
        z = tl.zeros([BR], dtype=tl.float32)
    else:
        s = _rb(tl.math.div_rn(_rb(hi - lo, BF16), QMAX - QMIN + 0.0), BF16)
        z = _rne(tl.minimum(tl.maximum(_rb(QMIN - _rb(tl.math.div_rn(lo, s), BF16), BF16), QMIN), QMAX))
        z = tl.where(s == 0.0, QMIN + 0.0, z)
    s = tl.where(s == 0.0, EPS, s)
    s = s.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    y = _rb(_rb(tl.math.div_rn(x, s[:, None]), BF16) + z[:, None], BF16)
    q = _rne(tl.minimum(tl.maximum(y, QMIN + 0.0), QMAX + 0.0)).to(tl.int32)
    tl.store(s_ptr + rows * groups + pg, s.to(tl.bfloat16), mask=live)
    if BITS == 4:
        shifts = (tl.arange(0, 8) * 4).to(tl.uint32)
        nib = tl.reshape((q + 8).to(tl.uint32), [BR, G // 8, 8])
        words = tl.sum(nib << shifts[None, None, :], axis=2).to(tl.int32, bitcast=True)
        wcols = pg * (G // 8) + tl.arange(0, G // 8)
        tl.store(q_ptr + rows[:, None] * (K // 8) + wcols[None, :], words, mask=live[:, None])
        if not SYM:
            zn = tl.reshape(tl.where(live, z.to(tl.int32) + 8, 0).to(tl.uint32), [BR // 8, 8])
            zw = tl.sum(zn << shifts[None, :], axis=1).to(tl.int32, bitcast=True)
            wrows = pr * (BR // 8) + tl.arange(0, BR // 8)
            tl.store(z_ptr + wrows * groups + pg, zw, mask=wrows < (R + 7) // 8)
    else:
        tl.store(q_ptr + rows[:, None] * K + cols[None, :], q.to(tl.int8), mask=live[:, None])
        if not SYM:
            tl.store(z_ptr + rows * groups + pg, z.to(tl.int8), mask=live)


def triton_int_slab(x: torch.Tensor, bits: int, group_size: int, symmetric: bool):
    """Same contract as intgroup.int_slab: rows [R, K] -> (qweight, scale, zero_point or None)."""
    if x.dtype not in _EPS:
        raise TypeError(f"triton_int_slab handles bf16/f32 weights, not {x.dtype}")
    rows, k = x.shape
    x = x.contiguous()
    dev = x.device
    q = torch.empty(rows, k // 8, dtype=torch.int32, device=dev) if bits == 4 else torch.empty(rows, k, dtype=torch.int8, device=dev)
    s = torch.empty(rows, k // group_size, dtype=torch.bfloat16, device=dev)
    z = None
    if not symmetric:
        z = torch.empty(-(-rows // 8), k // group_size, dtype=torch.int32, device=dev) if bits == 4 else \
            torch.empty(rows, k // group_size, dtype=torch.int8, device=dev)
    grid = (triton.cdiv(rows, _BR), k // group_size)
    _int_slab_kernel[grid](x, q, s, z if z is not None else s, rows, k, G=group_size, BR=_BR, BITS=bits,
                           SYM=symmetric, BF16=x.dtype == torch.bfloat16, EPS=_EPS[x.dtype])
    return q, s, z
