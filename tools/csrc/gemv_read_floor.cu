// The decode GEMV's memory floor (a benchmark, not a kernel the engine runs): the same grid, warps,
// ring of tiles in flight and tiled NVFP4 addressing as csrc/quant_gemv_sm90.cu's gemv<..., kTiled>,
// every code and scale byte loaded the same way, but no decode and no MMA (the loads are XOR-folded
// into one word per thread so they stay). Its time over the GEMV's says how much of the GEMV is
// memory access pattern and how much the arithmetic around it.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdint>

namespace {

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int kWarps, int kDepth>
__global__ void __launch_bounds__(kWarps * 32) read_tiles(const uint8_t* __restrict__ q, const uint8_t* __restrict__ s,
                                                          uint32_t* __restrict__ out, int tiles) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int steps = warp < tiles ? (tiles - warp + kWarps - 1) / kWarps : 0;
  const uint8_t* q_lane = q + (size_t)blockIdx.x * tiles * 1024 + 16 * lane;
  const uint8_t* s_lane = s + (size_t)blockIdx.x * tiles * 128 + 4 * lane;
  uint4 lo[kDepth], hi[kDepth];
  uint32_t sc[kDepth];
#pragma unroll
  for (int i = 0; i < kDepth; ++i) {
    if (i < steps) {
      const int kt = warp + i * kWarps;
      lo[i] = load_stream(q_lane + (size_t)kt * 1024);
      hi[i] = load_stream(q_lane + (size_t)kt * 1024 + 512);
      sc[i] = *reinterpret_cast<const uint32_t*>(s_lane + (size_t)kt * 128);
    }
  }
  uint32_t acc = 0;
  for (int st = 0; st < steps; st += kDepth) {
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      if (st + i < steps) {
        acc ^= lo[i].x ^ lo[i].y ^ lo[i].z ^ lo[i].w ^ hi[i].x ^ hi[i].y ^ hi[i].z ^ hi[i].w ^ sc[i];
        if (st + i + kDepth < steps) {
          const int next = warp + (st + i + kDepth) * kWarps;
          lo[i] = load_stream(q_lane + (size_t)next * 1024);
          hi[i] = load_stream(q_lane + (size_t)next * 1024 + 512);
          sc[i] = *reinterpret_cast<const uint32_t*>(s_lane + (size_t)next * 128);
        }
      }
    }
  }
  out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int kWarps, int kDepth>
void launch(const torch::Tensor& q, const torch::Tensor& s, torch::Tensor& out, int64_t n, int64_t k) {
  read_tiles<kWarps, kDepth><<<n / 16, kWarps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      q.data_ptr<uint8_t>(), s.data_ptr<uint8_t>(), reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), k / 128);
}

}  // namespace

// q, s: cuda_ops.tile_nvfp4's codes and scales of an n x k weight; out: int32 [n / 16 * warps * 32].
void read_floor(torch::Tensor q, torch::Tensor s, torch::Tensor out, int64_t n, int64_t k, int64_t warps, int64_t depth) {
  TORCH_CHECK(out.numel() >= n / 16 * warps * 32, "out too small");
  switch (warps * 10 + depth) {
    case 42: launch<4, 2>(q, s, out, n, k); break;
    case 82: launch<8, 2>(q, s, out, n, k); break;
    case 84: launch<8, 4>(q, s, out, n, k); break;
    case 162: launch<16, 2>(q, s, out, n, k); break;
    default: TORCH_CHECK(false, "shape not built: ", warps, "x", depth);
  }
  TORCH_CHECK(cudaGetLastError() == cudaSuccess, "read_floor launch failed");
}
