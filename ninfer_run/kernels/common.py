"""Pieces the Triton kernels share: how far to split K, the split-K store, the early launch of the
kernel that follows, and a count of the kernel specializations a block of work first used."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents
except ImportError:  # a Triton without grid dependency control
    gdc_launch_dependents = None

# Whether launch_dependents can run: compiled Triton (not its interpreter) that has the instruction.
EARLY_LAUNCH = gdc_launch_dependents is not None and os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def launch_dependents(ENABLED: tl.constexpr):
    """Let the next kernel start now if it was launched as a programmatic dependent (the CUDA GEMVs,
    csrc/quant_gemv_sm90.cu): it streams its weights while this kernel runs and waits for this one's
    writes before it reads them. Any other next kernel waits for this one as usual."""
    if ENABLED:
        gdc_launch_dependents()


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


@contextlib.contextmanager
def counting_compiles() -> Iterator[Counter | None]:
    """Count, by kernel name, the Triton specializations first used inside the block (compiled, or loaded
    from Triton's disk cache): each is a pause of ~0.1-1 s that a request pays unless the warm-up ran it.
    Yields None on a Triton without the post-compile hook (not a count of zero)."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        yield None
        return
    counts: Counter = Counter()
    before = runtime.jit_post_compile_hook

    def hook(*, fn, **kwargs):
        counts[fn.name] += 1
        return before(fn=fn, **kwargs) if before is not None else None

    runtime.jit_post_compile_hook = hook
    try:
        yield counts
    finally:
        runtime.jit_post_compile_hook = before
