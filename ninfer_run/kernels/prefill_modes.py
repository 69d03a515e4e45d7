"""How a long prefill chunk's attention runs (kernels/paged_attention.dense_prefill): the modes, the
choice for a GPU, and whether that choice splits (what memory.py plans for). Apart from the kernels so
that a plan can be made where Triton is not installed."""

from __future__ import annotations

import os

import torch

# How a long chunk attends over its decoded K/V (NINFER_PREFILL_ATTENTION, read at each call; tools/bench_kernels.py
# --prefill-attention-ab times them): "masked", one SDPA call per KV head with a bottom-right causal mask
# (flash-attention 2, GQA); "split-flash" / "split-cudnn": the chunk's queries over the earlier keys with no mask,
# the group's heads folded into one head's rows (one long plain attention, by flash or by cuDNN's fused kernel),
# and over the chunk's own keys causal (square, flash), the two merged by their rows' log-sum-exps; "auto" (the
# default): split-cudnn on Hopper, masked elsewhere. H100, stop 36 (bench_prefill_attention_stop36_h100.json), an
# 8,192-token chunk of the 27B's heads after 16K / 49K / 100K tokens: masked 9.33 / 29.33 / 64.23 ms a layer,
# split-flash 8.94 / 30.31 / 62.22, split-cudnn 6.20 / 15.81 / 31.58 (611 TFLOP/s at 100K); cuDNN's first call at
# a shape (its plan build) 61-80 ms. Through the engine in one run (bench_stop36_h100.json): a 100K prompt's TTFT
# 13.19 s split-cudnn against 15.94 s masked, the next turns (2,049 new tokens, each a new shape) 0.43 / 0.44 s
# against 0.50 / 0.51. memory.py counts the split's transients (~4 bf16 rows of a query group a chunk token)
# where it runs.
MODES = ("auto", "masked", "split-flash", "split-cudnn")
# A split chunk's queries attend in pieces of at most SPLIT_ROWS rows, each over every key before it (cuDNN or
# flash, unmasked) and its own (causal): a chunk longer than this (--prefill-chunk 16384, which halves the
# linears' weight dequantizations) keeps the square causal part, flash's share, as an 8K chunk's, and the
# split's transient buffers at SPLIT_ROWS rows (memory.py).
SPLIT_ROWS = 8192
PREFILL_ATTENTION = os.environ.get("NINFER_PREFILL_ATTENTION", "auto")
if PREFILL_ATTENTION not in MODES:
    raise ValueError(f"NINFER_PREFILL_ATTENTION={PREFILL_ATTENTION!r}: one of {MODES}")
cudnn_refused: list[str] = []  # why cuDNN's attention failed on this machine (masked from then on)


def prefill_attention_mode(mode: str, capability: tuple[int, int] | None) -> str:
    """The mode a chunk runs: `mode`, "auto" resolved for the GPU's compute capability (None: not a GPU)."""
    if mode == "auto":
        mode = "split-cudnn" if capability is not None and capability[0] == 9 else "masked"
    return "masked" if mode == "split-cudnn" and cudnn_refused else mode


def splits_long_chunks() -> bool:
    """Whether long chunks on this machine's GPU take a split mode now (memory.py plans its buffers)."""
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return prefill_attention_mode(PREFILL_ATTENTION, capability) != "masked"


