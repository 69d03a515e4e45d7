"""Gated DeltaNet's decode and verify steps (T tokens per sequence: 1, or a verify's draft count + 1)
on the GDN slab, in place: two Triton kernels for what the torch form does in ~12 per layer and token
(gather the conv windows and recurrent states by slot, concatenate, depthwise conv, SiLU, split, the
recurrent kernel, keep each token's states for a rollback, scatter both states back). At C = 1 the
gather/scatter alone moved 2 x 3 MB per layer and token (profile: ~1 ms of a 11.4 ms step).

  conv_step:      window [K-1, C] of slot s and the rows x [T, C] -> silu(conv) [T, C]; the window
                  advanced by T rows in place; with `keep`, the window after each token too.
  conv_gates_step: conv_step and the layer's gates (gdn_gates.projected_gates) in one launch, side by
                  side: a launch and a wait fewer a GDN layer (NINFER_GDN_CONV_GATES, on; H100, stop 38: the
                  C = 1 step's graph 7.14 -> 7.05 ms, C = 8 10.06 -> 10.04).
  recurrent_step: q/k L2-normalised (q also scaled by Dk^-0.5) and the gated delta rule, token by
                  token, on state [Hv, Dk, Dv] of slot s, in place -> out [T, Hv, Dv]; with `keep`,
                  the state after each token too.

The torch references are the model's own step (Qwen3_5._gdn_step: conv1d + gated_delta.step_reference)
over gathered copies; tests/kernels/test_gdn_decode.py compares the two on fresh random inputs.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .common import launch_dependents, programmatic, wait_for_inputs
from .gated_delta import MAX_PROJECTED_ROWS, projection_fits
from .gdn_gates import PROJECTED_WARPS, projected_gate

CONV_BLOCK = 256  # channels a conv program takes
# Whether a decode step's GDN layers take conv_gates_step (read at each call: bench.py --ab-conv-gates flips it)
CONV_GATES = os.environ.get("NINFER_GDN_CONV_GATES", "1") == "1"


@triton.jit
def _padded_row(window, x, p, C, cols, ok, KM1: tl.constexpr):
    """Row p of [window rows (K-1) | the new rows]: one of two masked loads (the other reads nothing)."""
    p = p + tl.zeros_like(cols)
    return (tl.load(window + p * C + cols, mask=ok & (p < KM1), other=0.0)
            + tl.load(x + (p - KM1) * C + cols, mask=ok & (p >= KM1), other=0.0))


@triton.jit
def _conv_step_kernel(x_ptr, window_ptr, weight_ptr, slots_ptr, out_ptr, keep_ptr, C, T, KEEP_STEPS,
                      KM1: tl.constexpr, KEEP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(PDL)
    wait_for_inputs(PDL)
    _conv_columns(x_ptr, window_ptr, weight_ptr, slots_ptr, out_ptr, keep_ptr, C, T, KEEP_STEPS, tl.program_id(0),
                  tl.program_id(1), KM1, KEEP, BLOCK)


@triton.jit
def _conv_columns(x_ptr, window_ptr, weight_ptr, slots_ptr, out_ptr, keep_ptr, C, T, KEEP_STEPS, b, cb,
                  KM1: tl.constexpr, KEEP: tl.constexpr, BLOCK: tl.constexpr):
    """Columns cb * BLOCK.. of sequence b's T rows: conv + SiLU out, its window advanced (and kept)."""
    cols = cb * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    slot = tl.load(slots_ptr + b)
    window = window_ptr + slot * KM1 * C
    x = x_ptr + b * T * C
    for j in range(T):
        acc = tl.zeros((BLOCK,), tl.float32)
        for i in tl.static_range(KM1 + 1):
            row = _padded_row(window, x, j + i, C, cols, ok, KM1)
            acc += row.to(tl.float32) * tl.load(weight_ptr + cols * (KM1 + 1) + i, mask=ok, other=0.0).to(tl.float32)
            if KEEP and i > 0:  # the window after token j: positions j + 1 .. j + K - 1
                tl.store(keep_ptr + ((slot * KEEP_STEPS + j) * KM1 + i - 1) * C + cols, row, mask=ok)
        # as torch: the conv's output rounded to the input dtype, then SiLU in float and rounded again
        conv = acc.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne").to(tl.float32)
        tl.store(out_ptr + (b * T + j) * C + cols,
                 (conv * tl.sigmoid(conv)).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=ok)
    # the window after the last token: positions T .. T + K - 2; row i is read (at T + i > i) before
    # it is written, ascending
    for i in tl.static_range(KM1):
        tl.store(window + i * C + cols, _padded_row(window, x, T + i, C, cols, ok, KM1), mask=ok)


@triton.jit
def _conv_gates_kernel(x_ptr, window_ptr, weight_ptr, slots_ptr, out_ptr, keep_ptr, C, T, KEEP_STEPS,
                       h_ptr, w_ab_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, K, H, CONV_BLOCKS,
                       KM1: tl.constexpr, KEEP: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr):
    """_conv_step_kernel's programs, then projected_gate's: sequence b's programs past CONV_BLOCKS take
    its T rows' H gates each."""
    launch_dependents(PDL)
    b, j = tl.program_id(0), tl.program_id(1)
    if j < CONV_BLOCKS:
        wait_for_inputs(PDL)
        _conv_columns(x_ptr, window_ptr, weight_ptr, slots_ptr, out_ptr, keep_ptr, C, T, KEEP_STEPS, b, j, KM1, KEEP,
                      BLOCK)
    else:
        gate = j - CONV_BLOCKS
        projected_gate(h_ptr, w_ab_ptr, alog_ptr, dt_ptr, g_ptr, beta_ptr, K, H, gate % H, b * T + gate // H, BLOCK_K,
                       PDL)


def conv_step(x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor, tokens: int = 1,
              keep: torch.Tensor | None = None) -> torch.Tensor:
    """x [B * tokens, C] (sequence-major rows), windows [slots, K-1, C] (advanced in place), depthwise
    weight [C, 1, K] in x's dtype, slots [B]; keep [slots, steps >= tokens, K-1, C]: gets the window
    after each token -> silu(conv) [B * tokens, C] in x's dtype."""
    rows, c = x.shape
    out = torch.empty_like(x)
    _conv_step_kernel[(rows // tokens, triton.cdiv(c, CONV_BLOCK))](
        x.contiguous(), windows, weight.contiguous(), slots, out, keep if keep is not None else windows, c, tokens,
        keep.shape[1] if keep is not None else 0, KM1=windows.shape[1], KEEP=keep is not None, BLOCK=CONV_BLOCK,
        **programmatic(x.device))
    return out


def conv_gates_step(x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor, h: torch.Tensor,
                    w_ab: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, tokens: int = 1,
                    keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """conv_step and gdn_gates.projected_gates(h, w_ab, a_log, dt_bias) (h: the layer's normed input, one
    row per row of x) in one launch: the two read different inputs, so their programs run side by side
    instead of one kernel after the other (a decode step's GDN layer: one launch and one wait fewer) ->
    (silu(conv), g, beta), each as the two kernels give it (the gates' programs take projected_gates' warps)."""
    rows, c = x.shape
    heads, k = w_ab.shape[0] // 2, h.shape[1]
    if h.shape[0] != rows or not projection_fits(h, w_ab):
        raise ValueError(f"conv_gates_step: at most {MAX_PROJECTED_ROWS} rows, one row of h a row of x, weights in "
                         "h's dtype")
    out = torch.empty_like(x)
    g = torch.empty(rows, heads, dtype=torch.float32, device=x.device)
    beta = torch.empty_like(g)
    block = 32 * PROJECTED_WARPS  # a channel a thread (the launch's warps are the gates')
    conv_blocks = triton.cdiv(c, block)
    _conv_gates_kernel[(rows // tokens, conv_blocks + tokens * heads)](
        x.contiguous(), windows, weight.contiguous(), slots, out, keep if keep is not None else windows, c, tokens,
        keep.shape[1] if keep is not None else 0, h.contiguous(), w_ab.contiguous(), a_log.contiguous(),
        dt_bias.contiguous(), g, beta, k, heads, conv_blocks, KM1=windows.shape[1], KEEP=keep is not None,
        BLOCK=block, BLOCK_K=triton.next_power_of_2(k), num_warps=PROJECTED_WARPS, **programmatic(x.device))
    return out, g, beta


@triton.jit
def _recurrent_step_kernel(conv_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, out_ptr, keep_ptr, C, T, KEEP_STEPS,
                           HK, HV, scale, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, KEEP: tl.constexpr,
                           PDL: tl.constexpr):
    launch_dependents(PDL)
    wait_for_inputs(PDL)
    b, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kh = h // (HV // HK)  # the value head's key head (transformers' repeat_interleave)
    dk = tl.arange(0, DK)
    dv = vb * BV + tl.arange(0, BV)
    slot = tl.load(slots_ptr + b)
    tile = (h * DK + dk[:, None]) * DV + dv[None, :]  # within one [Hv, Dk, Dv] state
    s_ptrs = state_ptr + slot * HV * DK * DV + tile
    s = tl.load(s_ptrs)
    for j in range(T):
        row = conv_ptr + (b * T + j) * C
        q = tl.load(row + kh * DK + dk).to(tl.float32)
        k = tl.load(row + HK * DK + kh * DK + dk).to(tl.float32)
        v = tl.load(row + 2 * HK * DK + h * DV + dv).to(tl.float32)
        q = q * (1.0 / tl.sqrt(tl.sum(q * q, 0) + 1e-6)) * scale
        k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6))
        s = s * tl.exp(tl.load(g_ptr + (b * T + j) * HV + h))
        delta = (v - tl.sum(s * k[:, None], 0)) * tl.load(beta_ptr + (b * T + j) * HV + h)
        s = s + k[:, None] * delta[None, :]
        tl.store(out_ptr + ((b * T + j) * HV + h) * DV + dv, tl.sum(s * q[:, None], 0).to(out_ptr.dtype.element_ty))
        if KEEP:  # the state after token j
            tl.store(keep_ptr + (slot * KEEP_STEPS + j) * HV * DK * DV + tile, s)
    tl.store(s_ptrs, s)


# A program's Dv columns and warps by the batch's sequences. Stop 33's sweep (H100, 27B heads, 48 layers
# in a graph, tools/results/bench_gdn_sweep_stop33_c1248_h100.json), us a layer, 16 x 1 against 32 x 4:
# C = 1 4.26 / 5.67, C = 2 6.37 / 7.51, C = 4 11.75 / 11.50 (best 32 x 1, 10.93), C = 8 24.82 / 21.89. In
# the engine's C = 1 step (decode profiles) 4.57 -> 4.33 us: its state slab reads faster than the sweep's.
SMALL_BATCH, SMALL_BATCH_LAUNCH, LAUNCH = 2, (16, {"num_warps": 1}), (32, {"num_warps": 4})


def recurrent_step(conv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states: torch.Tensor,
                   slots: torch.Tensor, key_heads: int, tokens: int = 1, keep: torch.Tensor | None = None,
                   value_block: int | None = None, launch_options: dict | None = None) -> torch.Tensor:
    """conv [B * tokens, 2*Hk*Dk + Hv*Dv] (q | k | v after the conv, sequence-major rows), g/beta
    [B * tokens, Hv] float32, states [slots, Hv, Dk, Dv] float32 (advanced in place), slots [B];
    keep [slots, steps >= tokens, Hv, Dk, Dv]: gets the state after each token -> out [B * tokens, Hv, Dv]
    in conv's dtype. A program takes `value_block` of a head's Dv columns (with all its Dk rows);
    `launch_options`: Triton's (num_warps, ...). Both default to the batch's (SMALL_BATCH_LAUNCH or
    LAUNCH); tools/bench_kernels.py --gdn-sweep tries the others."""
    rows = conv.shape[0]
    _, hv, dk, dv = states.shape
    out = torch.empty(rows, hv, dv, dtype=conv.dtype, device=conv.device)
    default_block, default_options = SMALL_BATCH_LAUNCH if rows // tokens <= SMALL_BATCH else LAUNCH
    bv = min(value_block or default_block, dv)
    launch_options = default_options if launch_options is None else launch_options
    _recurrent_step_kernel[(rows // tokens, hv, dv // bv)](
        conv.contiguous(), g.float().contiguous(), beta.float().contiguous(), states, slots, out,
        keep if keep is not None else states, conv.shape[1], tokens, keep.shape[1] if keep is not None else 0,
        key_heads, hv, dk**-0.5, DK=dk, DV=dv, BV=bv, KEEP=keep is not None, **launch_options,
        **programmatic(conv.device))
    return out
