"""Triton kernels run compiled on a CUDA machine, in Triton's interpreter elsewhere (tests/conftest.py
sets it up)."""

import torch


def rounded_once(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """out (bf16) is the float32 reference rounded once: within a bf16 rounding of it everywhere (the
    float32 sums themselves differ by order only, ~1e-6 of the largest output)."""
    err = (out.float() - ref).abs()
    return bool((err <= ref.abs() * 2**-8 + 1e-5 * ref.abs().max()).all()) and not torch.isnan(out).any()
