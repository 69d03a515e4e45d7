"""Gated DeltaNet's per-token gates as one Triton kernel (GPU): log-decay g = -exp(A_log) *
softplus(a + dt_bias) and beta = sigmoid(b), both float32 [T, Hv]. The torch form
(gated_delta.gates_reference, what the model runs elsewhere) is ~9 small kernels per layer, 48
layers a decode step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gates_kernel(a_ptr, b_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, H, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK)
    ok = h < H
    a = tl.load(a_ptr + row * H + h, mask=ok, other=0.0).to(tl.float32)
    x = a + tl.load(dt_ptr + h, mask=ok, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold 20
    g = -tl.exp(tl.load(alog_ptr + h, mask=ok, other=0.0).to(tl.float32)) * softplus
    b = tl.load(b_ptr + row * H + h, mask=ok, other=0.0)
    # sigmoid rounded to b's dtype, as torch's b.sigmoid() before .float()
    beta = tl.sigmoid(b.to(tl.float32)).to(b.dtype, fp_downcast_rounding="rtne").to(tl.float32)
    tl.store(g_ptr + row * H + h, g, mask=ok)
    tl.store(beta_ptr + row * H + h, beta, mask=ok)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """gates_reference's contract: a, b [T, Hv] -> (g, beta) float32 [T, Hv], one kernel."""
    t, h = a.shape
    a, b = a.contiguous(), b.contiguous()
    g = torch.empty(t, h, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    _gates_kernel[(t,)](a, b, a_log.contiguous(), dt_bias.contiguous(), g, beta, h, BLOCK=triton.next_power_of_2(h))
    return g, beta
