"""Gated DeltaNet's decode step (one token per sequence) on the GDN slab, in place: two Triton kernels
for what the torch form does in ~12 per layer (gather the conv windows and recurrent states by slot,
concatenate, depthwise conv, SiLU, split, the recurrent kernel, scatter both states back). At C = 1
the gather/scatter alone moved 2 x 3 MB per layer and token (profile: ~1 ms of a 11.4 ms step).

  conv_step:      window [K-1, C] of slot s and the new row x [C] -> silu(conv) [C]; the window
                  shifted by one row in place (its last row becomes x).
  recurrent_step: q/k L2-normalised (q also scaled by Dk^-0.5) and the gated delta rule on state
                  [Hv, Dk, Dv] of slot s, in place -> out [Hv, Dv].

The torch references are the model's own step (Qwen3_5._gdn_step: conv1d + gated_delta.step_reference)
over gathered copies; tests/kernels/test_gdn_decode.py compares the two on fresh random inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_step_kernel(x_ptr, window_ptr, weight_ptr, slots_ptr, out_ptr, C, KM1: tl.constexpr, BLOCK: tl.constexpr):
    b, cb = tl.program_id(0), tl.program_id(1)
    cols = cb * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    window = window_ptr + tl.load(slots_ptr + b) * KM1 * C
    x = tl.load(x_ptr + b * C + cols, mask=ok, other=0.0)
    acc = x.to(tl.float32) * tl.load(weight_ptr + cols * (KM1 + 1) + KM1, mask=ok, other=0.0).to(tl.float32)
    for j in tl.static_range(KM1):  # row j is read here, and overwritten only at j + 1 (by row j + 1)
        row = tl.load(window + j * C + cols, mask=ok, other=0.0)
        acc += row.to(tl.float32) * tl.load(weight_ptr + cols * (KM1 + 1) + j, mask=ok, other=0.0).to(tl.float32)
        if j > 0:
            tl.store(window + (j - 1) * C + cols, row, mask=ok)
    tl.store(window + (KM1 - 1) * C + cols, x, mask=ok)
    # as torch: the conv's output rounded to the input dtype, then SiLU in float and rounded again
    conv = acc.to(x.dtype, fp_downcast_rounding="rtne").to(tl.float32)
    tl.store(out_ptr + b * C + cols, (conv * tl.sigmoid(conv)).to(x.dtype, fp_downcast_rounding="rtne"), mask=ok)


def conv_step(x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """x [B, C] (new rows), windows [slots, K-1, C] (updated in place), depthwise weight [C, 1, K] in
    x's dtype, slots [B] -> silu(conv) [B, C] in x's dtype."""
    b, c = x.shape
    out = torch.empty_like(x)
    block = 256
    _conv_step_kernel[(b, triton.cdiv(c, block))](x.contiguous(), windows, weight.contiguous(), slots, out, c,
                                                  KM1=windows.shape[1], BLOCK=block)
    return out


@triton.jit
def _recurrent_step_kernel(conv_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, out_ptr, C, HK, HV, scale,
                           DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    b, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kh = h // (HV // HK)  # the value head's key head (transformers' repeat_interleave)
    dk = tl.arange(0, DK)
    dv = vb * BV + tl.arange(0, BV)
    row = conv_ptr + b * C
    q = tl.load(row + kh * DK + dk).to(tl.float32)
    k = tl.load(row + HK * DK + kh * DK + dk).to(tl.float32)
    v = tl.load(row + 2 * HK * DK + h * DV + dv).to(tl.float32)
    q = q * (1.0 / tl.sqrt(tl.sum(q * q, 0) + 1e-6)) * scale
    k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6))
    gate = tl.exp(tl.load(g_ptr + b * HV + h))
    beta = tl.load(beta_ptr + b * HV + h)
    s_ptrs = state_ptr + ((tl.load(slots_ptr + b) * HV + h) * DK + dk[:, None]) * DV + dv[None, :]
    s = tl.load(s_ptrs) * gate
    delta = (v - tl.sum(s * k[:, None], 0)) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(s_ptrs, s)
    tl.store(out_ptr + (b * HV + h) * DV + dv, tl.sum(s * q[:, None], 0).to(out_ptr.dtype.element_ty))


def recurrent_step(conv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                   slots: torch.Tensor, key_heads: int) -> torch.Tensor:
    """conv [B, 2*Hk*Dk + Hv*Dv] (q | k | v after the conv), g/beta [B, Hv] float32, states
    [slots, Hv, Dk, Dv] float32 (updated in place), slots [B] -> out [B, Hv, Dv] in conv's dtype."""
    b = conv.shape[0]
    _, hv, dk, dv = states.shape
    out = torch.empty(b, hv, dv, dtype=conv.dtype, device=conv.device)
    bv = min(32, dv)
    _recurrent_step_kernel[(b, hv, dv // bv)](conv.contiguous(), g.float().contiguous(), beta.float().contiguous(),
                                              states, slots, out, conv.shape[1], key_heads, hv, dk**-0.5,
                                              DK=dk, DV=dv, BV=bv)
    return out
