"""Gated DeltaNet's causal depthwise conv + SiLU over a prefill chunk as one Triton kernel (GPU).

The torch form (gated_delta.conv_silu_reference, the model's elsewhere) concatenates the sequence's last K-1 inputs before
the chunk, runs F.conv1d with groups = channels (aten's depthwise path: ~0.9 ms for an 8K chunk of
the 27B's 10,240 channels on the H200, stop 13's 100K profile: 0.55 s of 16.6 s) and SiLU: three
passes over [T, C] and a copy. Here each program reads a [BT, BC] tile and the K-1 rows above it
(from the history where they precede the chunk), accumulates in float32 and stores silu(conv) once.

Rounded as torch: the conv's sum rounded to the input dtype, SiLU in float32 and rounded again; the
float32 sum's order may differ from aten's (tests/kernels/test_gdn_conv.py: within one rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BT, BC = 64, 128  # rows and channels a program: 8K x 10,240 -> 128 x 80 programs


@triton.jit(do_not_specialize=["T"])  # chunk lengths vary: one compile for all (warmup.py)
def _causal_conv_silu_kernel(x_ptr, history_ptr, weight_ptr, out_ptr, out1_ptr, out2_ptr, T, C, x_row_stride, S1, S2,
                             KM1: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Channels [0, S1) go to out_ptr ([T, S1] rows), [S1, S2) to out1_ptr, [S2, C) to out2_ptr (S1 = S2 = C:
    all to out_ptr, [T, C])."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    live = (rows < T)[:, None] & (cols < C)[None, :]
    acc = tl.zeros((BT, BC), tl.float32)
    for i in tl.static_range(KM1 + 1):
        p = (rows + i)[:, None]  # the row of [history (K-1) | x (T)] that tap i reads
        before = tl.load(history_ptr + p * C + cols[None, :], mask=live & (p < KM1), other=0.0)
        inside = tl.load(x_ptr + (p - KM1).to(tl.int64) * x_row_stride + cols[None, :], mask=live & (p >= KM1),
                         other=0.0)
        w = tl.load(weight_ptr + cols * (KM1 + 1) + i, mask=cols < C, other=0.0).to(tl.float32)
        acc += (before + inside).to(tl.float32) * w[None, :]
    conv = acc.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne").to(tl.float32)
    r, c = rows.to(tl.int64)[:, None], cols[None, :]
    dest = tl.where(c < S1, out_ptr + r * S1 + c,
                    tl.where(c < S2, out1_ptr + r * (S2 - S1) + (c - S1), out2_ptr + r * (C - S2) + (c - S2)))
    tl.store(dest, (conv * tl.sigmoid(conv)).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=live)


def causal_conv_silu(x: torch.Tensor, history: torch.Tensor, weight: torch.Tensor,
                     sections: tuple[int, int, int] | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """x [T, C] (rows may be strided: a slice of a fused projection), history [K-1, C] (the inputs
    before x), depthwise weight [C, 1, K] -> silu(conv1d([history | x]))[T, C] contiguous, x's dtype:
    gated_delta.conv_silu_reference's contract. `sections` (three widths summing to C: the layer's q, k
    and v channels): the three column ranges instead, each its own contiguous [T, width] (fla's chunked
    kernel takes them as they are: no copy of each before it)."""
    t, c = x.shape
    km1 = weight.shape[-1] - 1
    if (history.shape != (km1, c) or weight.shape[0] != c or x.stride(1) != 1
            or (sections is not None and (len(sections) != 3 or sum(sections) != c))):
        raise ValueError(f"causal_conv_silu: x {tuple(x.shape)}, history {tuple(history.shape)}, weight "
                         f"{tuple(weight.shape)}, sections {sections} (want history [K-1, C], weight [C, 1, K], unit "
                         f"column stride, three sections summing to C)")
    widths = sections or (c, 0, 0)
    outs = [torch.empty(t, w, dtype=x.dtype, device=x.device) for w in widths if w]
    if t:
        pointers = outs if sections else outs * 3  # (unsplit: the one output stands for all three)
        _causal_conv_silu_kernel[(triton.cdiv(t, BT), triton.cdiv(c, BC))](
            x, history.to(x.dtype).contiguous(), weight.to(x.dtype).contiguous(), *pointers, t, c, x.stride(0),
            widths[0], widths[0] + widths[1], KM1=km1, BT=BT, BC=BC)
    return tuple(outs) if sections else outs[0]
