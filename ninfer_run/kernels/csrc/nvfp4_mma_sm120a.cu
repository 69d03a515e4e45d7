// NVFP4 x NVFP4 matrix product for sm_120a (RTX 5090) on the block-scaled FP4 tensor cores:
//   y[m, n] = alpha * sum_k A[m, k] * W[n, k]
// A (activations, quantized per call) and W (the artifact's weight) are E2M1 with one UE4M3 scale per
// 16 K elements; alpha = the two FP32 global scales multiplied. Operands as the sm_120a artifact
// stores them:
//   a        u8   [M, K/2]  row-major, element 2i in the low nibble
//   a_scale  e4m3 [M, K/16] row-major
//   w        u8   [N, K/2]  row-major (K-major: the "col" B operand of the TN MMA)
//   w_scale  e4m3 blocked_128x4 (formats/layouts.py: blocked_offset)
// One warp computes a 16 x 8 tile of y over all of K with
//   mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3
// Requirements: K % 64 == 0. Lane = 4 * g + q. The index helpers below are mirrored expression for
// expression by the CPU emulation (ninfer_run/kernels/nvfp4_sm120a.py), which proves them exact.

#include <cstdint>

namespace ninfer_sm120a {

__device__ __forceinline__ int a_row(int g, int r) { return g + 8 * (r & 1); }
__device__ __forceinline__ int a_kbyte(int k0, int q, int r) { return (k0 + 8 * q + 32 * (r >> 1)) / 2; }
__device__ __forceinline__ int w_kbyte(int k0, int q, int r) { return (k0 + 8 * q + 32 * r) / 2; }
__device__ __forceinline__ int sfa_row(int lane) { return lane / 4 + 8 * (lane % 2); }
__device__ __forceinline__ int d_row(int g, int i) { return g + 8 * (i >> 1); }
__device__ __forceinline__ int d_col(int q, int i) { return 2 * q + (i & 1); }
__device__ __forceinline__ long long blocked_offset(int r, int c, int cols) {
  return ((long long)(r / 128) * ((cols + 3) / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__global__ void nvfp4_gemm_sm120a(const uint8_t* __restrict__ a, const uint8_t* __restrict__ a_scale,
                                  const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scale,
                                  float alpha, float* __restrict__ y, int M, int N, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * 8, m0 = blockIdx.y * 16;
  const int row_bytes = K / 2, scale_cols = K / 16;
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 64) {
    uint32_t ar[4], wr[2];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int m = m0 + a_row(g, r);
      ar[r] = m < M ? load_u32(a + (long long)m * row_bytes + a_kbyte(k0, q, r)) : 0u;
    }
    const int n = n0 + g;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      wr[r] = n < N ? load_u32(w + (long long)n * row_bytes + w_kbyte(k0, q, r)) : 0u;
    }
    const int ms = m0 + sfa_row(lane);
    const uint32_t sfa = ms < M ? load_u32(a_scale + (long long)ms * scale_cols + k0 / 16) : 0u;
    const uint32_t sfb = n < N ? load_u32(w_scale + blocked_offset(n, k0 / 16, scale_cols)) : 0u;
    asm volatile(
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, %13, {%14,%15};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(wr[0]), "r"(wr[1]),
          "r"(sfa), "h"((uint16_t)0), "h"((uint16_t)0), "r"(sfb), "h"((uint16_t)0), "h"((uint16_t)0));
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + d_row(g, i), col = n0 + d_col(q, i);
    if (m < M && col < N) y[(long long)m * N + col] = alpha * d[i];
  }
}

}  // namespace ninfer_sm120a

// Host launcher: one warp per 16 x 8 output tile.
extern "C" cudaError_t ninfer_nvfp4_gemm_sm120a(const uint8_t* a, const uint8_t* a_scale, const uint8_t* w,
                                                const uint8_t* w_scale, float alpha, float* y, int M, int N,
                                                int K, cudaStream_t stream) {
  if (K % 64 != 0) return cudaErrorInvalidValue;
  dim3 grid((N + 7) / 8, (M + 15) / 16);
  ninfer_sm120a::nvfp4_gemm_sm120a<<<grid, 32, 0, stream>>>(a, a_scale, w, w_scale, alpha, y, M, N, K);
  return cudaGetLastError();
}
