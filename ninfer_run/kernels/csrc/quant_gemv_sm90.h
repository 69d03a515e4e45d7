// The launchers of quant_gemv_sm90.cu that ops.cpp calls (plain pointers: ops.cpp sees no CUDA types).
#pragma once
#include <cuda_runtime.h>

namespace ninfer_sm90 {
// How a launch streams its weights (the launchers' `pipeline`; cuda_ops.PIPELINES): the register ring, the
// ring with x staged in shared memory (the tiled layouts, M <= 8, x and the partial sums within 48 KB; else
// the plain ring), the bulk-copy pipeline (the tiled layouts; int4 where K % 256 == 0), or the staged ring
// with the block scales as MMA columns at M = 1 (Nvfp4Columns, tiled NVFP4; other rows as ring-staged-x), or
// the bulk-copy pipeline with Nvfp4Columns' arithmetic at M = 1 (other rows as bulk), or (tiled int4) the
// bulk-copy pipeline with a persistent grid and x staged at M = 1 (other rows as bulk).
enum Pipeline { kRing = 0, kRingStagedX = 1, kBulk = 2, kRingBlockColumns = 3, kBulkBlockColumns = 4, kBulkStagedX = 5 };
}  // namespace ninfer_sm90

// The RMSNorm a one-token block-columns launch (ring or bulk; int4's bulk-staged-x) applies to x as it stages it, so a layer's residual
// add and norm need no kernel of their own before its first projection: the GEMV's x is
// RMSNorm(x + residual) * (offset + weight) (offset 0: weight times the rounded norm), rounded as
// layers.rms_norm_reference rounds. Block 0 also writes the sum and the normed row where asked.
struct NinferAddNorm {
  const void* residual;  // bf16 [K], added to x first; nullptr: x alone
  const void* weight;    // bf16 [K]
  void* sum_out;         // bf16 [K]: x + residual (the residual stream); nullptr: not written
  void* normed_out;      // bf16 [K]: the normed row the GEMV read; nullptr: not written
  float eps, offset;
};

// `count` (1..3) weights of n[p] rows each into y[p] [M, n[p]]; each returns the launch's CUDA error code
// (cudaErrorInvalidValue for a (warps, depth) combination that is not built, or a pipeline the layout has
// not: staged x is the tiled layouts', bulk copies the tiled ones' (int4's where K % 256 == 0), block columns
// tiled NVFP4's). glu (the bulk pipelines): two weights of one N (gate, up) -> y[0] = SiLU(x @ gate^T) *
// (x @ up^T) [M, N]. norm (nullptr: none): see NinferAddNorm; M = 1, tiled NVFP4 in the block-columns
// pipelines (with glu: bulk-block-columns), tiled int4 in bulk-staged-x.
int ninfer_nvfp4_gemv_sm90(const void* x, int count, const void* const* q, const void* const* scale,
                           const float* const* s2, const int* n, void* const* y, int M, int K, int warps,
                           int depth, bool tiled, bool pdl, int pipeline, bool glu, const NinferAddNorm* norm,
                           cudaStream_t stream);
int ninfer_int4_gemv_sm90(const void* x, int count, const void* const* q, const void* const* scale,
                          const void* const* zero, const int* n, void* const* y, int M, int K, int warps, int depth,
                          bool tiled, bool pdl, int pipeline, bool glu, const NinferAddNorm* norm,
                          cudaStream_t stream);
