// Decode GEMV (M <= 16 rows) for the sm_90a quantized weight formats on Hopper's mma.sync tensor cores:
//   NVFP4:       y[m, n] = s2 * sum_k x[m, k] * e2m1(q[n, k]) * e4m3(scale[n, k / 16])
//   int4 g128:   y[m, n] = sum_k x[m, k] * (u[n, k] - v[n, k / 128]) * scale[n, k / 128]
// Operands as the sm_90a artifact stores them (row-major, K-major), x bf16 [M, K], y bf16 [M, N]:
//   NVFP4  q u8 [N, K/2] (element 2i in the low nibble), scale e4m3 [N, K/16], s2 f32 [1] on the device;
//          or tiled (cuda_ops.tile_nvfp4, done once at load): each 16-row x 128-K tile's 1 KB of codes and
//          128 B of scales contiguous, in the order the lanes below load them, each code word's bits
//          re-encoded (Nvfp4Tiled: fp4_view) and the scales sign-less (scales_tiled)
//   int4   q i32 [N, K/8] (element j of a word at bits 4j, offset-binary u = value + 8), scale bf16
//          [N, K/128], zero points (asymmetric) i32 [N/8, K/128] packed along N (offset-binary v), else v = 8;
//          or tiled (cuda_ops.tile_int4, at load): the codes' bytes in tiles as NVFP4's (words unchanged),
//          and each tile's 16 scales and zero points beside in one 40-byte record (Int4::load_tile_rows)
// All pack 8 elements per 32-bit word in K order (row-major: nibble i = element i), so they share the
// lane layout below and differ only in how a word becomes bf16 pairs (the Codec).
//
// Memory-bound: every weight byte is read once (into registers, or via shared memory in the bulk
// pipeline, gemv_bulk below). The weights are the
// MMA's A operand: a warp takes 16 output rows at once, lane 4g + c rows g and g + 8, 16 bytes of each
// per 128-K tile = the 32 K values kt*128 + 32c .. +31: four 32-bit words, word t holding elements
// 8t .. 8t+7 (nibble i = element 8t + i). The tile's eight m16n8k16 MMAs take K in an order of our
// choosing (a sum does not care), as long as A (weights) and B (x) agree. MMA j = 2t + h takes, as
// A's registers a0/a1 (rows g / g + 8) the nibble pair (2h, 2h+4) of word t and as a2/a3 the pair
// (2h+1, 2h+5): one shift-and-mask places both nibbles of a pair in the two bf16 halves of a register.
// B's registers hold the matching x values of token g: b0 = (x[8t+2h], x[8t+2h+4]),
// b1 = (x[8t+2h+1], x[8t+2h+5]) (byte permutes); tokens 8..15 take a second MMA per A.
//
// NVFP4 exactness: an E2M1 code's bits placed in a bf16 read as value * 2^-126 (subnormal for 0.5);
// the block scale is turned into scale * 2^100 (bf16, exact); their product, value * scale * 2^-26,
// has at most 6 significant bits, so the bf16 multiply is exact and so are the tensor cores' products.
// The fp32 accumulator is multiplied by s2 * 2^26 at the end.
// int4 exactness: a nibble u placed in the mantissa of 128.0 reads as 128 + u; minus 128 + v it is the
// small integer u - v, exact. A tile is one quantization group, so its eight MMAs sum x * (u - v) into
// a fresh fragment that is multiplied by the group's scale (per output row) in fp32.
//
// A block (16 rows) has kWarps warps that split the K tiles (warp w: w, w + kWarps, ...); in the
// register ring (gemv) each warp keeps kDepth tiles of weights and scales in flight in registers (a ring
// of kDepth + 1 slots, the loop unrolled over it, so each refill lands in the slot just consumed without
// register copies); in the bulk pipeline (gemv_bulk, tiled NVFP4) a producer warp keeps the block's
// next tiles coming into shared memory (tiled NVFP4, and tiled int4 where K % 256 == 0).
// The warps' partial sums are added in shared memory, so each output is written once, in bf16: no
// split over blocks, no atomics, no zeroed fp32 buffer and no conversion kernel after.
//
// Grouped: up to kMaxParts weights that read the same x (gate and up, q/k/v) run as one launch, each
// into its own y; block b takes 16 rows of the part it falls in.
// Programmatic dependent launch: a block first lets the next kernel launch, loads its first kDepth
// tiles of weights (which no kernel writes), and only then waits for the previous kernel to finish
// (griddepcontrol.wait) before it reads x: the weight stream starts while the previous kernel drains.

#include "quant_gemv_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace ninfer_sm90 {

constexpr int kTileK = 128;   // K values per warp tile: 4 lanes x 32

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void load_shared(uint4& a, uint4& b, uint32_t address) {  // 32 bytes
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%8];\n\tld.shared.v4.u32 {%4, %5, %6, %7}, [%8 + 16];"
               : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w), "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "r"(address));
}

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Nibble pair (i, i + 4) of word w as two bf16 halves (value * 2^-126 each). I is 0..3.
template <int I>
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w) {
  constexpr int em = 6 - 4 * I, sign = 12 - 4 * I;  // shifts taking bits 4I..4I+2 to 6..8, 4I+3 to 15
  const uint32_t e = em >= 0 ? (w << em) : (w >> -em);
  return (e & 0x01C001C0u) | ((w << sign) & 0x80008000u);
}

// One E4M3 block-scale byte -> scale * 2^100 in both bf16 halves (exact; e4m3 subnormals included).
__device__ __forceinline__ uint32_t scale_pair(uint32_t byte) {
  const float f = __uint_as_float(((byte & 0x80u) << 24) | ((byte & 0x7Fu) << 20));  // scale * 2^-120
  const __nv_bfloat16 s = __float2bfloat16_rn(f * 0x1p110f * 0x1p110f);
  const uint32_t bits = *reinterpret_cast<const uint16_t*>(&s);
  return bits | (bits << 16);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t permute(uint32_t lo, uint32_t hi, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(selector));
  return d;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The m16n8k8 form (Nvfp4Columns): A rows g, g + 8 at K 2c, 2c + 1; B K 2c, 2c + 1 of column g.
__device__ __forceinline__ void mma_bf16_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// x[row, k0 .. k0+31] (64 bytes) as four uint4, zero for rows past M; kShared: x is in shared memory.
// (Reading row M - 1 there instead would do too - an MMA's output column depends on its own B column
// only - but it costs the M <= 8 kernel 13 registers: 77, one block per SM fewer.)
template <bool kShared>
__device__ __forceinline__ void load_x(uint4 (&v)[4], const __nv_bfloat16* x, int row, int M, int K, int k0) {
  if (row < M) {
    const uint4* p = reinterpret_cast<const uint4*>(x + (size_t)row * K + k0);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = kShared ? p[i] : __ldg(p + i);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int t) {
  return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
}

// B's registers for MMA (t, h): x holds this lane's 32 K values of one token as four uint4 (uint4 t =
// elements 8t..8t+7, as bf16 pairs (x0,x1) (x2,x3) (x4,x5) (x6,x7)); -> (x[2h], x[2h+4]), (x[2h+1], x[2h+5]).
__device__ __forceinline__ void x_pair(uint32_t& even, uint32_t& odd, const uint4& v, int h) {
  const uint32_t lo = h ? v.y : v.x, hi = h ? v.w : v.z;
  even = permute(lo, hi, 0x5410u);
  odd = permute(lo, hi, 0x7632u);
}

// B's registers when A's are in the tiled NVFP4 views (elements 4h, 4h+1 then 4h+2, 4h+3): x as loaded.
__device__ __forceinline__ void x_natural(uint32_t& b0, uint32_t& b1, const uint4& v, int h) {
  b0 = h ? v.z : v.x;
  b1 = h ? v.w : v.y;
}

// A tile's eight MMAs, the same for every codec: MMA (t, h) takes A's registers from
// a_regs(t, h, a) (the codec's decode of word t of rows g and g + 8, see the top) and B's from x
// (x_pair, or x_natural for the tiled NVFP4 views), token half th into acc[th][t & 1] (two
// dependency chains).
template <bool kHighTokens, bool kNaturalX, class ARegs>
__device__ __forceinline__ void tile_mmas(float (&acc)[2][2][4], const uint4 (&xl)[4], const uint4 (&xh)[4],
                                          ARegs a_regs) {
#pragma unroll
  for (int t = 0; t < 4; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a[4];
      a_regs(t, h, a);
      uint32_t b0, b1;
      kNaturalX ? x_natural(b0, b1, xl[t], h) : x_pair(b0, b1, xl[t], h);
      mma_bf16(acc[0][t & 1], a, b0, b1);
      if (kHighTokens) {
        kNaturalX ? x_natural(b0, b1, xh[t], h) : x_pair(b0, b1, xh[t], h);
        mma_bf16(acc[1][t & 1], a, b0, b1);
      }
    }
  }
}

// A's registers for MMA (t, h) are made by the codec from word t of the lane's 16 bytes of each row.
struct Nvfp4 {
  static constexpr bool kCapRegisters = false;  // (see Int4Tiled)
  static constexpr bool kBlockColumns = false;  // (see Nvfp4Columns)
  __device__ static void finish(float (&)[2][2][4]) {}
  struct Args {
    const uint8_t* scale;
    const float* s2;
  };
  struct RowAux {  // a row's two block-scale bytes of the tile (the lane's elements 0-15, 16-31)
    uint32_t scales;
  };
  __device__ static RowAux load_row(const Args& a, int row, int K, int kt, int c) {
    return {__ldg(reinterpret_cast<const uint16_t*>(a.scale + (size_t)row * (K / 16) + kt * 8 + 2 * c))};
  }
  // d[token half][chain]: A = rows g (a0, a2) and g + 8 (a1, a3), B = x of tokens g (and g + 8).
  template <bool kHighTokens>
  __device__ static void tile(float (&d)[2][2][4], const uint4& wg, const uint4& wh, const RowAux& ag,
                                const RowAux& ah, const uint4 (&xl)[4], const uint4 (&xh)[4]) {
    const uint32_t sg[2] = {scale_pair(ag.scales & 0xFFu), scale_pair(ag.scales >> 8)};
    const uint32_t sh[2] = {scale_pair(ah.scales & 0xFFu), scale_pair(ah.scales >> 8)};
    tile_mmas<kHighTokens, false>(d, xl, xh, [&](int t, int h, uint32_t (&a)[4]) {
      const uint32_t vg = word(wg, t), vh = word(wh, t);
      a[0] = bf16x2_mul(h ? fp4_pair<2>(vg) : fp4_pair<0>(vg), sg[t >> 1]);
      a[1] = bf16x2_mul(h ? fp4_pair<2>(vh) : fp4_pair<0>(vh), sh[t >> 1]);
      a[2] = bf16x2_mul(h ? fp4_pair<3>(vg) : fp4_pair<1>(vg), sg[t >> 1]);
      a[3] = bf16x2_mul(h ? fp4_pair<3>(vh) : fp4_pair<1>(vh), sh[t >> 1]);
    });
  }
  __device__ static float out_scale(const Args& a) { return __ldg(a.s2) * 0x1p26f; }
};

// The tiled layout re-encodes each word (cuda_ops.ELEMENT_BITS): view V = elements 2V (low half) and
// 2V + 1 (high half) as the bf16 pair of fp4_pair (value * 2^-126: m0 e0 e1 at bits 6-8, the sign at 15
// of each half). View 0's bits lie there, view 1's 4 bits lower, view 2's 10 lower (wrapping: a funnel
// rotate), view 3's m0 6 lower and the rest 14 lower: 1, 2, 2 and 4 instructions (fp4_pair: 3-4 each),
// and views pair consecutive K values as x does.
__device__ __forceinline__ uint32_t rotate_left(uint32_t w, int n) { return __funnelshift_l(w, w, n); }

template <int V>
__device__ __forceinline__ uint32_t fp4_view(uint32_t w) {
  constexpr uint32_t kBits = 0x81C081C0u, kM0 = 0x00400040u;
  if constexpr (V == 0) return w & kBits;
  else if constexpr (V == 1) return (w << 4) & kBits;
  else if constexpr (V == 2) return rotate_left(w, 10) & kBits;
  else return ((w << 6) & kM0) | (rotate_left(w, 14) & (kBits & ~kM0));
}

// A row's two E4M3 scale bytes of the tile (tile_nvfp4 made them non-negative, a zero scale's codes
// zero) -> scale * 2^100 as bf16 in the low and high halves: the hardware's e4m3x2 -> f16x2 (exact,
// e4m3 subnormals are f16 normals), then each half's f16 exponent rebased to bf16's (+112) and + 100
// with one add (f16 >> 3 keeps e4m3's three mantissa bits). A zero scale becomes 2^85, times zero codes.
__device__ __forceinline__ uint32_t scales_tiled(uint32_t bytes) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(bytes)));
  return ((h >> 3) & 0x0FFF0FFFu) + 0x6A006A00u;
}

struct Nvfp4Tiled : Nvfp4 {  // Nvfp4's arguments, scale bytes and output scale; its own decode
  // Lane 4g + c's scale word of K tile kt: each (16 rows, 128 K) tile's 128 bytes in lane order, lane
  // 4g + c's four = row g's blocks 2c, 2c + 1, then row g + 8's.
  __device__ static const uint32_t* tile_scales(const Args& args, int n0, int K, int kt, int g, int c) {
    return reinterpret_cast<const uint32_t*>(args.scale + ((size_t)(n0 / 16) * (K / kTileK) + kt) * 128 +
                                             4 * (4 * g + c));
  }
  __device__ static void load_tile_rows(RowAux& ag, RowAux& ah, const Args& args, int n0, int K, int kt, int g, int c) {
    const uint32_t both = __ldg(tile_scales(args, n0, K, kt, g, c));
    ag = {both & 0xFFFFu};
    ah = {both >> 16};
  }
  static constexpr int kSideBytes = 128;  // a tile's scale bytes, streamed beside its codes (the bulk pipelines)
  // The same from the tile's scale bytes in shared memory (a bulk slot).
  __device__ static void slot_rows(RowAux& ag, RowAux& ah, const uint8_t* side, int lane) {
    const uint32_t both = *reinterpret_cast<const uint32_t*>(side + 4 * lane);
    ag = {both & 0xFFFFu};
    ah = {both >> 16};
  }
  template <bool kHighTokens>
  __device__ static void tile(float (&d)[2][2][4], const uint4& wg, const uint4& wh, const RowAux& ag,
                                const RowAux& ah, const uint4 (&xl)[4], const uint4 (&xh)[4]) {
    const uint32_t pg = scales_tiled(ag.scales), ph = scales_tiled(ah.scales);
    const uint32_t sg[2] = {permute(pg, pg, 0x1010u), permute(pg, pg, 0x3232u)};  // each half broadcast
    const uint32_t sh[2] = {permute(ph, ph, 0x1010u), permute(ph, ph, 0x3232u)};
    tile_mmas<kHighTokens, true>(d, xl, xh, [&](int t, int h, uint32_t (&a)[4]) {
      const uint32_t vg = word(wg, t), vh = word(wh, t);
      a[0] = bf16x2_mul(h ? fp4_view<2>(vg) : fp4_view<0>(vg), sg[t >> 1]);
      a[1] = bf16x2_mul(h ? fp4_view<2>(vh) : fp4_view<0>(vh), sh[t >> 1]);
      a[2] = bf16x2_mul(h ? fp4_view<3>(vg) : fp4_view<1>(vg), sg[t >> 1]);
      a[3] = bf16x2_mul(h ? fp4_view<3>(vh) : fp4_view<1>(vh), sh[t >> 1]);
    });
  }
};

// One token (M = 1) of the tiled NVFP4 layout, the block scales applied to fp32 sums instead of to the
// codes (pipeline ring-block-columns). At one token 7 of B's 8 columns idle; here they keep the blocks
// apart. A tile is 16 m16n8k8 MMAs: for i = 0..7, an "even" one whose A is lane 4g + c's block 2c (view
// i % 4 of word i / 4, rows g and g + 8: K slots 2c, 2c + 1) and an "odd" one with its block 2c + 1 (word
// 2 + i / 4). B (x) is non-zero in lane g = 2c only, b0 = the same positions of x: column 2c then sums
// lane group c's block alone, for every row. Lanes g != 2c read 64 zero bytes after x in shared memory (a
// lane-constant address, no select), so each lane's accumulators c0 / c2 hold rows g / g + 8 of its own
// block - the very blocks of the scale bytes it loads - and four FFMAs a tile apply the scales where the
// ring's kernel takes 32 bf16 multiplies of the codes: 133 instructions a tile against its 165 (SASS).
// Its grid is persistent (gemv_body): x is staged once a block, not once a strip.
// Exactness: the codes enter the MMAs as value * 2^-126 (bf16, subnormal for 0.5) and x as x * 2^100
// (scaled exactly when staged), so the products are value * x * 2^-26, as the ring's kernel's.
struct Nvfp4Columns : Nvfp4Tiled {
  static constexpr bool kBlockColumns = true;
  static constexpr bool kCapRegisters = true;  // 64, no spill at depth 2 (78 uncapped in the persistent loop; depth 4 spills)
  // Rows g and g + 8's scale bytes of K tile kt as loaded (ag: both rows, row g in the low half).
  __device__ static void load_tile_rows(RowAux& ag, RowAux& ah, const Args& args, int n0, int K, int kt, int g, int c) {
    ag = {__ldg(tile_scales(args, n0, K, kt, g, c))};
    ah = {};
  }
  __device__ static void slot_rows(RowAux& ag, RowAux& ah, const uint8_t* side, int lane) {  // (a bulk slot's)
    ag = {*reinterpret_cast<const uint32_t*>(side + 4 * lane)};
    ah = {};
  }
  template <bool kHighTokens>
  __device__ static void tile(float (&d)[2][2][4], const uint4& wg, const uint4& wh, const RowAux& ag,
                              const RowAux&, const uint4 (&x)[4], const uint4 (&)[4]) {
    static_assert(!kHighTokens, "one token");
    float even[4] = {}, odd[4] = {};  // fresh each tile (a tile's scales are its own)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int t = i >> 2, v = i & 3;
      mma_bf16_k8(even, view(word(wg, t), v), view(word(wh, t), v), word(x[t], v));
      mma_bf16_k8(odd, view(word(wg, 2 + t), v), view(word(wh, 2 + t), v), word(x[2 + t], v));
    }
    const float2 sg = scales_float(ag.scales), sh = scales_float(ag.scales >> 16);
    d[0][0][0] += even[0] * sg.x;
    d[0][0][1] += odd[0] * sg.y;
    d[0][0][2] += even[2] * sh.x;
    d[0][0][3] += odd[2] * sh.y;
  }
  // The warp's end: rows g and g + 8 summed over the lane group's blocks into the accumulator slots of
  // token 0 (c = 0's 0 and 2), where store_partial and write_rows take them.
  __device__ static void finish(float (&d)[2][2][4]) {
    float rows[2] = {d[0][0][0] + d[0][0][1], d[0][0][2] + d[0][0][3]};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rows[r] += __shfl_xor_sync(0xFFFFFFFFu, rows[r], 1);
      rows[r] += __shfl_xor_sync(0xFFFFFFFFu, rows[r], 2);
    }
    d[0][0][0] = rows[0];
    d[0][0][2] = rows[1];
  }

 private:
  __device__ static uint32_t view(uint32_t w, int v) {  // (v: a constant once unrolled)
    return v == 0 ? fp4_view<0>(w) : v == 1 ? fp4_view<1>(w) : v == 2 ? fp4_view<2>(w) : fp4_view<3>(w);
  }
  // A row's two scale bytes (blocks 2c, 2c + 1) as floats, exact (e4m3 -> f16 in hardware, then f32).
  __device__ static float2 scales_float(uint32_t bytes) {
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(bytes)));
    return __half22float2(*reinterpret_cast<const __half2*>(&h));
  }
};

// Nibble pair (i, i + 4) of word w as bf16 halves 128 + nibble. I is 0..3.
template <int I>
__device__ __forceinline__ uint32_t int4_pair(uint32_t w) {
  return ((w >> (4 * I)) & 0x000F000Fu) | 0x43004300u;
}

__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// A zero point v (offset-binary, 0..15) as the bf16 pair 128 + v, the bias int4_pair's halves carry.
__device__ __forceinline__ uint32_t biased_zero_pair(uint32_t v) { return (0x4300u | v) * 0x00010001u; }

struct Int4 {
  static constexpr bool kCapRegisters = false;  // (capped, the row-major parts spill)
  static constexpr bool kBlockColumns = false;
  __device__ static void finish(float (&)[2][2][4]) {}
  struct Args {
    const __nv_bfloat16* scale;  // tiled: the records (tile_int4), as bytes
    const int32_t* zero;         // nullptr when symmetric (row-major)
  };
  struct RowAux {  // as loaded; tile() makes the bf16 pair 128 + v and the float scale
    uint32_t zero;   // the row's offset-binary zero point v (8 when symmetric)
    uint32_t scale;  // the row's group scale, bf16 bits in the high half (a float's bits)
  };
  __device__ static RowAux load_row(const Args& a, int row, int K, int kt, int) {
    const int groups = K / kTileK;
    const uint32_t v = a.zero ? (static_cast<uint32_t>(__ldg(a.zero + (size_t)(row / 8) * groups + kt)) >> (4 * (row % 8))) & 15u : 8u;
    return {v, static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(a.scale) + (size_t)row * groups + kt)) << 16};
  }
  // A tile is one group: its MMAs sum x * (u - v) into fresh fragments, scaled per row (d0, d1: row g;
  // d2, d3: row g + 8) into d[token half][0]. zg, zh: 128 + v of rows g and g + 8 as bf16 pairs.
  template <bool kHighTokens>
  __device__ static void group(float (&d)[2][2][4], const uint4& wg, const uint4& wh, uint32_t zg, uint32_t zh, float sg,
                               float sh, const uint4 (&xl)[4], const uint4 (&xh)[4]) {
    float part[2][2][4] = {};
    tile_mmas<kHighTokens, false>(part, xl, xh, [&](int t, int h, uint32_t (&a)[4]) {
      const uint32_t vg = word(wg, t), vh = word(wh, t);
      a[0] = bf16x2_sub(h ? int4_pair<2>(vg) : int4_pair<0>(vg), zg);
      a[1] = bf16x2_sub(h ? int4_pair<2>(vh) : int4_pair<0>(vh), zh);
      a[2] = bf16x2_sub(h ? int4_pair<3>(vg) : int4_pair<1>(vg), zg);
      a[3] = bf16x2_sub(h ? int4_pair<3>(vh) : int4_pair<1>(vh), zh);
    });
#pragma unroll
    for (int th = 0; th < (kHighTokens ? 2 : 1); ++th)
#pragma unroll
      for (int i = 0; i < 4; ++i) d[th][0][i] += (part[th][0][i] + part[th][1][i]) * (i < 2 ? sg : sh);
  }
  template <bool kHighTokens>
  __device__ static void tile(float (&d)[2][2][4], const uint4& wg, const uint4& wh, const RowAux& ag,
                              const RowAux& ah, const uint4 (&xl)[4], const uint4 (&xh)[4]) {
    group<kHighTokens>(d, wg, wh, biased_zero_pair(ag.zero), biased_zero_pair(ah.zero),
                       __uint_as_float(ag.scale), __uint_as_float(ah.scale), xl, xh);
  }
  __device__ static float out_scale(const Args&) { return 1.f; }
};

// Tiled int4 (cuda_ops.tile_int4): the codes in NVFP4's tile order and tile (n0 / 16, kt)'s 16 scales and
// zero points in one 40-byte record: word g (g = 0..7) the bf16 scales of rows g (low half) and g + 8,
// byte 32 + g their zero points' nibbles (row g low). A lane loads its rows' both in two loads where the
// row-major parts take four with 64-bit row arithmetic, and keeps them packed until the tile (the
// row-major parts cost the staged-x kernel 107 registers, half the blocks per SM).
struct Int4Tiled : Int4 {  // Int4's arguments (scale: the records) and MMAs
  // At M <= 8 capped to 64 registers (1,024 threads a SM: 4 blocks of 8 warps, as the NVFP4 kernels reach
  // unforced; forcing those spills), which this one reaches with no spill; uncapped it took 70.
  static constexpr bool kCapRegisters = true;
  struct RowAux {
    uint32_t zeros;   // byte 32 + g
    uint32_t scales;  // word g
  };
  __device__ static void load_tile_rows(RowAux& ag, RowAux& ah, const Args& a, int n0, int K, int kt, int g, int) {
    const uint8_t* record = reinterpret_cast<const uint8_t*>(a.scale) + ((size_t)(n0 / 16) * (K / kTileK) + kt) * 40;
    ag = {__ldg(record + 32 + g), __ldg(reinterpret_cast<const uint32_t*>(record) + g)};
    ah = {};  // (both rows' in ag)
  }
  // The bulk pipeline streams a tile's record beside its codes: a slot's records are 16-byte aligned where
  // its tiles are even in number (cp.async.bulk moves multiples of 16 bytes): K % 256 == 0.
  static constexpr int kSideBytes = 40;
  __device__ static void slot_rows(RowAux& ag, RowAux& ah, const uint8_t* record, int lane) {
    const int g = lane >> 2;
    ag = {record[32 + g], *reinterpret_cast<const uint32_t*>(record + 4 * g)};
    ah = {};
  }
  template <bool kHighTokens>
  __device__ static void tile(float (&d)[2][2][4], const uint4& wg, const uint4& wh, const RowAux& both,
                              const RowAux&, const uint4 (&xl)[4], const uint4 (&xh)[4]) {
    group<kHighTokens>(d, wg, wh, biased_zero_pair(both.zeros & 15u), biased_zero_pair(both.zeros >> 4),
                       __uint_as_float(both.scales << 16), __uint_as_float(both.scales & 0xFFFF0000u), xl, xh);
  }
};

// Rows g and g + 8's scales (and zero points) of K tile kt: the codec's tiled layout's or its row-major
// one's. (The codecs read their arguments with __ldg: picked from the launch's Parts they are registers,
// and a plain dereference of one compiles to a generic load.)
template <class Codec, bool kTiled>
__device__ __forceinline__ void load_rows(typename Codec::RowAux& ag, typename Codec::RowAux& ah,
                                          const typename Codec::Args& args, int n0, int K, int kt, int g, int c) {
  if constexpr (kTiled) {
    Codec::load_tile_rows(ag, ah, args, n0, K, kt, g, c);
  } else {
    ag = Codec::load_row(args, n0 + g, K, kt, c);
    ah = Codec::load_row(args, n0 + g + 8, K, kt, c);
  }
}

constexpr int kMaxParts = 3;

// The weights of a grouped launch: part p (N = rows[p], out y[p] [M, rows[p]]) takes blocks
// first_block[p] onward.
template <class Args>
struct Parts {
  const uint8_t* q[kMaxParts];
  Args args[kMaxParts];
  __nv_bfloat16* y[kMaxParts];
  int rows[kMaxParts];
  int first_block[kMaxParts];  // ascending; INT_MAX for parts not used
  int strips;                   // the parts' 16-row strips, all told
};

template <class Args>
__device__ __forceinline__ int part_of(const Parts<Args>& parts, int block) {
  return (block >= parts.first_block[1]) + (block >= parts.first_block[2]);
}

template <class T>
__device__ __forceinline__ T pick(const T (&values)[kMaxParts], int p) {  // constant indices: no local memory
  return p == 0 ? values[0] : p == 1 ? values[1] : values[2];
}

// The block's end: each warp's two accumulator chains summed into its partial; after a barrier, warp 0
// adds the warps' partials and writes the 16 rows of each token, once, in bf16.
template <bool kHighTokens>
__device__ __forceinline__ void store_partial(float (&partial)[kHighTokens ? 2 : 1][4][32], const float (&d)[2][2][4],
                                              int lane) {
#pragma unroll
  for (int th = 0; th < (kHighTokens ? 2 : 1); ++th)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[th][i][lane] = d[th][0][i] + d[th][1][i];
}

// kGlu: the block's first kWarps / 2 warps summed gate's rows, the others up's: y = SiLU(gate) * up, in
// float32 from the sums (each with its own output scale), rounded once.
template <class Codec, bool kHighTokens, int kWarps, bool kGlu>
__device__ __forceinline__ void write_rows(const float (&partial)[kWarps][kHighTokens ? 2 : 1][4][32],
                                           const Parts<typename Codec::Args>& parts, int strip, int n0, int M, int lane) {
  const int part = kGlu ? 0 : part_of(parts, strip);  // (recomputed: nothing part-dependent stays live)
  const float out_scale = Codec::out_scale(pick(parts.args, part));
  const float up_scale = kGlu ? Codec::out_scale(parts.args[1]) : 0.f;
  __nv_bfloat16* y = pick(parts.y, part);
  const int N = pick(parts.rows, part), g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int th = 0; th < (kHighTokens ? 2 : 1); ++th)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = 0.f, up = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        if (kGlu && w >= kWarps / 2) up += partial[w][th][i][lane];
        else v += partial[w][th][i][lane];
      }
      v *= out_scale;
      if (kGlu) v = v / (1.f + __expf(-v)) * (up * up_scale);
      const int token = 8 * th + 2 * c + (i & 1), row = n0 + g + 8 * (i >> 1);  // the m16n8 accumulator layout
      if (token < M) y[(size_t)token * N + row] = __float2bfloat16_rn(v);
    }
}

__device__ __forceinline__ float2 bf16x2_float(uint32_t v) {  // (low, high) halves, exact
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
}

__device__ __forceinline__ uint32_t float2_bf16x2(float lo, float hi) {  // each rounded to nearest even
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

template <class F>
__device__ __forceinline__ uint4 each_word(const uint4& a, const uint4& b, F f) {
  return make_uint4(f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w));
}

// squares plus eight bf16 values' squares, added one by one.
__device__ __forceinline__ float add_squares(float squares, const uint4& v) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (uint32_t word : words) {
    const float2 f = bf16x2_float(word);
    squares += f.x * f.x + f.y * f.y;
  }
  return squares;
}

// The 64 zero bytes after a staged row that Nvfp4Columns' idle lanes read.
__device__ __forceinline__ void zeros_after(uint4* staged, int K) {
  if (threadIdx.x < 4) staged[K / 8 + threadIdx.x] = make_uint4(0, 0, 0, 0);
}

// Eight bf16 values times 2^100, exact (Nvfp4Columns stages x so: see its exactness note).
__device__ __forceinline__ uint4 times_2_to_100(const uint4& v) {
  constexpr uint32_t kTwoTo100 = 0x71807180u;  // bf16 2^100 in both halves
  return make_uint4(bf16x2_mul(v.x, kTwoTo100), bf16x2_mul(v.y, kTwoTo100), bf16x2_mul(v.z, kTwoTo100),
                    bf16x2_mul(v.w, kTwoTo100));
}

// x as Nvfp4Columns reads it, staged in shared memory by kThreads threads: times 2^100, then the 64 zero
// bytes its idle lanes read.
template <int kThreads>
__device__ __forceinline__ void stage_x_columns(uint4* staged, const __nv_bfloat16* __restrict__ x, int K) {
  const uint4* rows = reinterpret_cast<const uint4*>(x);
  for (int i = threadIdx.x; i < K / 8 + 4; i += kThreads)
    staged[i] = i < K / 8 ? times_2_to_100(__ldg(rows + i)) : make_uint4(0, 0, 0, 0);
}

// A barrier of the bulk pipelines' kWarps consumer warps alone (named barrier 1: the producer warp has left).
template <int kWarps>
__device__ __forceinline__ void sync_consumers() {
  asm volatile("bar.sync 1, %0;" ::"r"(kWarps * 32) : "memory");
}

// Nvfp4Columns' staging with norm.weight set (NinferAddNorm): x + residual, rounded as torch's bf16 add
// (a float sum rounded once), its sum of squares over the block, then the normed row as
// layers.rms_norm_reference rounds it (offset: normed * (offset + w) in float32, cast once; offset 0:
// the cast normed times the weight, rounded), staged times 2^100 (kColumns; else as it is, for the row
// form, and no zeros after it). Every block computes the same row (the same threads sum the same values in
// the same order); block 0 writes the sum and the normed row.
// kConsumers: the bulk pipelines' kWarps consumer warps stage it (their own barrier: the producer has left).
template <int kWarps, bool kConsumers = false, bool kColumns = true>
__device__ __forceinline__ void stage_add_norm(uint4* staged, const __nv_bfloat16* __restrict__ x,
                                               const NinferAddNorm& norm, int K) {
  __shared__ float warp_squares[kWarps];
  const uint4* rows = reinterpret_cast<const uint4*>(x);
  const uint4* residual = static_cast<const uint4*>(norm.residual);
  const bool writer = blockIdx.x == 0;
  float squares = 0.f;
  for (int i = threadIdx.x; i < K / 8; i += kWarps * 32) {
    uint4 v = __ldg(rows + i);
    if (residual != nullptr)
      v = each_word(v, __ldg(residual + i), [](uint32_t a, uint32_t b) {
        const float2 fa = bf16x2_float(a), fb = bf16x2_float(b);
        return float2_bf16x2(fa.x + fb.x, fa.y + fb.y);
      });
    squares = add_squares(squares, v);
    staged[i] = v;
    if (writer && norm.sum_out != nullptr) static_cast<uint4*>(norm.sum_out)[i] = v;
  }
#pragma unroll
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) squares += __shfl_xor_sync(0xFFFFFFFFu, squares, lane_mask);
  if ((threadIdx.x & 31) == 0) warp_squares[threadIdx.x >> 5] = squares;
  if constexpr (kConsumers) sync_consumers<kWarps>();
  else __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_squares[w];
  const float rstd = rsqrtf(total / K + norm.eps), offset = norm.offset;
  const uint4* weight = static_cast<const uint4*>(norm.weight);
  for (int i = threadIdx.x; i < K / 8; i += kWarps * 32) {
    const uint4 y = each_word(staged[i], __ldg(weight + i), [rstd, offset](uint32_t s, uint32_t w) {
      const float2 fs = bf16x2_float(s), fw = bf16x2_float(w);
      const float lo = __fmul_rn(fs.x, rstd), hi = __fmul_rn(fs.y, rstd);
      if (offset != 0.f) return float2_bf16x2(__fmul_rn(lo, __fadd_rn(offset, fw.x)), __fmul_rn(hi, __fadd_rn(offset, fw.y)));
      const float2 cast = bf16x2_float(float2_bf16x2(lo, hi));
      return float2_bf16x2(__fmul_rn(fw.x, cast.x), __fmul_rn(fw.y, cast.y));
    });
    if (writer && norm.normed_out != nullptr) static_cast<uint4*>(norm.normed_out)[i] = y;
    staged[i] = kColumns ? times_2_to_100(y) : y;
  }
  if constexpr (kColumns) zeros_after(staged, K);
}

struct PlainX {};  // a launch that stages x as it is (the other: NinferAddNorm)

// Grid (sum of the parts' N) / 16 blocks of kWarps warps (see the top). kStagedX (ring-staged-x, the
// engine's pipeline since stop 18): the block first copies x [M, K] into shared memory with all its threads, so
// each tile's x is a shared-memory read instead of an L2 round trip in the tile's critical path.
template <class Codec, bool kHighTokens, int kWarps, int kDepth, bool kTiled, bool kStagedX, class Stage>
__device__ __forceinline__ void gemv_strip(const __nv_bfloat16* __restrict__ x, const Parts<typename Codec::Args>& parts,
                                           int M, int K, int strip, bool first_strip, const Stage& stage) {
  extern __shared__ uint4 x_staged[];  // kStagedX: M * K bf16
  using RowAux = typename Codec::RowAux;
  const int part = part_of(parts, strip);
  const uint8_t* q = pick(parts.q, part);
  const typename Codec::Args args = pick(parts.args, part);
  const int block = strip - pick(parts.first_block, part);  // within the part
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int n0 = block * 16, tiles = K / kTileK;
  const int steps = warp < tiles ? (tiles - warp + kWarps - 1) / kWarps : 0;  // this warp's K tiles
  // row-major: + 64 bytes per K tile; tiled (see tile): each (16 rows, 128 K) tile is 1 KB, lane order
  const uint8_t* wg_lane = kTiled ? q + (size_t)block * tiles * 1024 + 16 * lane
                                  : q + (size_t)(n0 + g) * (K / 2) + 16 * c;  // + 64 per tile
  const uint8_t* wh_lane = kTiled ? wg_lane + 512 : wg_lane + (size_t)8 * (K / 2);
  constexpr int kStride = kTiled ? 1024 : 64;
  constexpr int kRing = kDepth + 1;  // a slot more than in flight: the refill of step j goes to the slot step
                                     // j - 1 consumed, so each slot keeps its registers (no copies)
  uint4 wg[kRing], wh[kRing];
  RowAux ag[kRing], ah[kRing];
#pragma unroll
  for (int i = 0; i < kDepth; ++i) {
    if (i < steps) {
      const int kt = warp + i * kWarps;
      wg[i] = load_stream(wg_lane + (size_t)kt * kStride);
      wh[i] = load_stream(wh_lane + (size_t)kt * kStride);
      load_rows<Codec, kTiled>(ag[i], ah[i], args, n0, K, kt, g, c);
    }
  }
  if (first_strip) asm volatile("griddepcontrol.wait;" ::: "memory");  // x is the previous kernel's output
  const __nv_bfloat16* xs = x;
  if (kStagedX && first_strip) {
    const uint4* rows = reinterpret_cast<const uint4*>(x);
    if constexpr (Codec::kBlockColumns) {  // x * 2^100, then 64 zero bytes
      if constexpr (std::is_same_v<Stage, NinferAddNorm>) {
        stage_add_norm<kWarps>(x_staged, x, stage, K);
      } else {
        stage_x_columns<kWarps * 32>(x_staged, x, K);
      }
    } else {
      for (int i = threadIdx.x; i < M * K / 8; i += kWarps * 32) x_staged[i] = __ldg(rows + i);
    }
    __syncthreads();
  }
  if constexpr (kStagedX) xs = reinterpret_cast<const __nv_bfloat16*>(x_staged);
  // Nvfp4Columns: lane g = 2c reads B's x, its group's 32 values of each tile; the others the zeros after x.
  // (An address carried from tile to tile: recomputed from the lane index it cost ~20 instructions a tile.)
  const uint32_t x_step = g == 2 * c ? 2 * kTileK * kWarps : 0;  // bytes from one of the warp's tiles to the next
  uint32_t x_next = shared_address(x_staged) + (g == 2 * c ? 64 * c + 2 * kTileK * warp : 2 * K);
  // Nvfp4Columns: the tile kDepth steps ahead's codes and scale words (Nvfp4Tiled::tile_scales) at addresses
  // carried from tile to tile, as x's.
  const uint8_t* w_ahead = wg_lane + (size_t)(warp + kDepth * kWarps) * kStride;
  const uint32_t* scales_ahead = nullptr;
  if constexpr (Codec::kBlockColumns) scales_ahead = Codec::tile_scales(args, n0, K, warp + kDepth * kWarps, g, c);
  float d[2][2][4] = {};
  for (int s = 0; s < steps; s += kRing) {
#pragma unroll
    for (int i = 0; i < kRing; ++i) {
      if (s + i < steps) {
        const int kt = warp + (s + i) * kWarps;
        if (s + i + kDepth < steps) {  // the tile kDepth steps ahead, into the slot the last step freed
          const int slot = (i + kDepth) % kRing;  // (a constant: the loop is unrolled)
          const int next = kt + kDepth * kWarps;
          if constexpr (Codec::kBlockColumns) {
            wg[slot] = load_stream(w_ahead);
            wh[slot] = load_stream(w_ahead + 512);
            ag[slot] = {__ldg(scales_ahead)};
          } else {
            wg[slot] = load_stream(wg_lane + (size_t)next * kStride);
            wh[slot] = load_stream(wh_lane + (size_t)next * kStride);
            load_rows<Codec, kTiled>(ag[slot], ah[slot], args, n0, K, next, g, c);
          }
        }
        w_ahead += kWarps * kStride;
        scales_ahead += kWarps * 32;
        const int k0 = kt * kTileK + 32 * c;
        uint4 xl[4], xh[4];
        if constexpr (Codec::kBlockColumns) {
          load_shared(xl[0], xl[1], x_next);
          load_shared(xl[2], xl[3], x_next + 32);
          x_next += x_step;
        } else {
          load_x<kStagedX>(xl, xs, g, M, K, k0);
          if (kHighTokens) load_x<kStagedX>(xh, xs, g + 8, M, K, k0);
        }
        Codec::template tile<kHighTokens>(d, wg[i], wh[i], ag[i], ah[i], xl, xh);
      }
    }
  }
  Codec::finish(d);
  __shared__ float partial[kWarps][kHighTokens ? 2 : 1][4][32];
  if (!first_strip) __syncthreads();  // warp 0 has written the block's last strip out of partial
  store_partial<kHighTokens>(partial[warp], d, lane);
  __syncthreads();
  if (warp == 0) write_rows<Codec, kHighTokens, kWarps, false>(partial, parts, strip, n0, M, lane);
}

// One strip (16 rows) a block; Nvfp4Columns' grid is persistent instead (as many blocks as fit at once,
// launch_ring): block b takes strips b, b + grid, ..., its x staged once.
// stage: how Nvfp4Columns stages x (PlainX, or NinferAddNorm; the other codecs take PlainX).
template <class Codec, bool kHighTokens, int kWarps, int kDepth, bool kTiled, bool kStagedX, class Stage = PlainX>
__device__ __forceinline__ void gemv_body(const __nv_bfloat16* __restrict__ x, const Parts<typename Codec::Args>& parts,
                                          int M, int K, const Stage& stage = {}) {
  asm volatile("griddepcontrol.launch_dependents;");
  if constexpr (Codec::kBlockColumns) {
    for (int strip = blockIdx.x; strip < parts.strips; strip += gridDim.x)
      gemv_strip<Codec, kHighTokens, kWarps, kDepth, kTiled, kStagedX>(x, parts, M, K, strip, strip == blockIdx.x, stage);
  } else {
    gemv_strip<Codec, kHighTokens, kWarps, kDepth, kTiled, kStagedX>(x, parts, M, K, blockIdx.x, true, stage);
  }
}

template <class Codec, bool kHighTokens, int kWarps, int kDepth, bool kTiled, bool kStagedX>
__global__ void __launch_bounds__(kWarps * 32) gemv(const __nv_bfloat16* __restrict__ x,
                                                      const Parts<typename Codec::Args> parts, int M, int K) {
  gemv_body<Codec, kHighTokens, kWarps, kDepth, kTiled, kStagedX>(x, parts, M, K);
}

// The same with registers capped for 1,024 threads a SM (Codec::kCapRegisters, M <= 8). (A minimum of
// blocks is not neutral: the NVFP4 kernels, 64 registers unforced, take 101 with a minimum of 1 and
// spill with 4.)
template <class Codec, int kWarps, int kDepth, bool kTiled, bool kStagedX>
__global__ void __launch_bounds__(kWarps * 32, 1024 / (kWarps * 32)) gemv_capped(const __nv_bfloat16* __restrict__ x,
                                                      const Parts<typename Codec::Args> parts, int M, int K) {
  gemv_body<Codec, false, kWarps, kDepth, kTiled, kStagedX>(x, parts, M, K);
}

// Nvfp4Columns with x staged through the layer norm before the GEMV (Stage: NinferAddNorm), gemv_capped's
// bounds: the norm a parameter of this kernel alone, so the plain one's loop keeps its schedule. (As a
// member of Parts the norm moved every kernel's M and K, and ptxas scheduled the plain block-columns loop
// differently: 20.8 against 18.8 us a launch in the engine on the H200, 7% of C = 1, stop 23.) The GDN
// output norm and SwiGLU's SiLU-mul were staged so too, and lost (stop 24): their SiLU, computed again in
// every block (320 blocks of out_proj or down), cost more than the launch it saved.
template <class Stage, int kWarps, int kDepth>
__global__ void __launch_bounds__(kWarps * 32, 1024 / (kWarps * 32)) gemv_staged(const __nv_bfloat16* __restrict__ x,
                                                      const Parts<Nvfp4::Args> parts, int M, int K, const Stage stage) {
  gemv_body<Nvfp4Columns, false, kWarps, kDepth, true, true, Stage>(x, parts, M, K, stage);
}

// The bulk-copy pipeline (tiled NVFP4). In the kernel above a warp's next loads wait for its arithmetic
// and the tiles in flight cost registers (so blocks): in the MLP chain it reached 63% of copy where a flat
// read of the same bytes reached 86%. Here a producer warp streams the block's 16-row strip (contiguous in
// the tiled layout) through kStages shared-memory slots with bulk asynchronous copies (cp.async.bulk, the
// TMA engine; an mbarrier counts the bytes in), while kWarps consumer warps compute: the bytes in flight
// cost shared memory only and keep coming while the warps compute. A slot holds one chunk: kWarps
// consecutive K tiles, codes and scales (two copies), tile w for consumer warp w. A consumer frees the slot
// (the empty barrier) as soon as its tile is in registers; the producer refills it with chunk j + kStages.
__device__ __forceinline__ void barrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {  // the producer's arrival
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(shared_address(bar)), "r"(parity) : "memory");
  } while (!done);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(shared_address(dst)), "l"(src), "r"(bytes), "r"(shared_address(bar)) : "memory");
}

template <class Codec>
constexpr int kTileBytes = 1024 + Codec::kSideBytes;  // a tile in a slot: codes, then scales (or records)

template <class Codec, int kWarps, int kStages>
constexpr int bulk_shared_bytes() { return kStages * kWarps * kTileBytes<Codec>; }

// The bulk pipelines' slot barriers, set up by thread 0 before any thread uses them: a slot is full once the
// producer's bytes land, empty once every consumer lane has read it.
template <int kWarps, int kStages>
__device__ __forceinline__ void init_slot_barriers(uint64_t* full, uint64_t* empty) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], kWarps * 32);  // every consumer lane arrives
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// The bulk pipelines' producer (one lane): the block's strip of kWeights weights (parts part, part + 1),
// chunk by chunk (kWarps / kWeights K tiles of each), into kStages slots of codes then scales (Codec's side
// bytes: NVFP4's scales, int4's records; a slot's tile w is consumer warp w's); a refill first waits for the
// consumers to free its slot. first: the block's chunks before this strip's (a persistent grid's blocks
// stream strip after strip through the same slots).
template <class Codec, int kWarps, int kStages, int kWeights>
__device__ __forceinline__ void produce_chunks(uint8_t* slots, uint64_t* full, uint64_t* empty,
                                               const Parts<typename Codec::Args>& parts, int part, int block,
                                               int tiles, int first = 0) {
  constexpr int kCodes = kWarps * 1024, kSplit = kWarps / kWeights, kSide = Codec::kSideBytes;
  const int chunks = (tiles + kSplit - 1) / kSplit;
  const uint8_t* codes[kWeights];
  const uint8_t* sides[kWeights];
#pragma unroll
  for (int p = 0; p < kWeights; ++p) {
    codes[p] = pick(parts.q, part + p) + (size_t)block * tiles * 1024;
    sides[p] = reinterpret_cast<const uint8_t*>(pick(parts.args, part + p).scale) + (size_t)block * tiles * kSide;
  }
  for (int j = 0; j < chunks; ++j) {
    const int at = first + j, slot = at % kStages, n = min(kSplit, tiles - j * kSplit);
    if (at >= kStages) barrier_wait(&empty[slot], (at / kStages - 1) & 1);
    barrier_expect_bytes(&full[slot], kWeights * n * kTileBytes<Codec>);
#pragma unroll
    for (int p = 0; p < kWeights; ++p) {
      const int tile = slot * kWarps + p * kSplit;  // the slot's first tile of weight p
      bulk_copy(slots + tile * 1024, codes[p] + (size_t)j * kSplit * 1024, n * 1024, &full[slot]);
      bulk_copy(slots + kStages * kCodes + tile * kSide, sides[p] + (size_t)j * kSplit * kSide, n * kSide, &full[slot]);
    }
  }
}

// (At M <= 8, registers capped for 3 blocks of 8 consumer warps per SM, 5 of 4: no spills.)
// kGlu (two parts of one N, gate and up): N / 16 blocks; a slot holds kWarps / 2 K tiles of gate, then as
// many of up, so the block's first half of warps sum gate's rows, the others up's, and the block writes
// SiLU(gate) * up (write_rows): the SwiGLU MLP's activation needs no kernel of its own. (In the register
// ring the same split measured slower: its warps' weight pointers leave the uniform registers, 70
// registers, 3 blocks per SM instead of 4.)
// Codec: Nvfp4Tiled or Int4Tiled (the slot's side bytes, a tile's scales or record, read by Codec::slot_rows).
template <class Codec, bool kHighTokens, int kWarps, int kStages, bool kGlu>
__global__ void __launch_bounds__((kWarps + 1) * 32, kHighTokens ? 1 : (kWarps == 8 ? 3 : 5)) gemv_bulk(const __nv_bfloat16* __restrict__ x,
                                                               const Parts<typename Codec::Args> parts, int M, int K) {
  constexpr int kCodes = kWarps * 1024, kSides = kWarps * Codec::kSideBytes;  // a slot's bytes
  constexpr int kSplit = kGlu ? kWarps / 2 : kWarps;             // K tiles of one weight in a slot
  extern __shared__ __align__(128) uint8_t slots[];              // codes [kStages][kCodes], sides [kStages][kSides]
  __shared__ uint64_t full[kStages], empty[kStages];
  asm volatile("griddepcontrol.launch_dependents;");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tiles = K / kTileK, chunks = (tiles + kSplit - 1) / kSplit;
  init_slot_barriers<kWarps, kStages>(full, empty);
  const int part = kGlu ? 0 : part_of(parts, blockIdx.x);
  const int block = blockIdx.x - (kGlu ? 0 : pick(parts.first_block, part));  // within the part
  if (warp == kWarps) {  // the producer: weights only, which no kernel writes, so no griddepcontrol.wait
    if (lane == 0) produce_chunks<Codec, kWarps, kStages, kGlu ? 2 : 1>(slots, full, empty, parts, part, block, tiles);
    return;
  }
  const int kw = kGlu ? warp % kSplit : warp;  // the first K tile of this warp's weight it takes
  asm volatile("griddepcontrol.wait;" ::: "memory");  // x is the previous kernel's output
  // x: rows past M read row M - 1 instead of zeros (an MMA's output column depends on its own B column
  // only, and those tokens are not written): no predicates, no zero fills. A tile past the last (a
  // partial last chunk) reads the last tile's x. Loaded a chunk ahead, into the other of two buffers.
  const int g = lane >> 2, c = lane & 3;
  const uint4* x_low = reinterpret_cast<const uint4*>(x + (size_t)min(g, M - 1) * K + kw * kTileK + 32 * c);
  const uint4* x_high = reinterpret_cast<const uint4*>(x + (size_t)min(g + 8, M - 1) * K + kw * kTileK + 32 * c);
  const int last_x = (tiles - 1 - kw) * kTileK / 8;  // in uint4, from x_low / x_high
  auto load_tile_x = [&](uint4 (&xl)[4], uint4 (&xh)[4], int j) {
    const int at = min(j * kSplit * kTileK / 8, last_x);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xl[i] = __ldg(x_low + at + i);
      if (kHighTokens) xh[i] = __ldg(x_high + at + i);
    }
  };
  float d[2][2][4] = {};
  const uint8_t* codes = slots + warp * 1024 + 16 * lane;                    // slot 0's, this lane's
  const uint8_t* sides = slots + kStages * kCodes + warp * Codec::kSideBytes;  // slot 0's, this warp's tile's
  // Chunk j in slot i (the loop is unrolled over the slots: constant offsets, constant x buffers).
  auto step = [&](int j, int i, uint32_t parity, const uint4 (&xl)[4], const uint4 (&xh)[4], uint4 (&next_l)[4],
                  uint4 (&next_h)[4]) {
    load_tile_x(next_l, next_h, j + 1);
    barrier_wait(&full[i], parity);
    const uint4 wg = *reinterpret_cast<const uint4*>(codes + i * kCodes);
    const uint4 wh = *reinterpret_cast<const uint4*>(codes + i * kCodes + 512);
    typename Codec::RowAux ag, ah;
    Codec::slot_rows(ag, ah, sides + i * kSides, lane);
    // Every lane frees the slot after its own reads; the reads are the generic proxy's and the refill
    // the async proxy's writes, so a proxy fence orders them (without it the GPU tests saw refills
    // land before reads at M > 1).
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    barrier_arrive(&empty[i]);
    if (j * kSplit + kw < tiles) Codec::template tile<kHighTokens>(d, wg, wh, ag, ah, xl, xh);
  };
  static_assert(kStages % 2 == 0, "two x buffers alternate over the slots");
  uint4 xl[2][4], xh[2][4];
  load_tile_x(xl[0], xh[0], 0);
  for (int j0 = 0; j0 < chunks; j0 += kStages) {
    const uint32_t parity = (j0 / kStages) & 1;
#pragma unroll
    for (int i = 0; i < kStages; ++i)
      if (j0 + i < chunks) step(j0 + i, i, parity, xl[i & 1], xh[i & 1], xl[(i + 1) & 1], xh[(i + 1) & 1]);
  }
  __shared__ float partial[kWarps][kHighTokens ? 2 : 1][4][32];
  store_partial<kHighTokens>(partial[warp], d, lane);
  sync_consumers<kWarps>();
  if (warp == 0) write_rows<Codec, kHighTokens, kWarps, kGlu>(partial, parts, blockIdx.x, block * 16, M, lane);
}

// One token in the bulk pipeline with a persistent grid (pipelines bulk-block-columns, NVFP4, and
// bulk-staged-x, int4): the producer streams the block's strips as gemv_bulk's does, so the bytes in flight
// cost shared memory, not registers (the ring holds kDepth tiles a warp in registers, 64 of them at its 4
// blocks a SM); block b takes strips b, b + grid, ..., as ring-block-columns', and its slots run on from strip
// to strip (gate and up's strips are 5 chunks: one strip a block would drain the slots each time); the
// consumers stage x once a block (after the slots). Codec::kBlockColumns (Nvfp4Columns): x times 2^100, then
// the 64 zero bytes, and each tile with ring-block-columns' arithmetic (with the barrier work, ~155 SASS
// instructions a tile against the bulk row form's 174); Stage: x as it is (PlainX) or through the layer's add
// + RMSNorm (NinferAddNorm, staged once a block, so a persistent grid pays it ~400 times a launch, not once a
// strip). Otherwise (Int4Tiled) x as it is (or through the norm, unscaled) and the row form's arithmetic: a
// tile's x is two shared-memory loads, not gemv_bulk's four through L1 (its scale is one a row a tile: no
// block-columns form applies).
// kGlu (gate and up of one N): a strip is gate's 16 rows, then up's, streamed one after the other, and the
// block writes SiLU(gate) * up (write_rows): a one-row MLP is then two GEMVs back to back, each the next's
// programmatic dependent (a kernel between them, norm or SiLU-mul, exposes the persistent grid's start and
// end: stop 25's chain).
template <class Codec, int kWarps, int kStages, class Stage, bool kGlu>
__global__ void __launch_bounds__((kWarps + 1) * 32, kWarps == 8 ? 3 : 5) gemv_bulk_persistent(
    const __nv_bfloat16* __restrict__ x, const Parts<typename Codec::Args> parts, int M, int K, const Stage stage) {
  constexpr int kCodes = kWarps * 1024, kSides = kWarps * Codec::kSideBytes;  // a slot's bytes
  constexpr int kWeights = kGlu ? 2 : 1;                                       // the weights a strip streams
  extern __shared__ __align__(128) uint8_t slots[];  // codes, sides [kStages][...], then x
  __shared__ uint64_t full[kStages], empty[kStages];
  asm volatile("griddepcontrol.launch_dependents;");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tiles = K / kTileK, chunks = (tiles + kWarps - 1) / kWarps;
  const int strips = kGlu ? parts.strips / 2 : parts.strips;  // (glu: gate's, each with up's beside)
  init_slot_barriers<kWarps, kStages>(full, empty);
  if (warp == kWarps) {
    if (lane == 0) {
      for (int strip = blockIdx.x, first = 0; strip < strips; strip += gridDim.x) {
#pragma unroll
        for (int w = 0; w < kWeights; ++w, first += chunks) {
          const int part = kGlu ? w : part_of(parts, strip);
          produce_chunks<Codec, kWarps, kStages, 1>(slots, full, empty, parts, part,
                                                    kGlu ? strip : strip - pick(parts.first_block, part), tiles, first);
        }
      }
    }
    return;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");  // x is the previous kernel's output
  uint4* x_staged = reinterpret_cast<uint4*>(slots + kStages * (kCodes + kSides));
  if constexpr (std::is_same_v<Stage, NinferAddNorm>) {
    stage_add_norm<kWarps, true, Codec::kBlockColumns>(x_staged, x, stage, K);
  } else if constexpr (!Codec::kBlockColumns) {
    const uint4* rows = reinterpret_cast<const uint4*>(x);
    for (int i = threadIdx.x; i < K / 8; i += kWarps * 32) x_staged[i] = __ldg(rows + i);
  } else {
    stage_x_columns<kWarps * 32>(x_staged, x, K);
  }
  sync_consumers<kWarps>();
  // Each lane's 32 values of each of its warp's tiles (K 128 kt + 32 c ..); Nvfp4Columns' lanes g != 2c read
  // the zeros after x instead. (As gemv_strip's, written out there too: as a shared helper it rescheduled the
  // measured block-columns loop.)
  const int g = lane >> 2, c = lane & 3;
  const bool reads_x = !Codec::kBlockColumns || g == 2 * c;
  const uint32_t x_step = reads_x ? 2 * kTileK * kWarps : 0;  // bytes from a chunk's tile to the next's
  const uint32_t x_first = shared_address(x_staged) + (reads_x ? 64 * c + 2 * kTileK * warp : 2 * K);
  const uint8_t* codes = slots + warp * 1024 + 16 * lane;                      // slot 0's, this lane's
  const uint8_t* sides = slots + kStages * kCodes + warp * Codec::kSideBytes;  // slot 0's, this warp's tile's
  __shared__ float partial[kWeights * kWarps][1][4][32];  // (glu: gate's warps, then up's)
  uint32_t slot = 0, parity = 0;  // the block's chunk count so far, % kStages and / kStages % 2
  for (int strip = blockIdx.x; strip < strips; strip += gridDim.x) {
#pragma unroll 1
    for (int w = 0; w < kWeights; ++w) {
      float d[2][2][4] = {};
      uint32_t x_next = x_first;
      for (int j = 0; j < chunks; ++j) {
        barrier_wait(&full[slot], parity);
        const uint4 wg = *reinterpret_cast<const uint4*>(codes + slot * kCodes);
        const uint4 wh = *reinterpret_cast<const uint4*>(codes + slot * kCodes + 512);
        typename Codec::RowAux ag, ah;
        Codec::slot_rows(ag, ah, sides + slot * kSides, lane);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (as gemv_bulk's: reads before refill)
        barrier_arrive(&empty[slot]);
        if (j * kWarps + warp < tiles) {  // (a partial last chunk)
          uint4 xl[4], none[4];
          load_shared(xl[0], xl[1], x_next);
          load_shared(xl[2], xl[3], x_next + 32);
          Codec::template tile<false>(d, wg, wh, ag, ah, xl, none);
        }
        x_next += x_step;
        if (++slot == kStages) slot = 0, parity ^= 1;
      }
      Codec::finish(d);
      if (w == 0 && strip != blockIdx.x) sync_consumers<kWarps>();  // warp 0 has read the last strip's sums
      store_partial<false>(partial[w * kWarps + warp], d, lane);
    }
    sync_consumers<kWarps>();
    if (warp == 0) {
      const int part = kGlu ? 0 : part_of(parts, strip);
      write_rows<Codec, false, kWeights * kWarps, kGlu>(partial, parts, strip,
                                                        (strip - pick(parts.first_block, part)) * 16, M, lane);
    }
  }
}

constexpr int kDefaultSharedBytes = 48 * 1024;  // dynamic shared memory a kernel gets without an opt-in


struct Launch {  // cudaLaunchKernelEx's configuration, with or without programmatic dependent launch
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};
  Launch(int blocks, int threads, size_t shared, bool pdl, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = pdl ? 1 : 0;
  }
};

// The kernel for M <= 8 rows (capped where the codec asks).
template <class Codec, int kWarps, int kDepth, bool kTiled, bool kStagedX>
constexpr auto low_rows_kernel() {
  if constexpr (Codec::kCapRegisters) return gemv_capped<Codec, kWarps, kDepth, kTiled, kStagedX>;
  else return gemv<Codec, false, kWarps, kDepth, kTiled, kStagedX>;
}

// A one-row block-columns launch: as many blocks as fit at once (gemv_body walks the strips), x_bytes staged.
// stage: how x is staged (PlainX, or NinferAddNorm: gemv_staged).
template <int kWarps, int kDepth, class Stage = PlainX>
cudaError_t launch_persistent(const __nv_bfloat16* x, const Parts<Nvfp4::Args>& parts, int blocks, int K,
                              int x_bytes, bool pdl, cudaStream_t stream, const Stage& stage = {}) {
  constexpr bool kPlain = std::is_same_v<Stage, PlainX>;
  auto* kernel = [] {
    if constexpr (kPlain) return low_rows_kernel<Nvfp4Columns, kWarps, kDepth, true, true>();
    else return gemv_staged<Stage, kWarps, kDepth>;
  }();
  // Its static shared memory (the partial sums; stage_add_norm's warp sums too) and blocks a SM, asked
  // once a kernel (not on every decode launch) with the most x a launch stages: a bound every launch meets
  // (its registers, not its x, set it: 4 blocks of 8 warps). (Asked with more shared memory than a block
  // gets, the occupancy API answers 0: the fused norm's 32 B of warp sums made it 1 block a SM, 3x slower.)
  static const std::pair<int, int> static_bytes_and_blocks = [kernel] {
    cudaFuncAttributes attributes{};
    cudaFuncGetAttributes(&attributes, kernel);
    const int fixed = static_cast<int>(attributes.sharedSizeBytes);
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarps * 32, kDefaultSharedBytes - fixed);
    return std::pair<int, int>(fixed, std::max(n, 1));
  }();
  const auto [static_bytes, per_sm] = static_bytes_and_blocks;
  if (x_bytes + static_bytes > kDefaultSharedBytes) return cudaErrorInvalidValue;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  Launch l(std::min(blocks, per_sm * sms), kWarps * 32, x_bytes, pdl, stream);
  if constexpr (kPlain) return cudaLaunchKernelEx(&l.config, kernel, x, parts, 1, K);
  else return cudaLaunchKernelEx(&l.config, kernel, x, parts, 1, K, stage);
}

template <class Codec, int kWarps, int kDepth, bool kTiled>
cudaError_t launch_ring(const void* x, const Parts<typename Codec::Args>& parts, int blocks, int M, int K, bool pdl,
                        int pipeline, const NinferAddNorm* norm, cudaStream_t stream) {
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  // x and the kernel's static partial sums within the 48 KB a block gets without an opt-in (o_proj's
  // K = 6144 at M = 4 is exactly 48 KB of x: that launch failed until the partials were counted)
  constexpr int kPartialBytes = sizeof(float[kWarps][4][32]);
  if constexpr (kTiled && std::is_same_v<Codec, Nvfp4Tiled>) {
    const int x_bytes = K * 2 + 64;  // x and the zeros Nvfp4Columns' idle lanes read
    if (pipeline == kRingBlockColumns && M == 1 && x_bytes + kPartialBytes <= kDefaultSharedBytes) {
      if (norm != nullptr) return launch_persistent<kWarps, kDepth>(xb, parts, blocks, K, x_bytes, pdl, stream, *norm);
      return launch_persistent<kWarps, kDepth>(xb, parts, blocks, K, x_bytes, pdl, stream);
    }
  }
  if (norm != nullptr) return cudaErrorInvalidValue;  // Nvfp4Columns' only
  if constexpr (kTiled) {
    const bool staged = pipeline == kRingStagedX || pipeline == kRingBlockColumns;
    if (staged && M <= 8 && M * K * 2 + kPartialBytes <= kDefaultSharedBytes) {
      Launch l(blocks, kWarps * 32, M * K * 2, pdl, stream);
      return cudaLaunchKernelEx(&l.config, low_rows_kernel<Codec, kWarps, kDepth, kTiled, true>(), xb, parts, M, K);
    }
  }
  Launch l(blocks, kWarps * 32, 0, pdl, stream);
  return M > 8 ? cudaLaunchKernelEx(&l.config, gemv<Codec, true, kWarps, kDepth, kTiled, false>, xb, parts, M, K)
               : cudaLaunchKernelEx(&l.config, low_rows_kernel<Codec, kWarps, kDepth, kTiled, false>(), xb, parts, M, K);
}

template <class Codec, int kWarps, int kStages, bool kGlu>
cudaError_t launch_bulk(const void* x, const Parts<typename Codec::Args>& parts, int blocks, int M, int K, bool pdl,
                        cudaStream_t stream) {
  constexpr int kShared = bulk_shared_bytes<Codec, kWarps, kStages>();
  auto* low = gemv_bulk<Codec, false, kWarps, kStages, kGlu>;
  auto* high = gemv_bulk<Codec, true, kWarps, kStages, kGlu>;
  auto* kernel = M > 8 ? high : low;
  if constexpr (kShared > kDefaultSharedBytes) {  // past the default: opted in once per kernel
    static const cudaError_t opt_in[2] = {
        cudaFuncSetAttribute(low, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared),
        cudaFuncSetAttribute(high, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared)};
    if (opt_in[M > 8] != cudaSuccess) return opt_in[M > 8];
  }
  Launch l(blocks, (kWarps + 1) * 32, kShared, pdl, stream);
  return cudaLaunchKernelEx(&l.config, kernel, static_cast<const __nv_bfloat16*>(x), parts, M, K);
}

// A persistent bulk launch of one row (gemv_bulk_persistent): as many blocks as fit at once,
// each with its slots and x_bytes after them, past the default 48 KB by opting in once a kernel to what a
// block can have; refused where they exceed it. (The occupancy is asked on every launch: free in a CUDA
// graph, a few us on an eager step.) The kernel is a template argument: each has its own opt-in (kernels of
// one signature would share a static otherwise).
template <int kWarps, auto kernel, class... Args>
cudaError_t launch_persistent_bulk(int slot_bytes, int x_bytes, int strips, bool pdl, cudaStream_t stream,
                                   Args... args) {
  static const int most_bytes = [] {
    int device = 0, optin = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaFuncAttributes attributes{};
    cudaFuncGetAttributes(&attributes, kernel);
    const int most = optin - static_cast<int>(attributes.sharedSizeBytes);
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most) == cudaSuccess ? most : 0;
  }();
  const int shared = slot_bytes + x_bytes;
  if (shared > most_bytes) return cudaErrorInvalidValue;
  int device = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (kWarps + 1) * 32, shared);
  Launch l(std::min(strips, std::max(per_sm, 1) * sms), (kWarps + 1) * 32, shared, pdl, stream);
  return cudaLaunchKernelEx(&l.config, kernel, args...);
}

// A bulk-block-columns launch (one row; the kernel walks the strips: glu, gate's): x and its 64 zero bytes
// after the slots.
template <int kWarps, int kStages, class Stage, bool kGlu>
cudaError_t launch_bulk_columns(const void* x, const Parts<Nvfp4::Args>& parts, int strips, int K, bool pdl,
                                const Stage& stage, cudaStream_t stream) {
  return launch_persistent_bulk<kWarps, gemv_bulk_persistent<Nvfp4Columns, kWarps, kStages, Stage, kGlu>>(
      bulk_shared_bytes<Nvfp4Columns, kWarps, kStages>(), K * 2 + 64, strips, pdl, stream,
      static_cast<const __nv_bfloat16*>(x), parts, 1, K, stage);
}

// A bulk-staged-x launch (one row, the kernel walks the strips: glu, gate's) in bulk_shape's shapes (8 warps
// and 4 slots, 4 and 8); x (plain, or through the layer norm: Stage) after the slots.
template <class Codec, class Stage, bool kGlu>
cudaError_t dispatch_bulk_staged(const void* x, const Parts<typename Codec::Args>& parts, int strips, int K, int warps,
                                 int depth, bool pdl, const Stage& stage, cudaStream_t stream) {
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  switch (warps * 10 + depth) {
    case 48: return launch_persistent_bulk<4, gemv_bulk_persistent<Codec, 4, 8, Stage, kGlu>>(
        bulk_shared_bytes<Codec, 4, 8>(), K * 2, strips, pdl, stream, xb, parts, 1, K, stage);
    case 84: return launch_persistent_bulk<8, gemv_bulk_persistent<Codec, 8, 4, Stage, kGlu>>(
        bulk_shared_bytes<Codec, 8, 4>(), K * 2, strips, pdl, stream, xb, parts, 1, K, stage);
    default: return cudaErrorInvalidValue;
  }
}

// bulk-staged-x at one row: the stage (norm or not) and glu as the kernel's template arguments.
template <class Codec>
cudaError_t dispatch_bulk_staged(const void* x, const Parts<typename Codec::Args>& parts, int blocks, int K, int warps,
                                 int depth, bool pdl, bool glu, const NinferAddNorm* norm, cudaStream_t stream) {
  if (norm != nullptr)
    return glu ? dispatch_bulk_staged<Codec, NinferAddNorm, true>(x, parts, blocks / 2, K, warps, depth, pdl, *norm, stream)
               : dispatch_bulk_staged<Codec, NinferAddNorm, false>(x, parts, blocks, K, warps, depth, pdl, *norm, stream);
  return glu ? dispatch_bulk_staged<Codec, PlainX, true>(x, parts, blocks / 2, K, warps, depth, pdl, PlainX{}, stream)
             : dispatch_bulk_staged<Codec, PlainX, false>(x, parts, blocks, K, warps, depth, pdl, PlainX{}, stream);
}

// The bulk pipeline's (consumer warps, slots) in {(4, 4), (4, 8), (8, 2), (8, 4), (8, 8)}; blocks: the
// parts' N / 16 (glu: one part's).
template <class Codec, bool kGlu>
cudaError_t dispatch_bulk(const void* x, const Parts<typename Codec::Args>& parts, int blocks, int M, int K, int warps,
                          int depth, bool pdl, cudaStream_t stream) {
  switch (warps * 10 + depth) {
    case 44: return launch_bulk<Codec, 4, 4, kGlu>(x, parts, blocks, M, K, pdl, stream);
    case 48: return launch_bulk<Codec, 4, 8, kGlu>(x, parts, blocks, M, K, pdl, stream);
    case 82: return launch_bulk<Codec, 8, 2, kGlu>(x, parts, blocks, M, K, pdl, stream);
    case 84: return launch_bulk<Codec, 8, 4, kGlu>(x, parts, blocks, M, K, pdl, stream);
    case 88: return launch_bulk<Codec, 8, 8, kGlu>(x, parts, blocks, M, K, pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

// bulk-block-columns at one row, in the bulk pipeline's shapes; staged through a norm or glu, in the two
// shapes cuda_ops.bulk_shape picks (4 warps and 8 slots, 8 and 4) only.
template <class Stage, bool kGlu>
cudaError_t dispatch_bulk_columns(const void* x, const Parts<Nvfp4::Args>& parts, int strips, int K, int warps,
                                  int depth, bool pdl, const Stage& stage, cudaStream_t stream) {
  switch (warps * 10 + depth) {
    case 48: return launch_bulk_columns<4, 8, Stage, kGlu>(x, parts, strips, K, pdl, stage, stream);
    case 84: return launch_bulk_columns<8, 4, Stage, kGlu>(x, parts, strips, K, pdl, stage, stream);
  }
  if constexpr (std::is_same_v<Stage, PlainX> && !kGlu) {
    switch (warps * 10 + depth) {
      case 44: return launch_bulk_columns<4, 4, Stage, kGlu>(x, parts, strips, K, pdl, stage, stream);
      case 82: return launch_bulk_columns<8, 2, Stage, kGlu>(x, parts, strips, K, pdl, stage, stream);
      case 88: return launch_bulk_columns<8, 8, Stage, kGlu>(x, parts, strips, K, pdl, stage, stream);
    }
  }
  return cudaErrorInvalidValue;
}

// bulk-block-columns at one row: the stage (norm or not) and glu as the kernel's template arguments.
cudaError_t dispatch_bulk_columns(const void* x, const Parts<Nvfp4::Args>& parts, int blocks, int K, int warps,
                                  int depth, bool pdl, bool glu, const NinferAddNorm* norm, cudaStream_t stream) {
  if (norm != nullptr)
    return glu ? dispatch_bulk_columns<NinferAddNorm, true>(x, parts, blocks / 2, K, warps, depth, pdl, *norm, stream)
               : dispatch_bulk_columns<NinferAddNorm, false>(x, parts, blocks, K, warps, depth, pdl, *norm, stream);
  return glu ? dispatch_bulk_columns<PlainX, true>(x, parts, blocks / 2, K, warps, depth, pdl, PlainX{}, stream)
             : dispatch_bulk_columns<PlainX, false>(x, parts, blocks, K, warps, depth, pdl, PlainX{}, stream);
}

// The ring's (warps, depth) in {4, 8, 16} x {2, 4}; every part's N % 16 == 0, blocks = their sum / 16.
// norm (nullptr: none): the layer norm the one-row block-columns launch stages x through.
template <class Codec, bool kTiled>
cudaError_t dispatch_ring(const void* x, const Parts<typename Codec::Args>& parts, int blocks, int M, int K,
                          int warps, int depth, bool pdl, int pipeline, const NinferAddNorm* norm,
                          cudaStream_t stream) {
  switch (warps * 10 + depth) {
    case 42: return launch_ring<Codec, 4, 2, kTiled>(x, parts, blocks, M, K, pdl, pipeline, norm, stream);
    case 44: return launch_ring<Codec, 4, 4, kTiled>(x, parts, blocks, M, K, pdl, pipeline, norm, stream);
    case 82: return launch_ring<Codec, 8, 2, kTiled>(x, parts, blocks, M, K, pdl, pipeline, norm, stream);
    case 84: return launch_ring<Codec, 8, 4, kTiled>(x, parts, blocks, M, K, pdl, pipeline, norm, stream);
    case 162: return launch_ring<Codec, 16, 2, kTiled>(x, parts, blocks, M, K, pdl, pipeline, norm, stream);
    case 164: return launch_ring<Codec, 16, 4, kTiled>(x, parts, blocks, M, K, pdl, pipeline, norm, stream);
    default: return cudaErrorInvalidValue;
  }
}

// The parts of a grouped launch from the host's arrays (n: each part's rows; y: `outputs` of them, 1 for
// glu); -> the launch's blocks.
template <class Args>
int make_parts(Parts<Args>& parts, int count, const void* const* q, const Args* args, void* const* y, int outputs,
               const int* n) {
  int blocks = 0;
  for (int p = 0; p < kMaxParts; ++p) {
    const bool used = p < count;
    parts.q[p] = used ? static_cast<const uint8_t*>(q[p]) : nullptr;
    parts.args[p] = used ? args[p] : Args{};
    parts.y[p] = p < outputs ? static_cast<__nv_bfloat16*>(y[p]) : nullptr;
    parts.rows[p] = used ? n[p] : 0;
    parts.first_block[p] = used ? blocks : INT_MAX;
    blocks += used ? n[p] / 16 : 0;
  }
  parts.strips = blocks;
  return blocks;
}

}  // namespace ninfer_sm90

// The launchers ops.cpp calls (quant_gemv_sm90.h says what they take).
int ninfer_nvfp4_gemv_sm90(const void* x, int count, const void* const* q, const void* const* scale,
                           const float* const* s2, const int* n, void* const* y, int M, int K, int warps,
                           int depth, bool tiled, bool pdl, int pipeline, bool glu, const NinferAddNorm* norm,
                           cudaStream_t stream) {
  using ninfer_sm90::Nvfp4;
  const bool bulk = pipeline == ninfer_sm90::kBulk || pipeline == ninfer_sm90::kBulkBlockColumns;
  const bool columns = pipeline == ninfer_sm90::kRingBlockColumns || pipeline == ninfer_sm90::kBulkBlockColumns;
  if (count < 1 || count > ninfer_sm90::kMaxParts || pipeline == ninfer_sm90::kBulkStagedX ||
      (glu && (count != 2 || n[0] != n[1] || !tiled || !bulk)) ||
      (norm != nullptr && (!tiled || M != 1 || !columns || norm->weight == nullptr)))
    return static_cast<int>(cudaErrorInvalidValue);
  Nvfp4::Args args[ninfer_sm90::kMaxParts];
  for (int p = 0; p < count; ++p) args[p] = {static_cast<const uint8_t*>(scale[p]), s2[p]};
  ninfer_sm90::Parts<Nvfp4::Args> parts;  // Nvfp4Tiled's arguments are Nvfp4's
  const int blocks = ninfer_sm90::make_parts(parts, count, q, args, y, glu ? 1 : count, n);
  cudaError_t err;
  if (pipeline == ninfer_sm90::kBulkBlockColumns && M == 1 && tiled)
    err = ninfer_sm90::dispatch_bulk_columns(x, parts, blocks, K, warps, depth, pdl, glu, norm, stream);
  else if (bulk)  // (bulk-block-columns at more rows: bulk's)
    err = !tiled ? cudaErrorInvalidValue
          : glu ? ninfer_sm90::dispatch_bulk<ninfer_sm90::Nvfp4Tiled, true>(x, parts, blocks / 2, M, K, warps, depth, pdl, stream)
                : ninfer_sm90::dispatch_bulk<ninfer_sm90::Nvfp4Tiled, false>(x, parts, blocks, M, K, warps, depth, pdl, stream);
  else if (tiled)
    err = ninfer_sm90::dispatch_ring<ninfer_sm90::Nvfp4Tiled, true>(x, parts, blocks, M, K, warps, depth, pdl, pipeline,
                                                                     norm, stream);
  else
    err = pipeline != ninfer_sm90::kRing ? cudaErrorInvalidValue
          : ninfer_sm90::dispatch_ring<Nvfp4, false>(x, parts, blocks, M, K, warps, depth, pdl, pipeline, nullptr, stream);
  return static_cast<int>(err);
}

int ninfer_int4_gemv_sm90(const void* x, int count, const void* const* q, const void* const* scale,
                          const void* const* zero, const int* n, void* const* y, int M, int K, int warps, int depth,
                          bool tiled, bool pdl, int pipeline, bool glu, const NinferAddNorm* norm,
                          cudaStream_t stream) {
  using ninfer_sm90::Int4;
  using ninfer_sm90::Int4Tiled;
  // (the bulk ones: tiled, K % 256 == 0, Int4Tiled::kSideBytes; bulk-staged-x at more rows: bulk's)
  const bool bulk = pipeline == ninfer_sm90::kBulk || pipeline == ninfer_sm90::kBulkStagedX;
  if (count < 1 || count > ninfer_sm90::kMaxParts || pipeline == ninfer_sm90::kRingBlockColumns ||
      pipeline == ninfer_sm90::kBulkBlockColumns || (!tiled && pipeline != ninfer_sm90::kRing) ||
      (bulk && K % 256 != 0) || (glu && (count != 2 || n[0] != n[1] || !bulk)) ||
      (norm != nullptr && (!tiled || M != 1 || pipeline != ninfer_sm90::kBulkStagedX || norm->weight == nullptr)))
    return static_cast<int>(cudaErrorInvalidValue);
  Int4::Args args[ninfer_sm90::kMaxParts];
  for (int p = 0; p < count; ++p)
    args[p] = {static_cast<const __nv_bfloat16*>(scale[p]), static_cast<const int32_t*>(zero[p])};
  ninfer_sm90::Parts<Int4::Args> parts;
  const int blocks = ninfer_sm90::make_parts(parts, count, q, args, y, glu ? 1 : count, n);
  cudaError_t err;
  if (pipeline == ninfer_sm90::kBulkStagedX && M == 1)
    err = ninfer_sm90::dispatch_bulk_staged<Int4Tiled>(x, parts, blocks, K, warps, depth, pdl, glu, norm, stream);
  else if (bulk)
    err = glu ? ninfer_sm90::dispatch_bulk<Int4Tiled, true>(x, parts, blocks / 2, M, K, warps, depth, pdl, stream)
              : ninfer_sm90::dispatch_bulk<Int4Tiled, false>(x, parts, blocks, M, K, warps, depth, pdl, stream);
  else if (tiled)
    err = ninfer_sm90::dispatch_ring<Int4Tiled, true>(x, parts, blocks, M, K, warps, depth, pdl, pipeline, nullptr, stream);
  else
    err = ninfer_sm90::dispatch_ring<Int4, false>(x, parts, blocks, M, K, warps, depth, pdl, pipeline, nullptr, stream);
  return static_cast<int>(err);
}
