// The decode GEMV's memory floor (a benchmark, not a kernel the engine runs): the GEMV's loads of the
// tiled NVFP4 codes and scales (csrc/quant_gemv_sm90.cu, kTiled) with no decode and no MMA (the loads
// are XOR-folded into one word per thread so they stay), in three work layouts:
//   split     the GEMV's: one block per 16-row tile, its warps split the K tiles, a ring of kDepth
//             tiles in flight per warp ("split:B": at most B blocks a SM, as the GEMV's registers allow);
//   persist   the same tiles, but `grid` blocks that each walk row tiles blockIdx.x, + grid, ... with the
//             ring running on across row tiles (no block churn, the pipeline never drains);
//   flat      a plain grid-stride read of the same bytes, 16 B per lane, kDepth loads in flight per
//             lane: what a read of this size can reach on this GPU.
// A layout's time over flat's is what the layout costs; the GEMV's over its layout's is the arithmetic.
// A mode ending "+l2" loads with the L2::256B prefetch-size hint (each miss fetches the 256-byte sector
// group around it: does asking DRAM for larger pieces raise what these layouts stream?).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

namespace {

template <bool kL2Hint>
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  if constexpr (kL2Hint)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Row tile rt, K tile kt: 1 KB of codes (lane: 16 B at +16 lane and +512 + 16 lane) and 128 B of scales.
struct Tiles {
  const uint8_t* q;
  const uint8_t* s;
  int tiles;  // K tiles per row tile
  template <bool kL2Hint>
  __device__ void load(uint4& lo, uint4& hi, uint32_t& sc, int rt, int kt, int lane) const {
    const size_t t = (size_t)rt * tiles + kt;
    lo = load_stream<kL2Hint>(q + t * 1024 + 16 * lane);
    hi = load_stream<kL2Hint>(q + t * 1024 + 512 + 16 * lane);
    sc = *reinterpret_cast<const uint32_t*>(s + t * 128 + 4 * lane);
  }
};

// split (row_step = 0: one row tile per block) and persist (row tiles blockIdx.x + i * gridDim.x):
// warp w's step j is row tile j / per_row, K tile w + (j % per_row) * kWarps.
template <int kWarps, int kDepth, bool kL2Hint>
__global__ void __launch_bounds__(kWarps * 32) read_tiles(Tiles t, uint32_t* __restrict__ out, int row_tiles,
                                                          bool persist) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int per_row = (t.tiles + kWarps - 1) / kWarps;
  const int rows_here = persist ? (row_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 1;
  const int steps = rows_here * per_row;
  auto tile_of = [&](int j, int& rt, int& kt) {
    rt = blockIdx.x + (j / per_row) * gridDim.x;
    kt = warp + (j % per_row) * kWarps;
    return kt < t.tiles;
  };
  uint4 lo[kDepth], hi[kDepth];
  uint32_t sc[kDepth];
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < kDepth; ++i) {
    int rt, kt;
    if (i < steps && tile_of(i, rt, kt)) t.template load<kL2Hint>(lo[i], hi[i], sc[i], rt, kt, lane);
    else lo[i] = hi[i] = make_uint4(0, 0, 0, 0), sc[i] = 0;
  }
  for (int st = 0; st < steps; st += kDepth) {
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      acc ^= fold(lo[i]) ^ fold(hi[i]) ^ sc[i];
      int rt, kt;
      if (st + i + kDepth < steps && tile_of(st + i + kDepth, rt, kt)) t.template load<kL2Hint>(lo[i], hi[i], sc[i], rt, kt, lane);
      else lo[i] = hi[i] = make_uint4(0, 0, 0, 0), sc[i] = 0;
    }
  }
  out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int kDepth, bool kL2Hint>
__device__ __forceinline__ uint32_t read_range(const uint4* __restrict__ p, size_t n) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  uint32_t acc = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += kDepth * stride) {
    uint4 v[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) v[d] = i + d * stride < n ? load_stream<kL2Hint>(p + i + d * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int d = 0; d < kDepth; ++d) acc ^= fold(v[d]);
  }
  return acc;
}

template <int kDepth, bool kL2Hint>
__global__ void __launch_bounds__(256) read_flat(const uint4* __restrict__ a, size_t na, const uint4* __restrict__ b,
                                                 size_t nb, uint32_t* __restrict__ out) {
  out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = read_range<kDepth, kL2Hint>(a, na) ^ read_range<kDepth, kL2Hint>(b, nb);
}

// per_sm > 0: at most that many blocks a SM, by asking for an unused share of shared memory (the GEMV's
// registers allow it 4 blocks of 8 warps: are its loads as fast at its occupancy?).
template <int kWarps, int kDepth, bool kL2Hint>
void launch_tiles(const Tiles& t, uint32_t* out, int row_tiles, int grid, int per_sm, cudaStream_t stream) {
  auto* kernel = read_tiles<kWarps, kDepth, kL2Hint>;
  size_t shared = 0;
  if (per_sm > 0) {
    int device = 0, per_sm_bytes = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&per_sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    shared = (per_sm_bytes / per_sm - 1024) / 1024 * 1024 - 1024;  // (each block also takes 1 KB reserved)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
  }
  kernel<<<grid ? grid : row_tiles, kWarps * 32, shared, stream>>>(t, out, row_tiles, grid != 0);
}

}  // namespace

// q, s: cuda_ops.tile_nvfp4's codes and scales of an n x k weight; out: int32, one per thread.
// mode "split" / "persist" (grid blocks) take warps x depth; "flat" takes depth and grid (256 threads).
template <bool kL2Hint>
void read_floor_as(torch::Tensor q, torch::Tensor s, torch::Tensor out, int64_t n, int64_t k, const std::string& mode,
                   int64_t warps, int64_t depth, int64_t grid) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto* sink = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  const int row_tiles = n / 16;
  if (mode == "flat") {
    TORCH_CHECK(out.numel() >= grid * 256, "out too small");
    const auto* a = reinterpret_cast<const uint4*>(q.data_ptr<uint8_t>());
    const auto* b = reinterpret_cast<const uint4*>(s.data_ptr<uint8_t>());
    const size_t na = q.numel() / 16, nb = s.numel() / 16;
    switch (depth) {
      case 2: read_flat<2, kL2Hint><<<grid, 256, 0, stream>>>(a, na, b, nb, sink); break;
      case 4: read_flat<4, kL2Hint><<<grid, 256, 0, stream>>>(a, na, b, nb, sink); break;
      case 8: read_flat<8, kL2Hint><<<grid, 256, 0, stream>>>(a, na, b, nb, sink); break;
      default: TORCH_CHECK(false, "flat depth not built: ", depth);
    }
  } else {
    // "split:B": split with at most B blocks a SM
    const int per_sm = mode.rfind("split:", 0) == 0 ? std::stoi(mode.substr(6)) : 0;
    TORCH_CHECK(mode == "split" || mode == "persist" || per_sm > 0, "mode: split, split:B, persist or flat");
    const int blocks = mode == "persist" ? grid : 0;
    TORCH_CHECK(out.numel() >= (blocks ? blocks : row_tiles) * warps * 32, "out too small");
    const Tiles t{q.data_ptr<uint8_t>(), s.data_ptr<uint8_t>(), static_cast<int>(k / 128)};
    switch (warps * 10 + depth) {
      case 42: launch_tiles<4, 2, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 44: launch_tiles<4, 4, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 48: launch_tiles<4, 8, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 82: launch_tiles<8, 2, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 84: launch_tiles<8, 4, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 88: launch_tiles<8, 8, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 162: launch_tiles<16, 2, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      case 164: launch_tiles<16, 4, kL2Hint>(t, sink, row_tiles, blocks, per_sm, stream); break;
      default: TORCH_CHECK(false, "shape not built: ", warps, "x", depth);
    }
  }
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "read_floor launch failed");
}

// mode "...+l2": the same with the L2::256B hint on every load.
void read_floor(torch::Tensor q, torch::Tensor s, torch::Tensor out, int64_t n, int64_t k, std::string mode,
                int64_t warps, int64_t depth, int64_t grid) {
  const std::string suffix = "+l2";
  const bool hint = mode.size() > suffix.size() && mode.compare(mode.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (hint) read_floor_as<true>(q, s, out, n, k, mode.substr(0, mode.size() - suffix.size()), warps, depth, grid);
  else read_floor_as<false>(q, s, out, n, k, mode, warps, depth, grid);
}
