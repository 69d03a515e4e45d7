"""Groupwise integer weight quantization (int4 / int8, symmetric or zero-point), round-to-nearest.

Matches compressed-tensors `calculate_qparams` + `pack-quantized` bit for bit, including its
arithmetic in the weight's own dtype (a bf16 weight gets bf16-rounded scales and a bf16-rounded
x / scale before rounding; float32 weights stay in float32). Per group of G along K:
    symmetric:  scale = max(|min|, |max|) / ((2^b - 1) / 2),   z = 0
    asymmetric: scale = (max - min) / (2^b - 1),   z = round(clamp(-2^(b-1) - min / scale))
    scale == 0 -> dtype eps;  q = clamp(round(x / scale + z), -2^(b-1), 2^(b-1) - 1)
with min <= 0 <= max enforced first (zero is always representable). An all-zero group gets
scale = eps and z = -2^(b-1) under zero-point mode, so it dequantizes to exact zeros. Scales are
stored in bf16 (compressed-tensors stores the model dtype, bf16 for every registered model); a
float32 source's scale is rounded to bf16 before q is computed so the stored parts agree.
"""

from __future__ import annotations

from functools import cache

import torch

from ninfer_format.quants import pack_int32

from .checked import checked
from .nvfp4 import abs_max

# Row slabs: cache-sized on the CPU; on a GPU large enough that kernel launches do not dominate.
_ROW_CHUNK_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 26}


def _in(dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """Round a float32 result to `dtype`, then widen again: one torch op in that dtype, on any device."""
    return x.to(dtype).float() if dtype in (torch.bfloat16, torch.float16) else x


def int_slab(x: torch.Tensor, bits: int, group_size: int, symmetric: bool):
    """Rows [R, K] (R a multiple of 8 except the last slab) -> (qweight, scale, zero_point or None) slabs."""
    rows, k = x.shape
    dt = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.float32
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    g = x.float().view(rows, k // group_size, group_size)
    lo = g.amin(-1).clamp(max=0)
    hi = g.amax(-1).clamp(min=0)
    if symmetric:
        s = _in(dt, torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2))
        z = torch.zeros_like(s)
    else:
        s = _in(dt, _in(dt, hi - lo) / (qmax - qmin))
        z = torch.round(_in(dt, qmin - _in(dt, lo / s)).clamp(qmin, qmax))
        z = torch.where(s == 0, torch.full_like(z, qmin), z)
    s = torch.where(s == 0, torch.full_like(s, torch.finfo(dt).eps), s)
    s = s.to(torch.bfloat16).float()  # scales are stored in bf16; q must be computed with the stored value
    y = _in(dt, _in(dt, g / s.unsqueeze(-1)) + z.unsqueeze(-1))
    q = torch.round(y.clamp(qmin, qmax)).view(rows, k).to(torch.int8)
    qweight = pack_int32(q, 4, 1) if bits == 4 else q
    zp = None
    if not symmetric:
        zp = pack_int32(z.to(torch.int8), 4, 0) if bits == 4 else z.to(torch.int8)
    return qweight, s.to(torch.bfloat16), zp


@cache
def _gpu_slab():
    """The Triton kernel, checked against int_slab once per shape; eager torch without Triton."""
    try:
        from .int_triton import triton_int_slab
    except ImportError:
        return int_slab
    return checked(int_slab, triton_int_slab)


def quantize_int(w: torch.Tensor, bits: int, group_size: int, symmetric: bool, name: str = "weight"):
    """W [N, K] -> dict of parts: qweight, scale (and zero_point) in the stored encoding."""
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ValueError(f"{name}: int{bits} group {group_size} needs a 2-D weight with K % {group_size} == 0, "
                         f"got {list(w.shape)}")
    abs_max(w, name)  # refuses NaN/Inf with the tensor's name
    n, k = w.shape
    per_word = 32 // bits if bits == 4 else 1
    qweight = torch.empty(n, k // per_word, dtype=torch.int32 if bits == 4 else torch.int8, device=w.device)
    scale = torch.empty(n, k // group_size, dtype=torch.bfloat16, device=w.device)
    zp = None if symmetric else torch.empty(-(-n // per_word), k // group_size, dtype=qweight.dtype, device=w.device)
    rows = max(8, _ROW_CHUNK_ELEMENTS[w.device.type] // k // 8 * 8)  # a multiple of 8: zero points pack 8 rows per word
    # the Triton kernel is proven on bf16 weights (every registered checkpoint's dtype); on float32
    # weights it differed from the reference at 4096 x 5120 on the H200 (cause not found), so those stay in torch
    slab = _gpu_slab() if w.device.type == "cuda" and w.dtype == torch.bfloat16 else int_slab
    for r0 in range(0, n, rows):
        q, s, z = slab(w[r0 : r0 + rows], bits, group_size, symmetric)
        qweight[r0 : r0 + rows], scale[r0 : r0 + rows] = q, s
        if zp is not None:
            zp[r0 // per_word : r0 // per_word + z.shape[0]] = z
    parts = {"qweight": qweight, "scale": scale}
    if zp is not None:
        parts["zero_point"] = zp
    return parts
