"""NVFP4 weight quantization, byte-exact with NVIDIA ModelOpt's `NVFP4QTensor.quantize` (dynamic path).

For W [N, K] (K % 16 == 0), in float32:
    s2    = amax(|W|) / (6 * 448)                    global scale, *decode* direction
    s     = amax16(|W|) / (6 * s2);  s[s == 0] = 1    per block of 16 along K
    s8    = e4m3(clamp(s, 2**-9, 448))               round-to-nearest-even
    y     = W / (float(s8) * s2)
    code  = sign(y) << 3 | rne_e2m1(|y|)             ties to even; > 6 saturates to 6; -0 -> +0
An all-zero tensor (group) gets s2 = 1, where ModelOpt would divide by zero.
Tensors fused at run time (q/k/v, gate/up, in_proj_qkv/z) pass one shared s2 (`global_scale_of`),
as ModelOpt and vLLM require. The work runs over row chunks so temporaries stay cache-sized and
memory stays bounded whatever the tensor size; CPU and CUDA give the same bytes.
"""

from __future__ import annotations

from functools import cache

import torch

from ninfer_format.quants import FP4_MAX, FP8_E4M3_MAX, NVFP4_GROUP, pack_nibbles

from .checked import checked

# Row slabs: cache-sized on the CPU; on a GPU large enough that kernel launches do not dominate.
_ROW_CHUNK_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 26}


class NonFiniteWeight(ValueError):
    """A weight holds NaN or Inf; no NVFP4/int reference handles them, so we refuse up front."""


def abs_max(w: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """max |w| as float32 in one pass (aminmax); NaN/Inf make it non-finite, so this is also the
    finiteness check (NonFiniteWeight)."""
    lo, hi = torch.aminmax(w)
    amax = torch.maximum(lo.abs(), hi).float()
    if not bool(torch.isfinite(amax)):
        bad = int((~torch.isfinite(w)).sum())
        raise NonFiniteWeight(f"{name}: {bad} non-finite value(s) (NaN/Inf); refusing to quantize")
    return amax


def global_scale_of(tensors: list[torch.Tensor], names: list[str] | None = None) -> torch.Tensor:
    """Shared decode-direction global scale s2 = max amax / 2688, float32 scalar on the CPU."""
    names = names or ["weight"] * len(tensors)
    amax = torch.stack([abs_max(t, n).cpu() for t, n in zip(tensors, names)]).amax()
    if amax == 0:  # all zeros: any positive s2 decodes to 0 (ModelOpt would produce NaN scales here)
        return torch.tensor(1.0)
    return amax / (FP4_MAX * FP8_E4M3_MAX)


def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """float32 -> uint8 E2M1 codes, round-half-to-even onto the grid, > 6 saturating.

    Equal to ModelOpt's `_cast_fp4` (searchsorted over [.25,.75,1.25,1.75,2.5,3.5,5] + tie fix) but
    ~2x faster: adding then subtracting C = 2^(e+22) (e = the binade of |y|, at least 0) makes the
    float32 adder itself round |y| to 1 mantissa bit with ties to even, i.e. onto the E2M1 grid
    (spacing 0.5 below 2, 1 below 4, 2 above). The grid value's exponent/mantissa bits are the code.
    The sign comes from y < 0, so -0.0 encodes as +0 like ModelOpt.
    """
    a = y.abs().clamp_(max=FP4_MAX)
    c = (a.view(torch.int32) & 0x7F800000).clamp_(min=0x3F800000).add_(22 << 23).view(torch.float32)
    grid = (a + c).sub_(c)
    top = (grid.view(torch.int32) >> 22).to(torch.int16)  # 0 for 0.0, 252 for 0.5, 254 + code - 2 above
    code = (top - 253).clamp_(min=0).add_(top >= 252).to(torch.uint8)
    code |= (y < 0).to(torch.uint8) << 3
    return code


def _block_amax(x: torch.Tensor) -> torch.Tensor:
    """amax over the last dim (16) by pairwise maxima: faster than amax(-1) on a short inner dim."""
    a = x.abs()
    while a.shape[-1] > 1:
        half = a.shape[-1] // 2
        a = torch.maximum(a[..., :half], a[..., half:])
    return a.squeeze(-1)


def quantize_slab(x: torch.Tensor, s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [R, K] of a weight -> (packed codes u8 [R, K/2], block scales e4m3 [R, K/16])."""
    rows, k = x.shape
    b = x.float().view(rows, k // NVFP4_GROUP, NVFP4_GROUP)
    s = _block_amax(b) / (FP4_MAX * s2)
    s = torch.where(s == 0, torch.ones_like(s), s)
    s8 = s.clamp(min=2**-9, max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    y = b / (s8.float() * s2).unsqueeze(-1)
    return pack_nibbles(_e2m1_codes(y.view(rows, k))), s8


@cache
def _gpu_slab():
    """The Triton kernel, checked against quantize_slab once per shape; eager torch without Triton."""
    try:
        from .nvfp4_triton import triton_slab
    except ImportError:
        return quantize_slab
    return checked(quantize_slab, triton_slab)


def quantize_nvfp4(w: torch.Tensor, s2: torch.Tensor | None = None, name: str = "weight"):
    """W [N, K] -> (qweight u8 [N, K/2], block_scale e4m3 [N, K/16], s2 f32 scalar), all on W's device."""
    if w.ndim != 2 or w.shape[1] % NVFP4_GROUP:
        raise ValueError(f"{name}: NVFP4 needs a 2-D weight with K % 16 == 0, got {list(w.shape)}")
    n, k = w.shape
    if s2 is None:
        s2 = global_scale_of([w], [name])
    else:
        abs_max(w, name)  # the caller's shared s2 came from the group; still refuse NaN/Inf here
    s2_dev = s2.to(w.device, torch.float32)
    qweight = torch.empty(n, k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(n, k // NVFP4_GROUP, dtype=torch.float8_e4m3fn, device=w.device)
    rows = max(1, _ROW_CHUNK_ELEMENTS[w.device.type] // k)
    slab = _gpu_slab() if w.device.type == "cuda" else quantize_slab
    for r0 in range(0, n, rows):
        qweight[r0 : r0 + rows], scales[r0 : r0 + rows] = slab(w[r0 : r0 + rows], s2_dev)
    return qweight, scales, s2_dev.reshape(())
