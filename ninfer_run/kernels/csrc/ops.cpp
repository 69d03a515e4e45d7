// Torch bindings of the CUDA C++ kernels (torch.ops.ninfer.*), built by kernels/cuda_ops.py.
// Only the ATen/c10 headers the launchers need (no torch/extension.h, no pybind11): a faster JIT build.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>

int ninfer_nvfp4_gemv_sm90(const void* x, const void* q, const void* scale, const float* s2, void* y, int M, int N,
                           int K, int warps, int depth, bool tiled, cudaStream_t stream);
int ninfer_int4_gemv_sm90(const void* x, const void* q, const void* scale, const void* zero, void* y, int M, int N,
                          int K, int warps, int depth, cudaStream_t stream);

namespace {

// What both GEMVs require of x and y (a block takes 16 rows of N = y's columns); -> (M, N, K).
std::tuple<int64_t, int64_t, int64_t> check_rows(const char* op, const at::Tensor& x, const at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1);
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), op, ": x contiguous bf16 on CUDA");
  TORCH_CHECK(M >= 1 && M <= 16 && K % 128 == 0 && N % 16 == 0, op, ": M in 1..16, K % 128 == 0, N % 16 == 0");
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 && y.is_contiguous() && y.size(0) == M, op, ": y bf16 [M, N]");
  return {M, N, K};
}

void check_aligned(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors)
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, op, ": operands must be 16-byte aligned");
}

void check_launch(const char* op, int err, int64_t warps, int64_t depth) {
  TORCH_CHECK(err == 0, op, " launch failed (warps ", warps, ", depth ", depth, "): CUDA error ", err);
}

// tiled: q and scale in cuda_ops.tile_nvfp4's layout (the same bytes, each 16-row x 128-K tile contiguous)
void nvfp4_gemv(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& s2,
                at::Tensor& y, int64_t warps, int64_t depth, bool tiled) {
  const auto [M, N, K] = check_rows("nvfp4_gemv", x, y);
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.numel() == N * K / 2 &&
                  (tiled || q.size(1) * 2 == K), "q: u8 [N, K/2] (or tiled, as many bytes)");
  TORCH_CHECK(scale.element_size() == 1 && scale.is_contiguous() && scale.numel() == N * K / 16,
              "scale: e4m3 [N, K/16] (or tiled, as many bytes)");
  TORCH_CHECK(s2.scalar_type() == at::kFloat && s2.numel() == 1 && s2.is_cuda(), "s2: one float32 on CUDA");
  check_aligned("nvfp4_gemv", {&x, &q, &scale, &y});
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch("nvfp4_gemv",
               ninfer_nvfp4_gemv_sm90(x.data_ptr(), q.data_ptr(), scale.data_ptr(), s2.data_ptr<float>(), y.data_ptr(),
                                      M, N, K, warps, depth, tiled, c10::cuda::getCurrentCUDAStream()),
               warps, depth);
}

void int4_gemv(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const std::optional<at::Tensor>& zero,
               at::Tensor& y, int64_t warps, int64_t depth) {
  const auto [M, N, K] = check_rows("int4_gemv", x, y);
  TORCH_CHECK(q.scalar_type() == at::kInt && q.is_contiguous() && q.size(0) == N && q.size(1) * 8 == K, "q: i32 [N, K/8]");
  TORCH_CHECK(scale.scalar_type() == at::kBFloat16 && scale.is_contiguous() && scale.size(0) == N &&
                  scale.size(1) == K / 128, "scale: bf16 [N, K/128] (group 128)");
  if (zero.has_value())
    TORCH_CHECK(zero->scalar_type() == at::kInt && zero->is_contiguous() && zero->size(0) == N / 8 &&
                    zero->size(1) == K / 128, "zero: i32 [N/8, K/128]");
  check_aligned("int4_gemv", {&x, &q, &y});
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch("int4_gemv",
               ninfer_int4_gemv_sm90(x.data_ptr(), q.data_ptr(), scale.data_ptr(),
                                     zero.has_value() ? zero->data_ptr() : nullptr, y.data_ptr(), M, N, K, warps,
                                     depth, c10::cuda::getCurrentCUDAStream()),
               warps, depth);
}

}  // namespace

TORCH_LIBRARY(ninfer, m) {
  m.def("nvfp4_gemv(Tensor x, Tensor q, Tensor scale, Tensor s2, Tensor(a!) y, int warps, int depth, bool tiled) -> ()");
  m.def("int4_gemv(Tensor x, Tensor q, Tensor scale, Tensor? zero, Tensor(a!) y, int warps, int depth) -> ()");
}

TORCH_LIBRARY_IMPL(ninfer, CUDA, m) {
  m.impl("nvfp4_gemv", &nvfp4_gemv);
  m.impl("int4_gemv", &int4_gemv);
}
