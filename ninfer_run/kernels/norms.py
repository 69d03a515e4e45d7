"""RMSNorm (alone, after the residual add, or followed by an attention layer's partial RoPE) and the
Gated DeltaNet output norm as one Triton kernel each (GPU): the torch versions in
layers.py take ~9 small kernels per call, and a 27B decode step makes ~210 of these calls
(tools/results/decode_profile_h200.txt: host launch overhead dominates decode).

Same rounding points as the references (layers.rms_norm_reference / gated_rms_norm_reference, transformers'
order): statistics in float32; a zero-centred (offset) weight multiplies in float32 before the cast,
a plain weight multiplies the already-cast value; the gate's SiLU is in float32. Sums may associate
differently from torch's, so results agree to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import EARLY_LAUNCH, launch_dependents, programmatic, wait_for_inputs


@triton.jit
def _round(v, dtype: tl.constexpr):
    """float32 -> `dtype` (round to nearest even, as torch casts) -> float32."""
    return v.to(dtype, fp_downcast_rounding="rtne").to(tl.float32)


@triton.jit
def _weighted(normed, w_ptr, d, ok, offset, dtype: tl.constexpr, OFFSET: tl.constexpr, IN_DTYPE: tl.constexpr):
    """The normalized values times the weight (at columns d), as the reference rounds them."""
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    if OFFSET:
        y = normed * (offset + w)
    elif IN_DTYPE:  # weight and cast value multiplied in the activation dtype (rounded)
        y = _round(_round(w, dtype) * _round(normed, dtype), dtype)
    else:  # a float32 weight promotes the product to float32
        y = w * _round(normed, dtype)
    return y


@triton.jit
def norm_row(x_ptr, w_ptr, g_ptr, y_ptr, h_ptr, s_ptr, cos_ptr, sin_ptr, row, D, X_STRIDE, eps, offset, HEADS, RD,
             BLOCK: tl.constexpr, OFFSET: tl.constexpr, GATED: tl.constexpr, IN_DTYPE: tl.constexpr,
             RESIDUAL: tl.constexpr, ROPE: tl.constexpr):
    """Row `row` of x (X_STRIDE apart; the other tensors' rows D apart): normed, as the flags say, into y."""
    d = tl.arange(0, BLOCK)
    y = normed_row(x_ptr, w_ptr, g_ptr, y_ptr, h_ptr, s_ptr, cos_ptr, sin_ptr, row, D, X_STRIDE, eps, offset, HEADS, RD,
                   BLOCK, OFFSET, GATED, IN_DTYPE, RESIDUAL, ROPE)
    tl.store(y_ptr + row * D + d, y.to(y_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=d < D)


@triton.jit
def normed_row(x_ptr, w_ptr, g_ptr, y_ptr, h_ptr, s_ptr, cos_ptr, sin_ptr, row, D, X_STRIDE, eps, offset, HEADS, RD,
               BLOCK: tl.constexpr, OFFSET: tl.constexpr, GATED: tl.constexpr, IN_DTYPE: tl.constexpr,
               RESIDUAL: tl.constexpr, ROPE: tl.constexpr):
    """norm_row's values [BLOCK] in float32, not stored (y_ptr gives their dtype; with RESIDUAL the sum is
    stored to s_ptr)."""
    d = tl.arange(0, BLOCK)
    ok = d < D
    dtype = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * X_STRIDE + d, mask=ok, other=0.0).to(tl.float32)
    if RESIDUAL:  # the residual sum x + h, rounded as torch's add rounds it, is stored and normalized
        x = _round(x + tl.load(h_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32), dtype)
        tl.store(s_ptr + row * D + d, x.to(dtype), mask=ok)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    y = _weighted(x * rstd, w_ptr, d, ok, offset, dtype, OFFSET, IN_DTYPE)
    if ROPE:  # layers.apply_rope on the normed row (NeoX halves over the first RD columns), as it rounds
        half = RD // 2
        partner = tl.where(d < half, d + half, tl.where(d < RD, d - half, d))  # the rotate_half source
        xp = tl.load(x_ptr + row * X_STRIDE + partner, mask=ok, other=0.0).to(tl.float32)
        yp = _round(_weighted(xp * rstd, w_ptr, partner, ok, offset, dtype, OFFSET, IN_DTYPE), dtype)
        t = row // HEADS  # rows are [token, head]
        rot = d < RD
        cos = tl.load(cos_ptr + t * RD + d, mask=rot, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + t * RD + d, mask=rot, other=0.0).to(tl.float32)
        rotated = tl.where(d < half, -yp, yp)
        roped = _round(_round(_round(y, dtype) * cos, dtype) + _round(rotated * sin, dtype), dtype)
        y = tl.where(rot, roped, y)
    if GATED:
        g = tl.load(g_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
        y = y * (g / (1.0 + tl.exp(-g)))
    return y


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, g_ptr, y_ptr, h_ptr, s_ptr, cos_ptr, sin_ptr, D, X_STRIDE, eps, offset, HEADS, RD,
                     BLOCK: tl.constexpr, OFFSET: tl.constexpr, GATED: tl.constexpr, IN_DTYPE: tl.constexpr,
                     RESIDUAL: tl.constexpr, ROPE: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(EARLY)  # the GEMV after the norm streams its weights meanwhile
    wait_for_inputs(PDL)
    norm_row(x_ptr, w_ptr, g_ptr, y_ptr, h_ptr, s_ptr, cos_ptr, sin_ptr, tl.program_id(0), D, X_STRIDE, eps, offset,
             HEADS, RD, BLOCK, OFFSET, GATED, IN_DTYPE, RESIDUAL, ROPE)


@triton.jit(do_not_specialize=["R"])
def _narrow_rows_kernel(x_ptr, w_ptr, g_ptr, y_ptr, R, D, X_STRIDE, eps, offset, BLOCK: tl.constexpr,
                        ROWS: tl.constexpr, OFFSET: tl.constexpr, GATED: tl.constexpr, IN_DTYPE: tl.constexpr,
                        EARLY: tl.constexpr, PDL: tl.constexpr):
    """_rms_norm_kernel's plain and gated norms (no residual, no RoPE) for ROWS narrow rows a program: a
    prefill chunk's GDN output norm is 48 rows of 128 a token, ~393K one-row programs of 4 warps an 8K chunk."""
    launch_dependents(EARLY)
    wait_for_inputs(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BLOCK)[None, :]
    ok = (r[:, None] < R) & (d < D)
    dtype = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + r[:, None] * X_STRIDE + d, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
    y = _weighted(x * rstd[:, None], w_ptr, d, d < D, offset, dtype, OFFSET, IN_DTYPE)
    if GATED:
        g = tl.load(g_ptr + r[:, None] * D + d, mask=ok, other=0.0).to(tl.float32)
        y = y * (g / (1.0 + tl.exp(-g)))
    tl.store(y_ptr + r[:, None] * D + d, y.to(dtype, fp_downcast_rounding="rtne"), mask=ok)


@triton.jit(do_not_specialize=["Q_ROWS"])  # the chunk's q rows: one compile for any chunk length
def _qk_norm_rope_kernel(q_ptr, k_ptr, wq_ptr, wk_ptr, yq_ptr, yk_ptr, cos_ptr, sin_ptr, Q_ROWS, D, Q_STRIDE, K_STRIDE,
                         eps, offset, Q_HEADS, K_HEADS, RD, BLOCK: tl.constexpr, OFFSET: tl.constexpr,
                         IN_DTYPE: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    """An attention layer's q rows (programs 0 .. Q_ROWS - 1), then its k rows: each normed and roped."""
    launch_dependents(EARLY)
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    if row < Q_ROWS:
        norm_row(q_ptr, wq_ptr, q_ptr, yq_ptr, q_ptr, yq_ptr, cos_ptr, sin_ptr, row, D, Q_STRIDE, eps, offset, Q_HEADS,
                 RD, BLOCK, OFFSET, False, IN_DTYPE, False, True)
    else:
        norm_row(k_ptr, wk_ptr, k_ptr, yk_ptr, k_ptr, yk_ptr, cos_ptr, sin_ptr, row - Q_ROWS, D, K_STRIDE, eps, offset,
                 K_HEADS, RD, BLOCK, OFFSET, False, IN_DTYPE, False, True)


def row_warps(d: int) -> int:
    """One program normalizes a row: 4 warps up to 1K columns, 8 for wider rows (a 5120-wide hidden
    row then takes 20 values a thread, not 40)."""
    return 4 if d <= 1024 else 8


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as rows [R, D]: a view where they are evenly spaced (Qwen3.5's q: every other head_dim of
    the q/gate projection), read in place by the kernels; a copy otherwise."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


# Rows of at most NARROW_COLUMNS columns, NARROW_MIN_ROWS or more of them (a prefill chunk's, not a decode
# step's: those keep one row a program), go ROWS_PER_PROGRAM to a program (_narrow_rows_kernel).
NARROW_COLUMNS, NARROW_MIN_ROWS, ROWS_PER_PROGRAM = 256, 2048, 32


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, gate: torch.Tensor | None,
            in_dtype: bool, residual: torch.Tensor | None = None, rope: tuple | None = None):
    """-> normed (and, with `residual`, first the sum x + residual that was normalized); `rope`: (cos,
    sin) [T, RD] for x [T, H, D], applied to the normed rows; x's rows read where they are (_rows)."""
    d = x.shape[-1]
    x2 = _rows(x)
    g2 = gate.reshape(-1, d).contiguous() if gate is not None else x2
    if residual is None and rope is None and d <= NARROW_COLUMNS and x2.shape[0] >= NARROW_MIN_ROWS:
        y = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
        _narrow_rows_kernel[(triton.cdiv(x2.shape[0], ROWS_PER_PROGRAM),)](
            x2, weight.contiguous(), g2, y, x2.shape[0], d, x2.stride(0), eps, float(offset),
            BLOCK=triton.next_power_of_2(d), ROWS=ROWS_PER_PROGRAM, OFFSET=bool(offset), GATED=gate is not None,
            IN_DTYPE=in_dtype, EARLY=EARLY_LAUNCH, num_warps=4, **programmatic(x.device))
        return y.view(x.shape)
    h2 = residual.reshape(-1, d).contiguous() if residual is not None else x2
    cos, sin = (t.contiguous() for t in rope) if rope is not None else (x2, x2)
    y = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
    s = torch.empty_like(y) if residual is not None else y
    _rms_norm_kernel[(x2.shape[0],)](x2, weight.contiguous(), g2, y, h2, s, cos, sin, d, x2.stride(0), eps,
                                     float(offset),
                                     x.shape[-2] if rope is not None else 1, cos.shape[-1] if rope is not None else 0,
                                     BLOCK=triton.next_power_of_2(d), OFFSET=bool(offset), GATED=gate is not None,
                                     IN_DTYPE=in_dtype, RESIDUAL=residual is not None, ROPE=rope is not None,
                                     EARLY=EARLY_LAUNCH, num_warps=row_warps(d), **programmatic(x.device))
    return (s.view(x.shape), y.view(x.shape)) if residual is not None else y.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """layers.rms_norm's contract, one kernel."""
    return _launch(x, weight, eps, offset, None, in_dtype=True)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cos: torch.Tensor,
                  sin: torch.Tensor) -> torch.Tensor:
    """layers.rms_norm_rope's contract (q/k norm, then partial RoPE), one kernel."""
    return _launch(x, weight, eps, offset, None, in_dtype=True, rope=(cos, sin))


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 offset: float, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_rope of an attention layer's q [T, Hq, D] and k [T, Hk, D] in one launch (a step's q and k
    norms were two, with a strided copy of q before the first)."""
    d = q.shape[-1]
    q2, k2 = _rows(q), _rows(k)
    yq = torch.empty(q2.shape, dtype=q.dtype, device=q.device)
    yk = torch.empty(k2.shape, dtype=k.dtype, device=k.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    _qk_norm_rope_kernel[(q2.shape[0] + k2.shape[0],)](
        q2, k2, q_weight.contiguous(), k_weight.contiguous(), yq, yk, cos, sin, q2.shape[0], d, q2.stride(0),
        k2.stride(0), eps, float(offset), q.shape[-2], k.shape[-2], cos.shape[-1], BLOCK=triton.next_power_of_2(d),
        OFFSET=bool(offset), IN_DTYPE=True, EARLY=EARLY_LAUNCH, num_warps=row_warps(d), **programmatic(q.device))
    return yq.view(q.shape), yk.view(k.shape)


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """layers.add_rms_norm's contract (the residual sum and its norm), one kernel."""
    return _launch(x, weight, eps, offset, None, in_dtype=True, residual=h)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """layers.gated_rms_norm's contract (plain weight, then times SiLU(gate)), one kernel."""
    return _launch(x, weight, eps, 0.0, gate, in_dtype=weight.dtype == x.dtype)
