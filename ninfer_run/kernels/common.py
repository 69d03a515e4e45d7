"""Pieces the Triton weight kernels share: how far to split K, and the split-K store."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def split_k(x: torch.Tensor, n_blocks: int, k_steps: int, programs: int | None) -> int:
    """Split K (a power of two, at most k_steps) until about `programs` programs run; by default four
    per multiprocessor, so a thin decode GEMV still fills the GPU."""
    if programs is None:
        programs = torch.cuda.get_device_properties(x.device).multi_processor_count * 4 if x.is_cuda else 1
    split = 1
    while n_blocks * split * 2 <= programs and split * 2 <= k_steps:
        split *= 2
    return split


@triton.jit
def store_or_add(ptrs, values, mask, SPLIT_K: tl.constexpr):
    """A single K slice stores; split-K slices add into a zeroed fp32 output."""
    if SPLIT_K == 1:
        tl.store(ptrs, values, mask=mask)
    else:
        tl.atomic_add(ptrs, values, mask=mask)
