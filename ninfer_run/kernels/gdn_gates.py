"""Gated DeltaNet's per-token gates as one Triton kernel (GPU): log-decay g = -exp(A_log) *
softplus(a + dt_bias) and beta = sigmoid(b), both float32 [T, Hv]. The torch form
(gated_delta.gates_reference, what the model runs elsewhere) is ~9 small kernels per layer, 48
layers a decode step.

At decode (few rows) a and b = x @ W_ab^T (in_proj_a | in_proj_b, bf16, [2 Hv, hidden]) are computed in
the same kernel (projected_gates): cuBLAS ran that 1 MB product as a split-K matmul plus its reduce,
7.5 us a layer and step with the gates kernel (tools/results/decode_profile_h200.txt)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PROJECTED_MAX_ROWS = 16  # more rows (prefill) take cuBLAS's matmul, then gdn_gates


@triton.jit
def _store_gates(a, b, h, ok, alog_ptr, dt_ptr, g_ptr, beta_ptr, row, H, dtype: tl.constexpr):
    """a, b: float32 values of `dtype` for heads h -> g and beta at row `row`."""
    x = a + tl.load(dt_ptr + h, mask=ok, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold 20
    g = -tl.exp(tl.load(alog_ptr + h, mask=ok, other=0.0).to(tl.float32)) * softplus
    # sigmoid rounded to b's dtype, as torch's b.sigmoid() before .float()
    beta = tl.sigmoid(b).to(dtype, fp_downcast_rounding="rtne").to(tl.float32)
    tl.store(g_ptr + row * H + h, g, mask=ok)
    tl.store(beta_ptr + row * H + h, beta, mask=ok)


@triton.jit
def _gates_kernel(a_ptr, b_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, H, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK)
    ok = h < H
    a = tl.load(a_ptr + row * H + h, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * H + h, mask=ok, other=0.0).to(tl.float32)
    _store_gates(a, b, h, ok, alog_ptr, dt_ptr, g_ptr, beta_ptr, row, H, b_ptr.dtype.element_ty)


@triton.jit
def _projected_gates_kernel(x_ptr, w_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, H, K,
                            HEADS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (row, head block): a and b of HEADS heads, their weight rows (h and H + h) read once."""
    row, hb = tl.program_id(0), tl.program_id(1)
    h = hb * HEADS + tl.arange(0, HEADS)
    ok = h < H
    acc_a = tl.zeros((HEADS, BLOCK_K), tl.float32)
    acc_b = tl.zeros((HEADS, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kok = k < K
        x = tl.load(x_ptr + row * K + k, mask=kok, other=0.0).to(tl.float32)[None, :]
        wmask = ok[:, None] & kok[None, :]
        acc_a += x * tl.load(w_ptr + h[:, None] * K + k[None, :], mask=wmask, other=0.0).to(tl.float32)
        acc_b += x * tl.load(w_ptr + (H + h[:, None]) * K + k[None, :], mask=wmask, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty  # a and b rounded to it, as the linear's output is
    a = tl.sum(acc_a, 1).to(dtype, fp_downcast_rounding="rtne").to(tl.float32)
    b = tl.sum(acc_b, 1).to(dtype, fp_downcast_rounding="rtne").to(tl.float32)
    _store_gates(a, b, h, ok, alog_ptr, dt_ptr, g_ptr, beta_ptr, row, H, dtype)


def _outputs(t: int, h: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.empty(t, h, dtype=torch.float32, device=device)
    return g, torch.empty_like(g)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """gates_reference's contract: a, b [T, Hv] -> (g, beta) float32 [T, Hv], one kernel."""
    t, h = a.shape
    a, b = a.contiguous(), b.contiguous()
    g, beta = _outputs(t, h, a.device)
    _gates_kernel[(t,)](a, b, a_log.contiguous(), dt_bias.contiguous(), g, beta, h, BLOCK=triton.next_power_of_2(h))
    return g, beta


def projected_gates(x: torch.Tensor, w_ab: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """gated_delta.projected_gates_reference's contract for x [T <= PROJECTED_MAX_ROWS, hidden]: one kernel."""
    t, k = x.shape
    h = w_ab.shape[0] // 2
    g, beta = _outputs(t, h, x.device)
    heads = 2  # 24 programs a row for Hv = 48: each reads 2 x 2 weight rows (40 KB at hidden 5120)
    _projected_gates_kernel[(t, triton.cdiv(h, heads))](x.contiguous(), w_ab.contiguous(), a_log.contiguous(),
                                                        dt_bias.contiguous(), g, beta, h, k, HEADS=heads, BLOCK_K=1024)
    return g, beta
