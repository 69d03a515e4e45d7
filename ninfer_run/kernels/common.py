"""Pieces the Triton kernels share: how far to split K, the split-K store, the early launch of the
kernel that follows, the programmatic launch of a kernel behind the one before it, and a count of the
kernel specializations a block of work first used."""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid dependency control
    gdc_launch_dependents = gdc_wait = None

# Whether launch_dependents can run: compiled Triton (not its interpreter) that has the instruction.
EARLY_LAUNCH = gdc_launch_dependents is not None and os.environ.get("TRITON_INTERPRET") != "1"
try:  # whether this Triton's launcher takes launch_pdl (a compile option since Triton 3.3)
    from triton.backends.nvidia.compiler import CUDAOptions
    _HAS_LAUNCH_PDL = "launch_pdl" in CUDAOptions.__dataclass_fields__
except ImportError:
    _HAS_LAUNCH_PDL = False
# Whether the Triton kernels of a step launch as programmatic dependents (NINFER_TRITON_PDL=0: as plain
# launches). Read at each launch (bench.py --ab-triton-pdl flips it; a graph keeps what it captured).
TRITON_PDL = os.environ.get("NINFER_TRITON_PDL", "1") != "0"


@triton.jit
def launch_dependents(ENABLED: tl.constexpr):
    """Let the next kernel start now if it was launched as a programmatic dependent (the CUDA GEMVs,
    csrc/quant_gemv_sm90.cu): it streams its weights while this kernel runs and waits for this one's
    writes before it reads them. Any other next kernel waits for this one as usual."""
    if ENABLED:
        gdc_launch_dependents()


@triton.jit
def wait_for_inputs(ENABLED: tl.constexpr):
    """A kernel launched as a programmatic dependent starts before the kernel ahead of it has finished:
    it waits here, before its first read or write of memory that kernel (or any before it) may touch,
    for that kernel's end and its writes. Every program passes here first, early exits included: a
    kernel that could end before the one ahead of it would let the next one's wait pass too early."""
    if ENABLED:
        gdc_wait()


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def programmatic(device: torch.device) -> dict:
    """A step kernel's launch arguments: PDL (its constexpr: wait_for_inputs and launch_dependents run)
    and Triton's launch_pdl, both on for compiled Triton on a Hopper or later GPU while TRITON_PDL.
    A plain launch starts only once the kernel ahead has ended and the launch has gone through (~2.6 us
    a boundary between a persistent GEMV and a Triton kernel: gpu_notes stop 25), and a decode step
    has ~250 such boundaries; a programmatic one is resident and waiting when the kernel ahead ends
    (H100, stop 36, adjacent runs: C = 1 131.6 -> 137.1 tok/s, the step's graph 7.33 -> 7.15 ms)."""
    on = (TRITON_PDL and EARLY_LAUNCH and _HAS_LAUNCH_PDL and device.type == "cuda"
          and _hopper_or_later(device.index if device.index is not None else torch.cuda.current_device()))
    return {"PDL": on, "launch_pdl": True} if on else {"PDL": False}


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
