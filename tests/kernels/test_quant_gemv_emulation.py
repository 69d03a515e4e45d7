"""The sm_90a decode GEMV's arithmetic, emulated on the CPU (csrc/quant_gemv_sm90.cu runs on a GPU only).

Each lane's registers are built from the artifact's bytes with the kernel's own bit expressions
(checked present, verbatim, in the .cu), placed where mma.sync m16n8k16 reads them (A = weights,
row-major: lane 4g + c holds rows g and g + 8 at k = 2c, 2c+1 and 2c+8, 2c+9; B = x, column-major:
token g at the same k), multiplied, and read back from D's fragments as the kernel stores them,
multiplied in float64. Equal to the reference bit for bit only if the K order of A and B agree, the
bit placement decodes every code and the scale handling is exact.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ninfer_format.quants import E2M1_VALUES, dequantize_int, unpack_nibbles
from ninfer_pack.quant import quantize_int, quantize_nvfp4

SOURCE = (Path(__file__).resolve().parents[2] / "ninfer_run" / "kernels" / "csrc" / "quant_gemv_sm90.cu").read_text()
M, N, K = 3, 16, 256


def _bf16(bits: torch.Tensor) -> torch.Tensor:
    """uint16 patterns (in int64) -> their bf16 values as float64."""
    return (bits.to(torch.int32) << 16).view(torch.float32).double()


def _halves(pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _bf16(pair & 0xFFFF), _bf16((pair >> 16) & 0xFFFF)


def _fp4_pair(w: torch.Tensor, i: int) -> torch.Tensor:
    em, sign = 6 - 4 * i, 12 - 4 * i
    e = (w << em) if em >= 0 else (w >> -em)
    return (e & 0x01C001C0) | ((w << sign) & 0x80008000)


def _int4_pair(w: torch.Tensor, i: int) -> torch.Tensor:
    return ((w >> (4 * i)) & 0x000F000F) | 0x43004300


def _scale_value(byte: torch.Tensor) -> torch.Tensor:
    """The kernel's scale_pair: the e4m3 bits placed in a float32 (scale * 2^-120), times 2^220, as bf16."""
    f = (((byte & 0x80) << 24) | ((byte & 0x7F) << 20)).to(torch.int32).view(torch.float32).double() * 2.0**220
    assert torch.equal(f.float().bfloat16().double(), f)  # exact in bf16
    return f


def _rotate_left(w: torch.Tensor, n: int) -> torch.Tensor:
    return ((w << n) | (w >> (32 - n))) & 0xFFFFFFFF


def _fp4_view(w: torch.Tensor, v: int) -> torch.Tensor:
    bits, m0 = 0x81C081C0, 0x00400040
    return [w & bits, (w << 4) & bits, _rotate_left(w, 10) & bits,
            ((w << 6) & m0) | (_rotate_left(w, 14) & (bits & ~m0))][v] & 0xFFFFFFFF


def _scales_tiled(byte: torch.Tensor) -> torch.Tensor:
    """The kernel's scales_tiled for one half: e4m3 -> f16 (exact, as cvt.rn.f16x2.e4m3x2), then
    ((h >> 3) & 0x0FFF) + 0x6A00 read as bf16 (= scale * 2^100 for scale > 0; 2^85 for zero)."""
    h = torch.tensor([int(byte)], dtype=torch.uint8).view(torch.float8_e4m3fn).half().view(torch.int16).long() & 0xFFFF
    return _bf16(((h >> 3) & 0x0FFF) + 0x6A00)[0]


def _emulate(words: torch.Tensor, a_pair, x: torch.Tensor, per_row_tile=None, natural_x: bool = False) -> torch.Tensor:
    """The kernel (weights as A, 16 rows per warp): a_pair(w, i, row, kt, c, t) -> bf16 values (lo, hi) of nibble
    pair (i, i+4) (or, tiled NVFP4, view i) of word t of lane c's 16 bytes of `row`; per_row_tile(part
    [16, 8] rows x tokens, n0, kt) scales a tile's sums (int4). Registers are placed into A [16, 16],
    B [16, 8] by mma.sync's fragment layout (B as x_pair, or x_natural), multiplied, and read back out of
    D's fragments as the kernel stores them."""
    y = torch.zeros(M, N, dtype=torch.float64)
    xd = torch.zeros(8, K, dtype=torch.float64)
    xd[:M] = x.double()  # B columns past M are zero (load_x)
    for n0 in range(0, N, 16):
        out = torch.zeros(16, 8, dtype=torch.float64)  # D: rows n0.., tokens
        for kt in range(K // 128):
            part = torch.zeros(16, 8, dtype=torch.float64)
            for t in range(4):
                for h in range(2):
                    a, b = torch.zeros(16, 16, dtype=torch.float64), torch.zeros(16, 8, dtype=torch.float64)
                    for g in range(8):
                        for c in range(4):
                            k0 = kt * 128 + 32 * c + 8 * t
                            for row in (g, g + 8):  # a0, a2: row g; a1, a3: row g + 8
                                w = words[n0 + row, kt * 16 + 4 * c + t]
                                lo0, hi0 = a_pair(w, 2 * h, n0 + row, kt, c, t)
                                lo2, hi2 = a_pair(w, 2 * h + 1, n0 + row, kt, c, t)
                                a[row, 2 * c], a[row, 2 * c + 1], a[row, 2 * c + 8], a[row, 2 * c + 9] = lo0, hi0, lo2, hi2
                            if natural_x:  # b0 = (x[4h], x[4h+1]) at k 2c, 2c+1; b1 = (x[4h+2], x[4h+3])
                                b[2 * c, g], b[2 * c + 1, g] = xd[g, k0 + 4 * h], xd[g, k0 + 4 * h + 1]
                                b[2 * c + 8, g], b[2 * c + 9, g] = xd[g, k0 + 4 * h + 2], xd[g, k0 + 4 * h + 3]
                                continue
                            # b0 = (x[2h], x[2h+4]) at k 2c, 2c+1; b1 = (x[2h+1], x[2h+5]) at 2c+8, 2c+9; column g
                            b[2 * c, g], b[2 * c + 1, g] = xd[g, k0 + 2 * h], xd[g, k0 + 2 * h + 4]
                            b[2 * c + 8, g], b[2 * c + 9, g] = xd[g, k0 + 2 * h + 1], xd[g, k0 + 2 * h + 5]
                    part += a @ b
            out += per_row_tile(part, n0, kt) if per_row_tile else part
        for g in range(8):
            for c in range(4):
                d = (out[g, 2 * c], out[g, 2 * c + 1], out[g + 8, 2 * c], out[g + 8, 2 * c + 1])
                for i in range(4):
                    token, row = 2 * c + (i & 1), n0 + g + 8 * (i >> 1)  # the kernel's store (th = 0)
                    if token < M:
                        y[token, row] = d[i]
    return y


def _words(packed_bytes: torch.Tensor) -> torch.Tensor:
    return packed_bytes.contiguous().view(torch.int32).long() & 0xFFFFFFFF


def test_expressions_are_the_kernels():
    for text in ("constexpr int em = 6 - 4 * I, sign = 12 - 4 * I;",
                 "return (e & 0x01C001C0u) | ((w << sign) & 0x80008000u);",
                 "((byte & 0x80u) << 24) | ((byte & 0x7Fu) << 20)", "f * 0x1p110f * 0x1p110f", "__ldg(a.s2) * 0x1p26f",
                 "return ((w >> (4 * I)) & 0x000F000Fu) | 0x43004300u;", "return (0x4300u | v) * 0x00010001u;", "biased_zero_pair(ag.zero), biased_zero_pair(ah.zero)",
                 "even = permute(lo, hi, 0x5410u);", "odd = permute(lo, hi, 0x7632u);",
                 ": q + (size_t)(n0 + g) * (K / 2) + 16 * c;  // + 64 per tile",
                 "const uint8_t* wh_lane = kTiled ? wg_lane + 512 : wg_lane + (size_t)8 * (K / 2);",
                 "const int token = 8 * th + 2 * c + (i & 1), row = n0 + g + 8 * (i >> 1);",
                 "a[0] = bf16x2_mul(h ? fp4_pair<2>(vg) : fp4_pair<0>(vg), sg[t >> 1]);",
                 "a[3] = bf16x2_mul(h ? fp4_pair<3>(vh) : fp4_pair<1>(vh), sh[t >> 1]);",
                 "a[1] = bf16x2_sub(h ? int4_pair<2>(vh) : int4_pair<0>(vh), zh);",
                 "x_pair(b0, b1, xl[t], h);", "mma_bf16(acc[0][t & 1], a, b0, b1);",
                 "a.scale + (size_t)row * (K / 16) + kt * 8 + 2 * c",
                 "(static_cast<uint32_t>(__ldg(a.zero + (size_t)(row / 8) * groups + kt)) >> (4 * (row % 8))) & 15u",
                 "(part[th][0][i] + part[th][1][i]) * (i < 2 ? sg : sh)",
                 "__uint_as_float(ag.scale), __uint_as_float(ah.scale)"):
        assert text in SOURCE, text


def test_nvfp4_decode_and_k_order_are_exact():
    g = torch.Generator().manual_seed(2)
    q, s8, s2 = quantize_nvfp4(torch.randn(N, K, generator=g) * 0.05)
    x = torch.randn(M, K, generator=g).bfloat16()
    scales = s8.view(torch.uint8).long()

    def a_pair(w, i, row, kt, c, t):
        s = _scale_value(scales[row, kt * 8 + 2 * c + (t >= 2)])  # sg[t >> 1]: the row's block 2c or 2c + 1
        return [v * s for v in _halves(_fp4_pair(w, i))]

    y = _emulate(_words(q), a_pair, x) * float(s2) * 2.0**26
    exact = E2M1_VALUES.double()[unpack_nibbles(q).long()] * s8.double().repeat_interleave(16, dim=1) * float(s2)
    ref = x.double() @ exact.T
    assert float((y - ref).norm() / ref.norm()) < 1e-12


def test_tiled_nvfp4_views_scales_and_k_order_are_exact():
    """The tiled codec: tile_nvfp4's sign-less scales and VIEW_BITS words, decoded by fp4_view and
    scales_tiled, x taken as loaded; zero, negative and subnormal scales mixed in."""
    from ninfer_run.kernels.cuda_ops import _signless_scales, encode_views

    for text in ("if constexpr (V == 0) return w & kBits;", "else if constexpr (V == 1) return (w << 4) & kBits;",
                 "else if constexpr (V == 2) return rotate_left(w, 10) & kBits;",
                 "else return ((w << 6) & kM0) | (rotate_left(w, 14) & (kBits & ~kM0));",
                 "constexpr uint32_t kBits = 0x81C081C0u, kM0 = 0x00400040u;",
                 "uint32_t rotate_left(uint32_t w, int n) { return __funnelshift_l(w, w, n); }",
                 'asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(bytes)));',
                 "return ((h >> 3) & 0x0FFF0FFFu) + 0x6A006A00u;",
                 "const uint32_t sg[2] = {permute(pg, pg, 0x1010u), permute(pg, pg, 0x3232u)};",
                 "a[0] = bf16x2_mul(h ? fp4_view<2>(vg) : fp4_view<0>(vg), sg[t >> 1]);",
                 "a[3] = bf16x2_mul(h ? fp4_view<3>(vh) : fp4_view<1>(vh), sh[t >> 1]);",
                 "kNaturalX ? x_natural(b0, b1, xl[t], h) : x_pair(b0, b1, xl[t], h);",
                 "b0 = h ? v.z : v.x;", "b1 = h ? v.w : v.y;", "tile_mmas<kHighTokens, true>(d, xl, xh,",
                 "dispatch_ring<ninfer_sm90::Nvfp4Tiled, true>", "dispatch_bulk<ninfer_sm90::Nvfp4Tiled, false>",
                 "Codec::template tile<kHighTokens>(d, wg, wh, ag, ah, xl, xh)",
                 "const uint32_t both = *reinterpret_cast<const uint32_t*>(side + 4 * lane);"):
        assert text in SOURCE, text
    g = torch.Generator().manual_seed(5)
    q, s8, s2 = quantize_nvfp4(torch.randn(N, K, generator=g) * 0.05)
    raw = s8.view(torch.uint8).clone()
    kind = torch.randint(0, 6, raw.shape, generator=g)
    raw = torch.where(kind == 0, 0, torch.where(kind == 1, 0x80, torch.where(kind == 2, raw | 0x80, raw)))
    raw = torch.where(kind == 3, torch.randint(1, 8, raw.shape, generator=g, dtype=torch.uint8), raw).to(torch.uint8)
    odd = raw.view(s8.dtype)
    x = torch.randn(M, K, generator=g).bfloat16()
    codes, scales = _signless_scales(q, odd)
    scales = scales.long()

    def a_pair(w, i, row, kt, c, t):
        s = _scales_tiled(scales[row, kt * 8 + 2 * c + (t >= 2)])
        return [v * s for v in _halves(_fp4_view(w, i))]

    y = _emulate(_words(encode_views(codes)), a_pair, x, natural_x=True) * float(s2) * 2.0**26
    exact = E2M1_VALUES.double()[unpack_nibbles(q).long()] * odd.double().repeat_interleave(16, dim=1) * float(s2)
    ref = x.double() @ exact.T
    assert float((y - ref).norm() / ref.norm()) < 1e-12


def test_element_bits_take_the_fewest_instructions_a_word():
    """cuda_ops.ELEMENT_BITS: every bit of a word once, each view reached as fp4_view says, and no layout
    cheaper. A view's 8 bits (fp4_view's mask) come from one rotation of the word (1 instruction: AND, if
    the rotation is 0; else 2) or from two (LOP3 each, plus the rotations not 0). Four one-rotation views
    cannot tile the word (the mask repeats every 16 bits; no 4 translates of {6, 7, 8, 15} tile Z/16), so
    the best is three of them and one of two (fewer one-rotation views cost at least 10: 2 + 2 + 3 + 3, a
    zero rotation's bits being view 0's when one view takes none); searched over every such choice, the cheapest costs 9, and with plain shifts no such choice
    exists at all (the layout before: 1 + 2 + 4 + 4 = 11)."""
    import itertools

    from ninfer_run.kernels.cuda_ops import ELEMENT_BITS, VIEW_SHIFTS, VIEW_TARGET

    assert sorted(b for e in ELEMENT_BITS for b in e) == list(range(32))
    target = [b for half in VIEW_TARGET for b in half]
    assert sum(1 << b for b in target) == 0x81C081C0
    costs = [1 if set(s) == {0} else 2 if len(set(s)) == 1 else 2 + sum(d != 0 for d in set(s)) for s in VIEW_SHIFTS]
    assert costs == [1, 2, 2, 4]

    def sources(group, d, wrap):
        out = {b - d for b in group}
        return {b % 32 for b in out} if wrap else (out if all(0 <= b < 32 for b in out) else None)

    def cheapest(wrap):
        shifts = range(32) if wrap else range(-31, 32)
        whole = {d: sources(target, d, wrap) for d in shifts if sources(target, d, wrap)}
        best = None
        for chosen in itertools.combinations(whole, 3):
            used = set().union(*(whole[d] for d in chosen))
            if len(used) < 24:
                continue
            rest = set(range(32)) - used
            for split in range(1, 128):
                g1 = [b for i, b in enumerate(target) if split >> i & 1]
                g2 = [b for i, b in enumerate(target) if not split >> i & 1]
                for d1 in shifts:
                    s1 = sources(g1, d1, wrap)
                    if not s1 or not s1 <= rest:
                        continue
                    for d2 in shifts:
                        if d2 != d1 and sources(g2, d2, wrap) == rest - s1:
                            cost = sum(1 if d == 0 else 2 for d in chosen) + 2 + (d1 != 0) + (d2 != 0)
                            best = cost if best is None else min(best, cost)
        return best

    assert cheapest(wrap=True) == sum(costs) == 9
    assert cheapest(wrap=False) is None


def test_block_columns_keep_each_block_apart_and_scale_it_exactly():
    """Nvfp4Columns (ring-block-columns, M = 1): per tile 16 m16n8k8 MMAs (A rows g, g + 8 at K slots 2c,
    2c + 1; B slots 2c, 2c + 1 of column g), A = view i % 4 of word i / 4 (even) or 2 + i / 4 (odd) of lane
    c's bytes, B = x * 2^100 in lanes g = 2c only (zeros elsewhere); the scales of rows g / g + 8, blocks 2c
    and 2c + 1 applied to accumulator entries c0 / c2 of the even and odd MMAs, then rows summed over the
    lane group. Equal to the reference only if each column really holds one block of one lane group."""
    from ninfer_run.kernels.cuda_ops import _signless_scales, encode_views

    for text in ("mma_bf16_k8(even, view(word(wg, t), v), view(word(wh, t), v), word(x[t], v));",
                 "mma_bf16_k8(odd, view(word(wg, 2 + t), v), view(word(wh, 2 + t), v), word(x[2 + t], v));",
                 "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32", "ag = {__ldg(tile_scales(args, n0, K, kt, g, c))};",
                 "const float2 sg = scales_float(ag.scales), sh = scales_float(ag.scales >> 16);",
                 "d[0][0][0] += even[0] * sg.x;", "d[0][0][1] += odd[0] * sg.y;", "d[0][0][2] += even[2] * sh.x;",
                 "d[0][0][3] += odd[2] * sh.y;", "float rows[2] = {d[0][0][0] + d[0][0][1], d[0][0][2] + d[0][0][3]};",
                 "shared_address(x_staged) + (g == 2 * c ? 64 * c + 2 * kTileK * warp : 2 * K)",
                 "const uint32_t x_step = g == 2 * c ? 2 * kTileK * kWarps : 0;",
                 "load_shared(xl[0], xl[1], x_next);", "load_shared(xl[2], xl[3], x_next + 32);",
                 "constexpr uint32_t kTwoTo100 = 0x71807180u;"):
        assert text in SOURCE, text
    assert _bf16(torch.tensor(0x7180)).item() == 2.0**100
    n = 32
    g = torch.Generator().manual_seed(6)
    q, s8, s2 = quantize_nvfp4(torch.randn(n, K, generator=g) * 0.05)
    raw = s8.view(torch.uint8).clone()
    kind = torch.randint(0, 6, raw.shape, generator=g)
    raw = torch.where(kind == 0, 0, torch.where(kind == 1, 0x80, torch.where(kind == 2, raw | 0x80, raw)))
    odd_scales = torch.where(kind == 3, torch.randint(1, 8, raw.shape, generator=g, dtype=torch.uint8), raw)
    odd_scales = odd_scales.to(torch.uint8).view(s8.dtype)
    x = torch.randn(1, K, generator=g).bfloat16()
    codes, scales = _signless_scales(q, odd_scales)
    words, xs = _words(encode_views(codes)), x.double()[0] * 2.0**100
    scale = scales.view(torch.float8_e4m3fn).double()  # sign-less: e4m3 -> f16 -> f32 is exact
    y = torch.zeros(n, dtype=torch.float64)
    for n0 in range(0, n, 16):
        d = torch.zeros(8, 4, 4, dtype=torch.float64)  # lane (g, c)'s d[0][0][0..3]
        for kt in range(K // 128):
            for parity in (0, 1):  # even MMAs: the lane's block 2c (words 0-1), odd: 2c + 1 (words 2-3)
                acc = torch.zeros(16, 8, dtype=torch.float64)
                for i in range(8):
                    t, v = i >> 2, i & 3
                    a, b = torch.zeros(16, 8, dtype=torch.float64), torch.zeros(8, 8, dtype=torch.float64)
                    for gg in range(8):
                        for c in range(4):
                            for row in (gg, gg + 8):  # a0, a1
                                w = words[n0 + row, kt * 16 + 4 * c + 2 * parity + t]
                                a[row, 2 * c], a[row, 2 * c + 1] = _halves(_fp4_view(w, v))
                            if gg == 2 * c:  # b0; every other lane reads zeros
                                k0 = kt * 128 + 32 * c + 16 * parity + 8 * t + 2 * v
                                b[2 * c, gg], b[2 * c + 1, gg] = xs[k0], xs[k0 + 1]
                    acc += a @ b
                for gg in range(8):
                    for c in range(4):  # c0 = (row g, column 2c), c2 = (row g + 8, column 2c)
                        block = kt * 8 + 2 * c + parity
                        d[gg, c, parity] += acc[gg, 2 * c] * scale[n0 + gg, block]
                        d[gg, c, 2 + parity] += acc[gg + 8, 2 * c] * scale[n0 + gg + 8, block]
        y[n0 : n0 + 8] = (d[:, :, 0] + d[:, :, 1]).sum(1)
        y[n0 + 8 : n0 + 16] = (d[:, :, 2] + d[:, :, 3]).sum(1)
    y = y * float(s2) * 2.0**26
    exact = E2M1_VALUES.double()[unpack_nibbles(q).long()] * odd_scales.double().repeat_interleave(16, dim=1) * float(s2)
    ref = x.double()[0] @ exact.T
    assert float((y - ref).norm() / ref.norm()) < 1e-12


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_decode_and_k_order_are_exact(symmetric):
    g = torch.Generator().manual_seed(3)
    p = quantize_int(torch.randn(N, K, generator=g) * 0.05, 4, 128, symmetric, "w")
    x = torch.randn(M, K, generator=g).bfloat16()
    zero = _words(p["zero_point"]) if not symmetric else None

    def a_pair(w, i, row, kt, c, t):
        v = int((zero[row // 8, kt] >> (4 * (row % 8))) & 15) if zero is not None else 8
        z = float(_bf16(torch.tensor(0x4300 | v)))
        lo, hi = _halves(_int4_pair(w, i))
        return lo - z, hi - z

    def per_row_tile(part, n0, kt):  # d0, d1 scaled by row g's group scale, d2, d3 by row g + 8's
        return part * p["scale"].double()[n0 : n0 + 16, kt, None]

    y = _emulate(_words(p["qweight"]), a_pair, x, per_row_tile)
    ref = x.double() @ dequantize_int(p["qweight"], p["scale"], p.get("zero_point"), 4, 128, (N, K)).double().T
    assert float((y - ref).norm() / ref.norm()) < 1e-12


def test_tiled_layout_is_what_the_tiled_kernel_loads():
    """cuda_ops.tile_nvfp4 (torch, also on the CPU) puts at the tiled kernel's addresses the bytes (codes
    re-encoded by encode_views) its row-major addressing would read: tile (rt, kt) at 1024 (rt T + kt), lane L = 4g + c's codes at
    16 L (row g) and 512 + 16 L (row g + 8); its scales at 128 (rt T + kt) + 4 L (row g's two, row g + 8's)."""
    from ninfer_run.kernels.cuda_ops import _signless_scales, encode_views, tile_nvfp4

    for text in ("q + (size_t)block * tiles * 1024 + 16 * lane", "constexpr int kStride = kTiled ? 1024 : 64;",
                 "args.scale + ((size_t)(n0 / 16) * (K / kTileK) + kt) * 128 +", "4 * (4 * g + c)",
                 "ag = {both & 0xFFFFu};", "ah = {both >> 16};"):
        assert text in SOURCE, text
    n, k = 48, 384
    g = torch.Generator().manual_seed(4)
    q, s8, _ = quantize_nvfp4(torch.randn(n, k, generator=g))
    codes, scales = tile_nvfp4(q, s8)
    plain, sb = _signless_scales(q, s8)  # (all of these scales are positive: the same bytes)
    assert torch.equal(sb, s8.view(torch.uint8)) and torch.equal(plain, q)
    q = encode_views(q)
    codes, scales, t = codes.flatten(), scales.flatten(), k // 128
    for rt in range(n // 16):
        for kt in range(t):
            for lane in range(32):
                gg, c = lane // 4, lane % 4
                base = 1024 * (rt * t + kt)
                for half, offset in ((0, 16 * lane), (1, 512 + 16 * lane)):
                    row = 16 * rt + gg + 8 * half
                    assert torch.equal(codes[base + offset : base + offset + 16], q[row, 64 * kt + 16 * c : 64 * kt + 16 * c + 16])
                got = scales[128 * (rt * t + kt) + 4 * lane : 128 * (rt * t + kt) + 4 * lane + 4]
                want = torch.cat([sb[16 * rt + gg + 8 * h, 8 * kt + 2 * c : 8 * kt + 2 * c + 2] for h in (0, 1)])
                assert torch.equal(got, want)


@pytest.mark.parametrize("symmetric", [True, False])
def test_tiled_int4_layout_is_what_the_tiled_kernel_loads(symmetric):
    """cuda_ops.tile_int4 puts at the tiled kernel's code addresses (as NVFP4's: tile (rt, kt) at 1 KB
    (rt T + kt), lane L = 4g + c at 16 L for row g and 512 + 16 L for row g + 8) the 16 bytes the row-major
    addressing would read (row, 64 kt + 16 c ..), words unchanged; and where Int4Tiled loads a lane's rows'
    scales and zero points (record (rt T + kt) at 40 B: word g, byte 32 + g) the row-major parts' values
    of rows g and g + 8, decoded as Int4Tiled::tile decodes them."""
    from ninfer_run.kernels.cuda_ops import tile_int4

    assert "Codec::load_tile_rows(ag, ah, args, n0, K, kt, g, c);" in SOURCE
    assert "((size_t)(n0 / 16) * (K / kTileK) + kt) * 40;" in SOURCE
    # (the bulk pipeline reads a slot's copy of the record the same way: word g, byte 32 + g)
    assert "ag = {record[32 + g], *reinterpret_cast<const uint32_t*>(record + 4 * g)};" in SOURCE
    assert "ag = {__ldg(record + 32 + g), __ldg(reinterpret_cast<const uint32_t*>(record) + g)};" in SOURCE
    assert ("biased_zero_pair(both.zeros & 15u), biased_zero_pair(both.zeros >> 4),\n"
            "                       __uint_as_float(both.scales << 16), __uint_as_float(both.scales & 0xFFFF0000u)") in SOURCE
    n, k = 48, 384
    p = quantize_int(torch.randn(n, k, generator=torch.Generator().manual_seed(5)), 4, 128, symmetric, "w")
    tiled, records = tile_int4(p["qweight"], p["scale"], p.get("zero_point"))
    assert tiled.shape == (n // 16, k // 128, 256) and tiled.dtype == torch.int32
    assert records.shape == (n // 16, k // 128, 40) and records.dtype == torch.uint8
    codes, plain, t = tiled.flatten().view(torch.uint8), p["qweight"].contiguous().view(torch.uint8), k // 128
    record_bytes = records.flatten()
    zero = _words(p["zero_point"]) if not symmetric else None
    for rt in range(n // 16):
        for kt in range(t):
            record = record_bytes[40 * (rt * t + kt) : 40 * (rt * t + kt + 1)]
            for lane in range(32):
                gg, c = lane // 4, lane % 4
                base = 1024 * (rt * t + kt)
                for half, offset in ((0, 16 * lane), (1, 512 + 16 * lane)):
                    row = 16 * rt + gg + 8 * half
                    assert torch.equal(codes[base + offset : base + offset + 16],
                                       plain[row, 64 * kt + 16 * c : 64 * kt + 16 * c + 16])
                scales = int.from_bytes(bytes(record[4 * gg : 4 * gg + 4].tolist()), "little")
                zeros = int(record[32 + gg])
                for half, (v, bits) in enumerate(((zeros & 15, (scales << 16) & 0xFFFFFFFF),
                                                  (zeros >> 4, scales & 0xFFFF0000))):
                    row = 16 * rt + gg + 8 * half
                    want_v = 8 if symmetric else (zero[row // 8, kt] >> (4 * (row % 8))) & 15
                    assert v == want_v
                    got_scale = torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)
                    assert got_scale.item() == p["scale"][row, kt].float().item()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_sm90a_gemv_compiles_and_gpu_check_names_a_kernel_it_has(tmp_path):
    """The .cu compiles for sm_90a here (the GPU box builds it at first use), and tools/gpu_check.sh's
    `sass` stage disassembles a kernel the build has (its mangled name changes with the template)."""
    ptx = tmp_path / "gemv.ptx"
    src = Path(__file__).resolve().parents[2] / "ninfer_run" / "kernels" / "csrc" / "quant_gemv_sm90.cu"
    r = subprocess.run(["nvcc", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-ptx", str(src), "-o", str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    script = (Path(__file__).resolve().parents[2] / "tools" / "gpu_check.sh").read_text()
    symbols = re.findall(r"^GEMV_\w*SYMBOL=(\S+)$", script, re.M)
    assert len(symbols) == 2
    for symbol in symbols:
        assert f".entry {symbol}(" in ptx.read_text(), symbol


def test_pipeline_choice_and_glu_refusal(monkeypatch):
    """NINFER_GEMV_PIPELINE=auto runs one row with the blocks as MMA columns (AUTO_ONE_ROW), more on the
    ring with x staged (as measured, gpu_notes stops 18, 21 and 27);
    an explicit choice wins; gate+up+SiLU-mul in one launch (glu) is the bulk pipelines', refused elsewhere
    before any kernel runs, and the engine's only with FUSED_GLU."""
    from ninfer_run.kernels import cuda_ops

    monkeypatch.setattr(cuda_ops, "PIPELINE", "auto")
    assert cuda_ops.pipeline_for() == cuda_ops.AUTO_ONE_ROW in cuda_ops.NORM_PIPELINES
    assert all(cuda_ops.pipeline_for(rows=m) == "ring-staged-x" for m in (2, 8, 16))
    assert cuda_ops.pipeline_for("ring") == "ring" and cuda_ops.pipeline_for("bulk", rows=4) == "bulk"
    monkeypatch.setattr(cuda_ops, "PIPELINE", "ring")
    assert cuda_ops.pipeline_for() == "ring"
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    weight = (torch.zeros(1, 2, 1024, dtype=torch.uint8), torch.zeros(1, 2, 128, dtype=torch.uint8), torch.ones(1))
    monkeypatch.setattr(cuda_ops, "PIPELINE", "auto")
    with pytest.raises(ValueError, match="bulk pipeline"):
        cuda_ops.nvfp4_gemv_group(x, [weight, weight], tiled=True, glu=True)  # auto at 4 rows: the staged ring
    with pytest.raises(ValueError, match="bulk pipeline"):
        cuda_ops.nvfp4_gemv_group(x[:1], [weight], tiled=True, pipeline="bulk", glu=True)  # one weight
    with pytest.raises(ValueError, match="bulk pipeline"):  # the ring with the blocks as columns: no glu launch
        cuda_ops.nvfp4_gemv_group(x[:1], [weight, weight], tiled=True, pipeline="ring-block-columns", glu=True)
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", False)  # the engine asks for glu only with FUSED_GLU
    assert not cuda_ops.uses_glu(1)
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", True)
    assert cuda_ops.uses_glu(1) and not cuda_ops.uses_glu(2)  # auto: AUTO_ONE_ROW, then the staged ring
    monkeypatch.setattr(cuda_ops, "PIPELINE", "ring-block-columns")  # chosen: no glu launch of its own
    assert not cuda_ops.uses_glu(1)
    monkeypatch.setattr(cuda_ops, "PIPELINE", "auto")
    # the MLP's launches in a pipeline of their own where MLP_PIPELINE says so; the others keep PIPELINE's
    monkeypatch.setattr(cuda_ops, "MLP_PIPELINE", "bulk-block-columns")
    assert cuda_ops.pipeline_for(mlp=True) == "bulk-block-columns" == cuda_ops.pipeline_for(rows=4, mlp=True)
    assert cuda_ops.pipeline_for() == cuda_ops.AUTO_ONE_ROW and cuda_ops.pipeline_for("ring", mlp=True) == "ring"
    assert cuda_ops.uses_glu(2, mlp=True) and not cuda_ops.uses_glu(2, mlp=False)
    assert cuda_ops.bulk_shape(5120) == (8, 4) and cuda_ops.bulk_shape(256) == (4, 8)
    # bulk-block-columns launches in the bulk pipeline's shapes; its staged norm and glu forms in bulk_shape's
    assert cuda_ops.nvfp4_shape("bulk-block-columns", 64, 5120, x.device) == (8, 4)
    assert {cuda_ops.bulk_shape(k) for k in (256, 5120)} == cuda_ops.STAGED_BULK_SHAPES
    with pytest.raises(ValueError, match="staged norm"):
        cuda_ops.nvfp4_norm_gemv_group(x[:1], None, x[0], 1e-6, 1.0, [weight, weight], pipeline="ring-staged-x")
    with pytest.raises(ValueError, match="staged norm"):
        cuda_ops.nvfp4_norm_gemv_group(x[:1], None, x[0], 1e-6, 1.0, [weight, weight], pipeline="ring-block-columns",
                                       glu=True)


def test_int4_pipeline_choice_and_glu_refusal(monkeypatch):
    """Tiled int4 runs INT4_PIPELINE, the staged ring where the bulk pipeline cannot take K (K % 256: a
    tile's 40-byte record would land off a 16-byte boundary for cp.async.bulk); gate+up+SiLU-mul in one
    launch only there and with FUSED_GLU, refused elsewhere before any kernel runs."""
    from ninfer_run.kernels import cuda_ops

    monkeypatch.setattr(cuda_ops, "INT4_PIPELINE", "bulk")
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", True)
    assert cuda_ops.int4_pipeline_for(5120) == "bulk" and cuda_ops.int4_pipeline_for(384) == "ring-staged-x"
    assert cuda_ops.int4_uses_glu(17408) and not cuda_ops.int4_uses_glu(128)
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", False)
    assert not cuda_ops.int4_uses_glu(5120)
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", True)
    monkeypatch.setattr(cuda_ops, "INT4_PIPELINE", "bulk-staged-x")  # (one row: its persistent kernel)
    assert cuda_ops.int4_pipeline_for(5120) == "bulk-staged-x" and cuda_ops.int4_pipeline_for(384) == "ring-staged-x"
    assert cuda_ops.int4_uses_glu(5120) and cuda_ops.PIPELINE_IDS["bulk-staged-x"] not in cuda_ops.PIPELINES.values()
    monkeypatch.setattr(cuda_ops, "INT4_PIPELINE", "ring-staged-x")
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", True)
    assert cuda_ops.int4_pipeline_for(5120) == "ring-staged-x" and not cuda_ops.int4_uses_glu(5120)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    weight = (torch.zeros(1, 2, 256, dtype=torch.int32), torch.zeros(1, 2, 40, dtype=torch.uint8), None)
    with pytest.raises(ValueError, match="bulk pipeline"):  # the default here: the staged ring
        cuda_ops.int4_gemv_group(x, [weight, weight], tiled=True, glu=True)
    with pytest.raises(ValueError, match="bulk pipeline"):  # one weight
        cuda_ops.int4_gemv_group(x, [weight], tiled=True, pipeline="bulk", glu=True)
