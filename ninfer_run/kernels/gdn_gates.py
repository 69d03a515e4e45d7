"""Gated DeltaNet's per-token gates as one Triton kernel (GPU): log-decay g = -exp(A_log) *
softplus(a + dt_bias) and beta = sigmoid(b), both float32 [T, Hv]. The torch form
(gated_delta.gates_reference, what the model runs elsewhere) is ~9 small kernels per layer, 48
layers a decode step.

projected_gates also computes a and b = x @ [W_a; W_b]^T (the layer's bf16 in_proj_a/b) for decode rows:
one program per head and row loads its head's two weight rows (2 x K values) and that row of x, so a
layer's projection and gates are one launch of Hv x T programs instead of cuBLAS's split-K GEMV, its
reduce and the gates kernel (7.5 us a layer on the H200, stop 16). (One program per head taking the rows
one by one took 2.3 us a layer at one row and 10.2 at eight: C = 8's profile, stop 22.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import launch_dependents, programmatic, wait_for_inputs
from .gated_delta import MAX_PROJECTED_ROWS, projection_fits

PROJECTED_WARPS = 16  # a projected gate's warps (its sums' order: gdn_decode.conv_gates_step uses the same)


@triton.jit
def _gate_values(a, b, alog, dt):
    """a, b in the projection's dtype -> (g, beta) float32, as gates_reference computes them."""
    x = a.to(tl.float32) + dt
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold 20
    g = -tl.exp(alog) * softplus
    # sigmoid rounded to b's dtype, as torch's b.sigmoid() before .float()
    beta = tl.sigmoid(b.to(tl.float32)).to(b.dtype, fp_downcast_rounding="rtne").to(tl.float32)
    return g, beta


@triton.jit
def _gates_kernel(a_ptr, b_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, H, BLOCK: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(PDL)
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK)
    ok = h < H
    a = tl.load(a_ptr + row * H + h, mask=ok, other=0.0)
    b = tl.load(b_ptr + row * H + h, mask=ok, other=0.0)
    alog = tl.load(alog_ptr + h, mask=ok, other=0.0).to(tl.float32)
    g, beta = _gate_values(a, b, alog, tl.load(dt_ptr + h, mask=ok, other=0.0).to(tl.float32))
    tl.store(g_ptr + row * H + h, g, mask=ok)
    tl.store(beta_ptr + row * H + h, beta, mask=ok)


@triton.jit
def _projected_gates_kernel(x_ptr, w_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, K, H, BLOCK_K: tl.constexpr,
                            PDL: tl.constexpr):
    launch_dependents(PDL)
    projected_gate(x_ptr, w_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, K, H, tl.program_id(0), tl.program_id(1), BLOCK_K,
                   PDL)


@triton.jit
def projected_gate(x_ptr, w_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, K, H, h, t, BLOCK_K: tl.constexpr,
                   PDL: tl.constexpr):
    """Head h's gates of row t of x (row h of W_a, row H + h of W_b); waits for the kernel ahead (PDL) once
    its weights are loaded."""
    k = tl.arange(0, BLOCK_K)
    ok = k < K
    # the weights (written once, at load) are read while the kernel ahead may still run
    wa = tl.load(w_ptr + h * K + k, mask=ok, other=0.0).to(tl.float32)
    wb = tl.load(w_ptr + (H + h) * K + k, mask=ok, other=0.0).to(tl.float32)
    wait_for_inputs(PDL)
    x = tl.load(x_ptr + t * K + k, mask=ok, other=0.0)
    # the projection's output in x's dtype, as F.linear returns it, then the gates of gates_reference
    a = tl.sum(x.to(tl.float32) * wa, axis=0).to(x.dtype, fp_downcast_rounding="rtne")
    b = tl.sum(x.to(tl.float32) * wb, axis=0).to(x.dtype, fp_downcast_rounding="rtne")
    g, beta = _gate_values(a, b, tl.load(alog_ptr + h).to(tl.float32), tl.load(dt_ptr + h).to(tl.float32))
    tl.store(g_ptr + t * H + h, g)
    tl.store(beta_ptr + t * H + h, beta)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """gates_reference's contract: a, b [T, Hv] -> (g, beta) float32 [T, Hv], one kernel."""
    t, h = a.shape
    a, b = a.contiguous(), b.contiguous()
    g = torch.empty(t, h, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    _gates_kernel[(t,)](a, b, a_log.contiguous(), dt_bias.contiguous(), g, beta, h, BLOCK=triton.next_power_of_2(h),
                        **programmatic(a.device))
    return g, beta


def projected_gates(x: torch.Tensor, w_ab: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """gated_delta.projected_gates_reference's contract for T <= MAX_PROJECTED_ROWS rows: x [T, K] and
    the stacked [W_a; W_b] [2 Hv, K] (x's dtype) -> (g, beta) float32 [T, Hv], one kernel."""
    t, k = x.shape
    h = w_ab.shape[0] // 2
    if not projection_fits(x, w_ab):
        raise ValueError(f"projected_gates: at most {MAX_PROJECTED_ROWS} rows, weights in x's dtype")
    g = torch.empty(t, h, dtype=torch.float32, device=x.device)
    beta = torch.empty_like(g)
    _projected_gates_kernel[(h, t)](x.contiguous(), w_ab.contiguous(), a_log.contiguous(), dt_bias.contiguous(), g,
                                    beta, k, h, BLOCK_K=triton.next_power_of_2(k), num_warps=PROJECTED_WARPS,
                                    **programmatic(x.device))
    return g, beta
