"""The sm_120a block-scaled FP4 GEMM (csrc/nvfp4_mma_sm120a.cu): its CPU emulation and reference.

No RTX 5090 is at hand, so the kernel's indexing is proven on the CPU: `emulate` runs the kernel's
per-lane index helpers (tests/kernels check them equal to the .cu's own expressions) to gather each
lane's registers from the artifact's bytes exactly as the kernel loads them, gives the registers the
meaning the hardware does (the m16n8k64 block-scaled fragment layouts, as CUTLASS's SM120 MMA traits
define them), multiplies in float64 and scatters the accumulators as the kernel stores them. With
exact products and sums, the result equals `reference` bit for bit only if every index is right.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ninfer_format.layouts import blocked_offset
from ninfer_format.quants import E2M1_VALUES

SOURCE = Path(__file__).resolve().parent / "csrc" / "nvfp4_mma_sm120a.cu"
NVCC_ARCH = ["-gencode", "arch=compute_120a,code=sm_120a"]


# -- the kernel's index helpers (same expressions as the .cu; `/` there is integer division) ------------
def a_row(g: int, r: int) -> int:
    return g + 8 * (r & 1)


def a_kbyte(k0: int, q: int, r: int) -> int:
    return (k0 + 8 * q + 32 * (r >> 1)) // 2


def w_kbyte(k0: int, q: int, r: int) -> int:
    return (k0 + 8 * q + 32 * r) // 2


def sfa_row(lane: int) -> int:
    return lane // 4 + 8 * (lane % 2)


def d_row(g: int, i: int) -> int:
    return g + 8 * (i >> 1)


def d_col(q: int, i: int) -> int:
    return 2 * q + (i & 1)


# -- the hardware's reading of the registers (m16n8k64, .row.col, block_scale scale_vec::4X) -----------
def _nibbles(word: int) -> list[int]:
    return [(word >> (4 * i)) & 0xF for i in range(8)]


def _bytes(word: int) -> list[int]:
    return [(word >> (8 * i)) & 0xFF for i in range(4)]


def fragment_a(regs: list[list[int]]) -> torch.Tensor:
    """32 lanes x 4 registers -> A codes [16, 64]: lane 4g+q, register r, nibble v holds
    A[g + 8 * (r & 1), 8q + v + 32 * (r >> 1)]."""
    a = torch.zeros(16, 64, dtype=torch.long)
    for lane in range(32):
        g, q = lane // 4, lane % 4
        for r in range(4):
            for v, code in enumerate(_nibbles(regs[lane][r])):
                a[g + 8 * (r & 1), 8 * q + v + 32 * (r >> 1)] = code
    return a


def fragment_b(regs: list[list[int]]) -> torch.Tensor:
    """32 lanes x 2 registers -> B codes [8 (n), 64 (k)]: lane 4g+q, register r, nibble v holds B[g, 8q + v + 32r]."""
    b = torch.zeros(8, 64, dtype=torch.long)
    for lane in range(32):
        g, q = lane // 4, lane % 4
        for r in range(2):
            for v, code in enumerate(_nibbles(regs[lane][r])):
                b[g, 8 * q + v + 32 * r] = code
    return b


def fragment_sfa(words: list[int]) -> torch.Tensor:
    """scale-A (thread-id 0, byte-id 0): lane t with (t // 2) % 2 == 0 gives row t // 4 + 8 (t % 2), byte j = K block j."""
    s = torch.zeros(16, 4, dtype=torch.long)
    for lane in range(32):
        if (lane // 2) % 2 == 0:
            s[lane // 4 + 8 * (lane % 2)] = torch.tensor(_bytes(words[lane]))
    return s


def fragment_sfb(words: list[int]) -> torch.Tensor:
    """scale-B: lane 4g (of each quad) gives column g of B, byte j = K block j."""
    s = torch.zeros(8, 4, dtype=torch.long)
    for lane in range(0, 32, 4):
        s[lane // 4] = torch.tensor(_bytes(words[lane]))
    return s


def fragment_d(d: torch.Tensor) -> list[list[float]]:
    """Accumulator D[16, 8] -> 32 lanes x 4 registers: lane 4g+q, register i = v0 + 2 v1 holds D[g + 8 v1, 2q + v0]."""
    return [[float(d[lane // 4 + 8 * (i // 2), 2 * (lane % 4) + i % 2]) for i in range(4)] for lane in range(32)]


def _e2m1(codes: torch.Tensor) -> torch.Tensor:
    return E2M1_VALUES.double()[codes]


def _ue4m3(byte_values: torch.Tensor) -> torch.Tensor:
    return byte_values.to(torch.uint8).view(torch.float8_e4m3fn).double()


def mma(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """D[16, 8] = sum_k (E2M1(A) * SFA[m, k // 16]) * (E2M1(B) * SFB[n, k // 16]), in float64."""
    av = _e2m1(a) * _ue4m3(sfa).repeat_interleave(16, dim=1)
    bv = _e2m1(b) * _ue4m3(sfb).repeat_interleave(16, dim=1)
    return av @ bv.T


# -- the kernel, lane by lane --------------------------------------------------------------------------
def _u32(data: torch.Tensor, offset: int) -> int:
    return int.from_bytes(bytes(data[offset : offset + 4].tolist()), "little")


def emulate(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, alpha: float,
            m_size: int, n_size: int, k_size: int) -> torch.Tensor:
    """What the kernel writes to y [M, N] (float64), from the operands' bytes as the artifact lays them out:
    a u8 [M, K/2], a_scale [M, K/16], w u8 [N, K/2], w_scale blocked_128x4."""
    if k_size % 64:
        raise ValueError("the kernel needs K % 64 == 0")
    a8, as8 = a.reshape(-1).view(torch.uint8), a_scale.reshape(-1).view(torch.uint8)
    w8, ws8 = w.reshape(-1).view(torch.uint8), w_scale.reshape(-1).view(torch.uint8)
    row_bytes, scale_cols = k_size // 2, k_size // 16
    y = torch.zeros(m_size, n_size, dtype=torch.float64)
    for by in range(-(-m_size // 16)):
        for bx in range(-(-n_size // 8)):
            m0, n0 = by * 16, bx * 8
            d = torch.zeros(16, 8, dtype=torch.float64)
            for k0 in range(0, k_size, 64):
                ar, wr, sfa, sfb = [], [], [], []
                for lane in range(32):
                    g, q = lane // 4, lane % 4
                    ar.append([_u32(a8, (m0 + a_row(g, r)) * row_bytes + a_kbyte(k0, q, r))
                               if m0 + a_row(g, r) < m_size else 0 for r in range(4)])
                    n = n0 + g
                    wr.append([_u32(w8, n * row_bytes + w_kbyte(k0, q, r)) if n < n_size else 0 for r in range(2)])
                    ms = m0 + sfa_row(lane)
                    sfa.append(_u32(as8, ms * scale_cols + k0 // 16) if ms < m_size else 0)
                    sfb.append(_u32(ws8, blocked_offset(n, k0 // 16, scale_cols)) if n < n_size else 0)
                d += mma(fragment_a(ar), fragment_b(wr), fragment_sfa(sfa), fragment_sfb(sfb))
            regs = fragment_d(d)
            for lane in range(32):
                g, q = lane // 4, lane % 4
                for i in range(4):
                    m, col = m0 + d_row(g, i), n0 + d_col(q, i)
                    if m < m_size and col < n_size:
                        y[m, col] = alpha * regs[lane][i]
    return y


def reference(a_codes: torch.Tensor, a_scales: torch.Tensor, w_codes: torch.Tensor, w_scales: torch.Tensor,
              alpha: float) -> torch.Tensor:
    """alpha * dequant(A) @ dequant(W)^T in float64; codes unpacked [rows, K], scales [rows, K/16] (linear)."""
    av = _e2m1(a_codes.long()) * _ue4m3(a_scales.view(torch.uint8).long()).repeat_interleave(16, dim=1)
    wv = _e2m1(w_codes.long()) * _ue4m3(w_scales.view(torch.uint8).long()).repeat_interleave(16, dim=1)
    return alpha * (av @ wv.T)
