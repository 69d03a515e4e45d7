"""NVFP4 weights x bf16/fp16 activations on Hopper (Triton), reading the sm_90a artifact layout as is:
codes u8 [N, K/2] (element 2i in the low nibble), block scales e4m3 [N, K/16], global scale s2 (f32).

  decode, M <= 16: `gemv` streams the weight once; a code times its block scale is exact in bf16/fp16
      (2 + 4 significant bits), so the tensor cores take the dequantized tile with no rounding, and
      s2 multiplies the fp32 accumulator at the end. K is split across programs for parallelism.
  prefill, M > 16: `dequantize` writes bf16 [N, K] once (rounded like `reference_dequantize`), then the
      matmul runs in cuBLAS at full tensor-core rate.
E2M1 and E4M3 decode by bit placement: their bits shifted into an fp16's exponent/mantissa give the
value times 2^-14 / 2^-8 exactly (subnormals included); one power-of-two multiply undoes both.
`reference` (pure torch) is what tests compare against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_format.quants import dequantize_nvfp4

from .common import split_k, store_or_add


def reference(x: torch.Tensor, qweight, block_scale, global_scale) -> torch.Tensor:
    """x [M, K] -> [M, N] in float32 (dequantize, then matmul)."""
    return x.float() @ dequantize_nvfp4(qweight, block_scale, global_scale).T


def reference_dequantize(qweight, block_scale, global_scale, dtype=torch.bfloat16) -> torch.Tensor:
    return dequantize_nvfp4(qweight, block_scale, global_scale).to(dtype)


@triton.jit
def _e2m1_times_2m14(code):
    """int32 codes 0..15 -> fp32 value * 2^-14 (exact)."""
    bits = ((code & 8) << 12) | ((code & 7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_times_2m8(byte):
    """int32 E4M3 bytes -> fp32 value * 2^-8 (exact; the exponent and mantissa bits placed in an fp16)."""
    bits = ((byte & 0x80) << 8) | ((byte & 0x7F) << 7)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, q_ptr, s_ptr, s2_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    half = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        n_ok = rn[:, None] < N
        codes = tl.load(q_ptr + rn[:, None] * (K // 2) + (k0 // 2 + half)[None, :], mask=n_ok, other=0).to(tl.int32)
        # one scale per 16 values: decoded once per block, then spread over its 8 code bytes
        blocks = tl.load(s_ptr + rn[:, None] * (K // 16) + (k0 // 16 + tl.arange(0, BLOCK_K // 16))[None, :],
                         mask=n_ok, other=0)
        blocks = _e4m3_times_2m8(blocks.to(tl.int32)) * 4194304.0  # 2^22: undoes both 2^-14 and 2^-8
        scale = tl.reshape(tl.broadcast_to(blocks[:, :, None], (BLOCK_N, BLOCK_K // 16, 8)), (BLOCK_N, BLOCK_K // 2))
        lo = (_e2m1_times_2m14(codes & 15) * scale).to(x_ptr.dtype.element_ty)
        hi = (_e2m1_times_2m14(codes >> 4) * scale).to(x_ptr.dtype.element_ty)
        m_ok = rm[:, None] < M
        x_even = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + 2 * half)[None, :], mask=m_ok, other=0)
        x_odd = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + 2 * half + 1)[None, :], mask=m_ok, other=0)
        acc += tl.dot(x_even, tl.trans(lo)) + tl.dot(x_odd, tl.trans(hi))
    out = acc * tl.load(s2_ptr)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    store_or_add(ptrs, out, mask, SPLIT_K)


@triton.jit
def _rotate_left(word, n):
    """uint32 words rotated left by n (0..31; 0: word | word)."""
    return (word << n) | (word >> ((32 - n) & 31))


@triton.jit
def _dequant_kernel(q_ptr, s_ptr, s2_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    TILED: tl.constexpr):
    """TILED: codes and scales in cuda_ops.tile_nvfp4's layout: code byte b of row n sits in tile
    (n // 16, b // 64) at (n % 16) // 8 * 512 + lane (4 (n % 8) + (b % 64) // 16) * 16 + b % 16; block
    scale j of row n in tile (n // 16, j // 8) at lane (4 (n % 8) + (j % 8) // 2) * 4 + (n % 16) // 8 * 2 + j % 2.
    The byte's two elements are view b % 4 of its 32-bit word (cuda_ops.ELEMENT_BITS): rotated left by
    (0, 4, 10, 14)[view] the word holds the first element's e0 e1 at bits 7-8 and its sign at 15, the
    second's at 23-24 and 31; m0 at 6 and 22 after a rotation by (0, 4, 10, 6)[view] (as the GEMV's fp4_view)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    ok = (rn[:, None] < N) & (half[None, :] < K // 2)
    if TILED:
        tile = (rn[:, None] // 16) * (K // 128) + half[None, :] // 64
        hi_rows, g, block = (rn[:, None] % 16) // 8, rn[:, None] % 8, half[None, :] // 8
        q_off = tile * 1024 + hi_rows * 512 + (4 * g + (half[None, :] % 64) // 16) * 16 + half[None, :] % 16
        s_off = tile * 128 + (4 * g + (block % 8) // 2) * 4 + hi_rows * 2 + block % 2
        view = half[None, :] % 4
        word = tl.load((q_ptr + q_off - view).to(tl.pointer_type(tl.int32)), mask=ok, other=0)
        word = word.to(tl.uint32, bitcast=True)
        turn = tl.where(view == 0, 0, tl.where(view == 1, 4, tl.where(view == 2, 10, 14))).to(tl.uint32)
        r, r_m0 = _rotate_left(word, turn), _rotate_left(word, tl.where(view == 3, 6, turn).to(tl.uint32))
        low = (((r_m0 >> 6) & 1) | ((r >> 6) & 6) | (((r >> 15) & 1) << 3)).to(tl.int32)
        high = (((r_m0 >> 22) & 1) | ((r >> 22) & 6) | (((r >> 31) & 1) << 3)).to(tl.int32)
    else:
        s_off = rn[:, None] * (K // 16) + (half // 8)[None, :]
        codes = tl.load(q_ptr + rn[:, None] * (K // 2) + half[None, :], mask=ok, other=0).to(tl.int32)
        low, high = codes & 15, codes >> 4
    scale = _e4m3_times_2m8(tl.load(s_ptr + s_off, mask=ok, other=0).to(tl.int32)) * 256.0
    per_block = scale * tl.load(s2_ptr)  # the reference's order: (block scale * s2), then times the value
    lo = _e2m1_times_2m14(low) * 16384.0 * per_block
    hi = _e2m1_times_2m14(high) * 16384.0 * per_block
    values = tl.join(lo, hi).reshape(BLOCK_N, BLOCK_K)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(w_ptr + rn[:, None] * K + rk[None, :], values.to(w_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
             mask=(rn[:, None] < N) & (rk[None, :] < K))


def _f32(scalar: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The global scale as a 1-element f32 tensor on the kernel's device (read there: no host sync once
    the weight lives on the device, as the loader puts it)."""
    return scalar.reshape(1).to(device=device, dtype=torch.float32)


def gemv(x: torch.Tensor, qweight, block_scale, global_scale, block_n: int = 64, block_k: int | None = None,
         programs: int | None = None) -> torch.Tensor:
    """x [M <= 16, K] (bf16/fp16) -> y [M, N] float32. K steps of 256 (or the largest of 128, 64, 32
    dividing K)."""
    m, k = x.shape
    n = qweight.shape[0]
    block_k = block_k or next((b for b in (256, 128, 64, 32) if k % b == 0), 256)
    if m > 16 or k % block_k or block_k % 32:
        raise ValueError(f"gemv takes M <= 16 and K % {block_k} == 0, got M={m}, K={k}")
    x = x.contiguous()
    split = split_k(x, triton.cdiv(n, block_n), k // block_k, programs)
    y = (torch.zeros if split > 1 else torch.empty)(m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, block_n), split)
    _gemv_kernel[grid](x, qweight, block_scale.view(torch.uint8), _f32(global_scale, x.device), y, m, n, k,
                       x.stride(0), y.stride(0), BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split)
    return y


def dequantize(qweight, block_scale, global_scale, out: torch.Tensor | None = None, dtype=torch.bfloat16,
               block_n: int = 64, block_k: int = 256, tiled_shape: tuple[int, int] | None = None,
               num_warps: int = 4) -> torch.Tensor:
    """-> [N, K] in `dtype` (into `out` when given, e.g. a reused prefill buffer). `tiled_shape`: (N, K) of
    qweight, block_scale in cuda_ops.tile_nvfp4's layout. A program takes block_n x block_k values on
    num_warps warps (tools/bench_kernels.py --prefill-small-ops times others)."""
    n, k = tiled_shape or (qweight.shape[0], qweight.shape[1] * 2)
    w = out if out is not None else torch.empty(n, k, dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _dequant_kernel[grid](qweight, block_scale.view(torch.uint8), _f32(global_scale, qweight.device), w, n, k,
                          BLOCK_N=block_n, BLOCK_K=block_k, TILED=tiled_shape is not None, num_warps=num_warps)
    return w
