"""Target layouts: how the logical parts of a quantized tensor are arranged on disk, and the exact inverse.

`blocked_128x4` is the scale-factor arrangement of cuBLASLt "1D block scaling factors layout",
CUTLASS `Sm1xxBlockScaledConfig` and torchao `to_blocked`; the sm_120a block-scaled
`mma.sync ... kind::mxf4nvf4 ... scale_vec::4X` path reads it (TMA copies 512-byte atoms). Byte of
scale (r, c) lands at
    ((r // 128) * ceil(C / 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
with rows padded to 128 and columns to 4 (zero-filled).

Everything else is `row_major` (C order). Targets choose per role:
    sm_120a: nvfp4 block_scale -> blocked_128x4, all other parts row_major (the FP4 weight is already
             the N x K K-major "B" operand the TN-only SM120 block-scaled MMA wants).
    sm_90a:  all row_major: Hopper has no FP4 MMA; its dequant kernels read 16-byte K-contiguous
             vectors of each row, which the row-major [N, K/2] weight and [N, K/16] scales give directly.
    linear:  all row_major (debugging).
"""

from __future__ import annotations

import torch


def layout_for(target: str, scheme_kind: str, role: str) -> str:
    if target == "sm_120a" and scheme_kind == "nvfp4" and role == "block_scale":
        return "blocked_128x4"
    return "row_major"


def blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """Stored 2-D shape of a rows x cols scale matrix in the 128x4 layout (torchao's view)."""
    return 32 * -(-rows // 128), 16 * -(-cols // 4)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] (1-byte dtype) -> blocked_128x4, shape blocked_shape(rows, cols)."""
    rows, cols = scales.shape
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    raw = scales.view(torch.uint8)
    padded = torch.zeros(rp, cp, dtype=torch.uint8, device=scales.device)
    padded[:rows, :cols] = raw
    out = padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(blocked_shape(rows, cols))
    return out.view(scales.dtype)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Exact inverse of to_blocked: blocked_128x4 -> [rows, cols]."""
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    raw = blocked.reshape(-1).view(torch.uint8)
    if raw.numel() != rp * cp:
        raise ValueError(f"blocked scales hold {raw.numel()} bytes, {rows}x{cols} needs {rp * cp}")
    grid = raw.view(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, cp)
    return grid[:rows, :cols].contiguous().view(blocked.dtype)


def blocked_offset(r: int, c: int, cols: int) -> int:
    """The byte offset formula itself, for tests and for kernels that index the layout directly."""
    return ((r // 128) * -(-cols // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def apply_layout(target: str, scheme_kind: str, role: str, logical: torch.Tensor) -> torch.Tensor:
    """Logical part -> the bytes stored for `target`."""
    if layout_for(target, scheme_kind, role) == "blocked_128x4":
        return to_blocked(logical)
    return logical.contiguous()


def undo_layout(layout: str, stored: torch.Tensor, logical_shape: tuple[int, ...]) -> torch.Tensor:
    """Stored part -> logical part (inverse of apply_layout)."""
    if layout == "blocked_128x4":
        return from_blocked(stored, *logical_shape)
    return stored
