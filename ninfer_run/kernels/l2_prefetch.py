"""A decode step's next GEMV's weights pulled into L2 while the small kernels before it run (GPU).

Between a layer's input projection and its output projection a decode step runs only small kernels (a GDN
layer: gates, conv, recurrence, gated norm, ~10 us; an attention layer: q/k norm, KV write, attention),
and DRAM idles while they do. This kernel, launched right after the input projection, waits for it to
end, then asks L2 for every 128-byte line of the output projection's weights (`prefetch.global.L2::evict_last`:
no registers, nothing waits for the lines) and ends; the small kernels run while the lines arrive, and
the output projection's GEMV then reads them from L2. Its weights (~18 MB for the 27B's NVFP4 out_proj
or o_proj) fit the H100's and H200's 50 MB L2. Off until measured (NINFER_L2_PREFETCH=1 on; read at
each call, so bench.py --ab-l2-prefetch flips it; a graph keeps what it captured). Results never depend
on it: a prefetch only moves bytes."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .common import EARLY_LAUNCH, launch_dependents, programmatic, wait_for_inputs

L2_PREFETCH = os.environ.get("NINFER_L2_PREFETCH", "0") == "1"
LINE = 128  # bytes a prefetch asks for


@triton.jit(do_not_specialize=["a_lines", "b_lines"])
def _prefetch_kernel(a_ptr, a_lines, b_ptr, b_lines, LINE: tl.constexpr, BLOCK: tl.constexpr, EARLY: tl.constexpr,
                     PDL: tl.constexpr):
    """The LINE-byte lines of two tensors (a's, then b's), BLOCK a program at a time, strided over the programs."""
    launch_dependents(EARLY)  # the step's next kernel need not wait for the prefetches to be asked
    wait_for_inputs(PDL)  # after the input projection: its own weight stream is over by then
    for first in range(tl.program_id(0) * BLOCK, a_lines + b_lines, tl.num_programs(0) * BLOCK):
        line = first + tl.arange(0, BLOCK)
        in_a = line < a_lines
        a_line = tl.minimum(line, a_lines - 1)  # (clamped: every address asked for is the tensors')
        b_line = tl.minimum(tl.maximum(line - a_lines, 0), b_lines - 1)
        address = tl.where(in_a, a_ptr + a_line.to(tl.int64) * LINE, b_ptr + b_line.to(tl.int64) * LINE)
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [address],
                                  dtype=tl.int32, is_pure=False, pack=1)


def prefetch(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Ask L2 for a's and b's bytes (a weight's codes and scales) once the kernel ahead has ended; -> whether
    it launched (L2_PREFETCH, compiled Triton, CUDA tensors)."""
    if not (L2_PREFETCH and EARLY_LAUNCH and a.is_cuda and b.is_cuda):
        return False
    a, b = (t.reshape(-1).view(torch.uint8) for t in (a, b))  # byte addresses whatever the dtypes
    programs = torch.cuda.get_device_properties(a.device).multi_processor_count
    _prefetch_kernel[(programs,)](a, -(-a.numel() // LINE), b, -(-b.numel() // LINE), LINE=LINE, BLOCK=128,
                                  EARLY=EARLY_LAUNCH, num_warps=4, **programmatic(a.device))
    return True
