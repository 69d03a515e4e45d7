"""Groupwise int4/int8 weights x bf16/fp16 activations on Hopper (Triton), reading the artifact's
compressed-tensors `pack-quantized` parts as they are: int4 codes i32 [N, K/8] (element j of a word
at bits 4j, offset-binary), int8 codes i8 [N, K]; scales [N, K/G]; asymmetric zero points (int4:
i32 [ceil(N/8), K/G] packed along N; int8: i8 [N, K/G]).

  decode, M <= 16: `gemv` takes one quantization group per K step, so each row has one scale and
      one zero point per tile: (q - z) is a small integer (exact in bf16/fp16), the tensor cores sum
      x * (q - z), and the fp32 partial sum is scaled once per group.
  prefill, M > 16: `dequantize` to bf16 (rounded like `reference_dequantize`), then cuBLAS.
`reference` (pure torch) is what tests compare against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_format.quants import dequantize_int

from .common import split_k, store_or_add


def reference(x: torch.Tensor, qweight, scale, zero_point, bits: int, group: int) -> torch.Tensor:
    n, k = qweight.shape[0], x.shape[1]
    return x.float() @ dequantize_int(qweight, scale, zero_point, bits, group, (n, k)).T


def reference_dequantize(qweight, scale, zero_point, bits: int, group: int, k: int, dtype=torch.bfloat16):
    return dequantize_int(qweight, scale, zero_point, bits, group, (qweight.shape[0], k)).to(dtype)


@triton.jit
def _zero_points(z_ptr, rn, g, N, GROUPS, BITS: tl.constexpr, HAS_ZP: tl.constexpr):
    """Zero point of each row in `rn` for group g (0 when symmetric)."""
    if HAS_ZP:
        if BITS == 4:
            word = tl.load(z_ptr + (rn // 8) * GROUPS + g, mask=rn < N, other=0)
            return ((word >> (4 * (rn % 8))) & 15) - 8
        return tl.load(z_ptr + rn * GROUPS + g, mask=rn < N, other=0).to(tl.int32)
    return tl.zeros_like(rn)


@triton.jit
def _gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                 GROUP: tl.constexpr, BITS: tl.constexpr, HAS_ZP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    groups = K // GROUP
    n_ok, m_ok = rn[:, None] < N, rm[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(pid_k, groups, SPLIT_K):
        k0 = g * GROUP
        z = _zero_points(z_ptr, rn, g, N, groups, BITS, HAS_ZP)
        if BITS == 4:  # unpack the group's words to [BLOCK_N, GROUP] in K order (element 8w + j at bits 4j)
            words = tl.load(q_ptr + rn[:, None] * (K // 8) + (k0 // 8 + tl.arange(0, GROUP // 8))[None, :],
                            mask=n_ok, other=0)
            nibbles = (words[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 15
            codes = tl.reshape(nibbles, [BLOCK_N, GROUP]) - 8
        else:
            codes = tl.load(q_ptr + rn[:, None] * K + (k0 + tl.arange(0, GROUP))[None, :], mask=n_ok, other=0)
        w = (codes.to(tl.int32) - z[:, None]).to(x_ptr.dtype.element_ty)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + tl.arange(0, GROUP))[None, :], mask=m_ok, other=0)
        part = tl.dot(x, tl.trans(w))
        scale = tl.load(s_ptr + rn * groups + g, mask=rn < N, other=0).to(tl.float32)
        acc += part * scale[None, :]
    mask = m_ok & (rn[None, :] < N)
    ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    store_or_add(ptrs, acc, mask, SPLIT_K)


@triton.jit
def _dequant_kernel(q_ptr, s_ptr, z_ptr, w_ptr, N, K, GROUP: tl.constexpr, BITS: tl.constexpr,
                    HAS_ZP: tl.constexpr, BLOCK_N: tl.constexpr, TILED: tl.constexpr):
    """TILED (4 bits, group 128): cuda_ops.tile_int4's layout: word w of row n (K values 8w .. 8w + 7) in
    tile (n // 16, w // 16) at (n % 16) // 8 * 128 + (4 (n % 8) + (w % 16) // 4) * 4 + w % 4; s_ptr the
    tiles' records as int16 (row n's scale at 2 (n % 8) + (n % 16) // 8), z_ptr the same bytes (its zero
    point's nibble in byte 32 + n % 8)."""
    pid_n, g = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    groups = K // GROUP
    rk = g * GROUP + tl.arange(0, GROUP)
    n_ok = rn[:, None] < N
    if TILED:
        w, r = (rk // 8)[None, :], rn[:, None]
        offset = ((r // 16) * (K // 128) + w // 16) * 256 + (r % 16) // 8 * 128 + (4 * (r % 8) + (w % 16) // 4) * 4 + w % 4
        words = tl.load(q_ptr + offset, mask=n_ok, other=0)
        q = ((words >> (4 * (rk % 8))[None, :]) & 15) - 8
    elif BITS == 4:
        words = tl.load(q_ptr + rn[:, None] * (K // 8) + (rk // 8)[None, :], mask=n_ok, other=0)
        q = ((words >> (4 * (rk % 8))[None, :]) & 15) - 8
    else:
        q = tl.load(q_ptr + rn[:, None] * K + rk[None, :], mask=n_ok, other=0).to(tl.int32)
    if TILED:
        tile, half, row = (rn // 16) * groups + g, (rn % 16) // 8, rn % 8
        bits = tl.load(s_ptr + tile * 20 + 2 * row + half, mask=rn < N, other=0)
        scale = bits.to(tl.bfloat16, bitcast=True).to(tl.float32)
        z = ((tl.load(z_ptr + tile * 40 + 32 + row, mask=rn < N, other=0).to(tl.int32) >> (4 * half)) & 15) - 8
    else:
        z = _zero_points(z_ptr, rn, g, N, groups, BITS, HAS_ZP)
        scale = tl.load(s_ptr + rn * groups + g, mask=rn < N, other=0).to(tl.float32)
    values = (q - z[:, None]).to(tl.float32) * scale[:, None]
    tl.store(w_ptr + rn[:, None] * K + rk[None, :], values.to(w_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
             mask=n_ok)


def gemv(x: torch.Tensor, qweight, scale, zero_point, bits: int, group: int, block_n: int = 64,
         programs: int | None = None) -> torch.Tensor:
    """x [M <= 16, K] (bf16/fp16) -> y [M, N] float32."""
    m, k = x.shape
    n = qweight.shape[0]
    if m > 16 or k % group or bits not in (4, 8):
        raise ValueError(f"gemv takes M <= 16, K % {group} == 0 and 4 or 8 bits, got M={m}, K={k}, bits={bits}")
    x = x.contiguous()
    split = split_k(x, triton.cdiv(n, block_n), k // group, programs)
    y = (torch.zeros if split > 1 else torch.empty)(m, n, dtype=torch.float32, device=x.device)
    zp = zero_point if zero_point is not None else scale  # unused when symmetric
    _gemv_kernel[(triton.cdiv(n, block_n), split)](
        x, qweight, scale, zp, y, m, n, k, x.stride(0), y.stride(0), GROUP=group, BITS=bits,
        HAS_ZP=zero_point is not None, BLOCK_M=16, BLOCK_N=block_n, SPLIT_K=split)
    return y


def dequantize(qweight, scale, zero_point, bits: int, group: int, k: int, out: torch.Tensor | None = None,
               dtype=torch.bfloat16, block_n: int = 64, tiled: bool = False) -> torch.Tensor:
    """-> [N, K] in `dtype` (into `out` when given). `tiled`: cuda_ops.tile_int4's (codes, records, None)."""
    n = qweight.shape[0] * (16 if tiled else 1)
    if tiled and (bits, group) != (4, 128):
        raise ValueError(f"the tiled layout is int4 in groups of 128, got {bits} bits in groups of {group}")
    if tiled and zero_point is not None:
        raise ValueError("the tiled layout keeps the zero points in its records (tile_int4): zero_point None")
    w = out if out is not None else torch.empty(n, k, dtype=dtype, device=qweight.device)
    if tiled:  # the records: their scales as int16, their zero points' bytes
        scale, zp = scale.view(torch.int16), scale
    else:
        zp = zero_point if zero_point is not None else scale
    _dequant_kernel[(triton.cdiv(n, block_n), k // group)](
        qweight, scale, zp, w, n, k, GROUP=group, BITS=bits, HAS_ZP=zero_point is not None, BLOCK_N=block_n,
        TILED=tiled)
    return w
