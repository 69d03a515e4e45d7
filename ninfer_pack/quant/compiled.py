"""GPU quantization through torch.compile: the slab functions fused into a few Triton kernels.

Eager torch on a GPU runs ~20 memory passes per slab (38 GB/s measured on an H200); compiled, the
same code runs ~5x faster and gives the same bytes (checked by tests/quant/test_gpu.py). The CPU
keeps the eager path. If compilation fails (no Triton, an unsupported GPU), the eager function is
used and a warning says so once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache

import torch

log = logging.getLogger(__name__)


@cache
def slab_function(fn: Callable, device_type: str) -> Callable:
    if device_type != "cuda":
        return fn
    compiled = torch.compile(fn, dynamic=True)
    state = {"fn": compiled}

    def run(*args):
        try:
            return state["fn"](*args)
        except Exception as e:  # noqa: BLE001 - any compiler failure falls back to the same eager code
            if state["fn"] is fn:
                raise
            log.warning("torch.compile of %s failed (%s); quantizing with eager torch", fn.__name__, e)
            state["fn"] = fn
            return fn(*args)

    return run
