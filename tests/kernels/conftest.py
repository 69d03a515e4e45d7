"""Triton kernels run compiled on a CUDA machine, in Triton's interpreter elsewhere (tests/conftest.py
sets it up)."""

import torch


def rounded_once(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """out (bf16) is the float32 reference rounded once: within a bf16 rounding of it everywhere (the
    float32 sums themselves differ by order only, ~1e-6 of the largest output)."""
    err = (out.float() - ref).abs()
    return bool((err <= ref.abs() * 2**-8 + 1e-5 * ref.abs().max()).all()) and not torch.isnan(out).any()


def within_one_rounding(got: torch.Tensor, want: torch.Tensor) -> bool:
    """bf16 `got` is `want` or a neighbour of it (one bf16 spacing at want's magnitude)."""
    spacing = torch.ldexp(torch.ones_like(want, dtype=torch.float32), torch.frexp(want.float()).exponent - 8)
    return bool(((got.float() - want.float()).abs() <= spacing).all())
