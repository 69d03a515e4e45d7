"""NVFP4 slab quantization as one Triton kernel (GPU), bit-exact with `nvfp4.quantize_slab`.

The pure-torch `quantize_slab` is the reference; tests/quant/test_gpu.py compares the two on fresh
random inputs. Exactness hinges on IEEE division: Triton's fp32 `/` is approximate, so both
divisions use `div_rn` (torch.compile's Inductor code used `/` and differed from eager on ~0.1% of
codes on an H200). Each program quantizes BLOCKS groups of 16 consecutive K elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCKS = 128


@triton.jit
def _nvfp4_slab_kernel(x_ptr, q_ptr, s_ptr, s2_ptr, n_blocks, BLOCKS: tl.constexpr):
    blk = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    live = blk < n_blocks
    x = tl.load(x_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    s2 = tl.load(s2_ptr)
    s = tl.math.div_rn(tl.max(tl.abs(x), axis=1), 6.0 * s2)
    s = tl.where(s == 0.0, 1.0, s)
    s8 = tl.minimum(tl.maximum(s, 0.001953125), 448.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    y = tl.math.div_rn(x, (s8.to(tl.float32) * s2)[:, None])
    a = tl.abs(y)
    code = (a > 0.25).to(tl.uint8) + (a >= 0.75).to(tl.uint8) + (a > 1.25).to(tl.uint8) + (a >= 1.75).to(tl.uint8)
    code = code + (a > 2.5).to(tl.uint8) + (a >= 3.5).to(tl.uint8) + (a > 5.0).to(tl.uint8)
    code = code | ((y < 0).to(tl.uint8) << 3)
    even, odd = tl.split(tl.reshape(code, [BLOCKS, 8, 2]))
    tl.store(q_ptr + blk[:, None] * 8 + tl.arange(0, 8)[None, :], even | (odd << 4), mask=live[:, None])
    tl.store(s_ptr + blk, s8, mask=live)


def triton_slab(x: torch.Tensor, s2: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Same contract as nvfp4.quantize_slab: rows [R, K] -> (packed u8 [R, K/2], scales e4m3 [R, K/16])."""
    rows, k = x.shape
    x = x.contiguous()
    packed, scales = out if out is not None else (
        torch.empty(rows, k // 2, dtype=torch.uint8, device=x.device),
        torch.empty(rows, k // 16, dtype=torch.float8_e4m3fn, device=x.device))
    n_blocks = rows * k // 16
    _nvfp4_slab_kernel[(triton.cdiv(n_blocks, _BLOCKS),)](x, packed, scales, s2.reshape(1).float(), n_blocks, BLOCKS=_BLOCKS)
    return packed, scales
