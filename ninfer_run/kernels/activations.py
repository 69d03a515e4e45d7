"""SwiGLU's SiLU(gate) * up as one Triton kernel (GPU): torch takes two, with a full-size bf16 tensor
written and read back between them (at decode, one more launch per layer; in a prefill chunk, one
more pass over an [8K, 17408] tensor).

Same rounding points as torch's (layers.silu_mul_reference): SiLU in float32, rounded to the
activation dtype, then the product of two such values (exact in float32) rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import EARLY_LAUNCH, launch_dependents, programmatic, wait_for_inputs
from .norms import _round

BLOCK = 1024


@triton.jit(do_not_specialize=["n"])  # one compile for every chunk's length
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(EARLY)  # the down projection's GEMV streams its weights meanwhile
    wait_for_inputs(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    dtype = y_ptr.dtype.element_ty
    g = tl.load(g_ptr + i, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + i, mask=ok, other=0.0).to(tl.float32)
    silu = _round(g / (1.0 + tl.exp(-g)), dtype)
    tl.store(y_ptr + i, (silu * u).to(dtype, fp_downcast_rounding="rtne"), mask=ok)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """layers.silu_mul's contract, one kernel."""
    gate, up = gate.contiguous(), up.contiguous()
    y = torch.empty_like(gate)
    _silu_mul_kernel[(triton.cdiv(gate.numel(), BLOCK),)](gate, up, y, gate.numel(), BLOCK=BLOCK, EARLY=EARLY_LAUNCH,
                                                         **programmatic(gate.device))
    return y
