"""INT8 group-64 KV encoding: symmetric absmax per 64 consecutive head-dim values, fp16 scale.

8.25 bits per value (q8_0 class, near-lossless per shared/runtime.md §4). q = round(x / s) with
s = amax / 127 (0 -> 1), x' = q * s. Pure torch; the attention kernels read the same layout.
"""

from __future__ import annotations

import torch

GROUP = 64


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (D % 64 == 0) -> (int8 [..., D], fp16 scales [..., D/64])."""
    *lead, d = x.shape
    g = x.float().reshape(*lead, d // GROUP, GROUP)
    scale = (g.abs().amax(-1) / 127.0).to(torch.float16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(g / scale.float().unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q.reshape(*lead, d), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    *lead, d = q.shape
    g = q.float().reshape(*lead, d // GROUP, GROUP) * scale.float().unsqueeze(-1)
    return g.reshape(*lead, d).to(dtype)
