// Torch bindings of the CUDA C++ kernels (torch.ops.ninfer.*), built by kernels/cuda_ops.py.
// Only the ATen/c10 headers the launchers need (no torch/extension.h, no pybind11): a faster JIT build.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "quant_gemv_sm90.h"

namespace {

constexpr size_t kMaxParts = 3;  // quant_gemv_sm90.cu's

// A refusal throws std::runtime_error with a message built by string concatenation, and each op catches
// what its body throws (its refusals, a c10::Error from ATen) and returns the message ("" when it ran);
// cuda_ops raises it as a RuntimeError. Why (stop 18 on the H200): the box's CXX wrapper links libstdc++
// into the .so statically, and there any std::ostringstream in this library ended the process with
// SIGSEGV (TORCH_CHECK's message with a number in it builds one: c10::str). Diagnostics: a CPU-only op
// crashed with TORCH_CHECK(false, "text ", 3) and with our ostringstream message even when caught inside,
// and did not with TORCH_CHECK(false, "text") or a std::runtime_error of a literal, nor with the system
// g++ (libstdc++ linked dynamically). So: no TORCH_CHECK, no streams, no exception out of this library.
template <class T>
std::string text(const T& value) {
  if constexpr (std::is_arithmetic_v<T>) return std::to_string(value);
  else return std::string(value);
}

template <class... Parts>
void require(bool ok, const Parts&... parts) {
  if (ok) return;
  std::string message;
  ((message += text(parts)), ...);
  throw std::runtime_error(message);
}

// What both GEMVs require of x, the parts' row counts n and their outputs y[p] [M, n[p]] (a block takes
// 16 rows), or with glu two parts of one N and one y [M, N]; -> (M, K) and y's pointers.
std::tuple<int64_t, int64_t, std::vector<void*>> check_rows(const char* op, const at::Tensor& x, at::TensorList y,
                                                            const std::vector<int>& n, bool glu) {
  require(x.dim() == 2, op, ": x [M, K]");  // (before any size(i): an out-of-range i throws a c10::Error)
  const int64_t M = x.size(0), K = x.size(1);
  require(x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), op, ": x contiguous bf16 on CUDA");
  require(M >= 1 && M <= 16 && K % 128 == 0, op, ": M in 1..16, K % 128 == 0");
  require(!n.empty() && n.size() <= kMaxParts && y.size() == (glu ? 1 : n.size()), op,
          ": 1 to 3 weights, one y each (glu: gate and up, one y)");
  require(!glu || (n.size() == 2 && n[0] == n[1]), op, ": glu takes gate and up of one N");
  std::vector<void*> out;
  for (size_t p = 0; p < y.size(); ++p) {
    require(n[p] > 0 && n[p] % 16 == 0, op, ": each weight's N % 16 == 0");
    require(y[p].scalar_type() == at::kBFloat16 && y[p].is_contiguous() && y[p].dim() == 2 && y[p].size(0) == M &&
                y[p].size(1) == n[p], op, ": each y bf16 [M, its weight's N]");
    out.push_back(y[p].data_ptr());
  }
  return {M, K, out};
}

template <class Body>
std::string guarded(Body body) {
  try {
    body();
    return {};
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
}

void check_aligned(const char* op, const at::Tensor& t) {
  require(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": operands must be 16-byte aligned");
}

void check_launch(const char* op, int err, int64_t warps, int64_t depth) {
  require(err == 0, op, " launch failed (warps ", warps, ", depth ", depth, "): CUDA error ", err);
}

// tiled: q and scale in cuda_ops.tile_nvfp4's layout (the same bytes, each 16-row x 128-K tile contiguous)
void nvfp4_gemv_body(const at::Tensor& x, at::TensorList q, at::TensorList scale, at::TensorList s2, at::TensorList y,
                     int64_t warps, int64_t depth, bool tiled, bool pdl, int64_t pipeline, bool glu,
                     const NinferAddNorm* norm = nullptr) {
  require(scale.size() == q.size() && s2.size() == q.size(), "nvfp4_gemv: as many scales as weights");
  std::vector<int> n;
  for (const at::Tensor& t : q) {
    require(t.dim() == (tiled ? 3 : 2), "q: u8 [N, K/2] (or tiled: [N/16, K/128, 1024])");
    n.push_back(static_cast<int>(t.size(0) * (tiled ? 16 : 1)));
  }
  const auto [M, K, yp] = check_rows("nvfp4_gemv", x, y, n, glu);
  std::vector<const void*> qp, sp;
  std::vector<const float*> s2p;
  for (size_t p = 0; p < q.size(); ++p) {
    require(q[p].scalar_type() == at::kByte && q[p].is_contiguous() && q[p].numel() == n[p] * K / 2 &&
                (tiled || q[p].size(1) * 2 == K), "q: u8 [N, K/2] (or tiled: [N/16, K/128, 1024])");
    require(scale[p].element_size() == 1 && scale[p].is_contiguous() && scale[p].numel() == n[p] * K / 16,
            "scale: e4m3 [N, K/16] (or tiled, as many bytes)");
    require(s2[p].scalar_type() == at::kFloat && s2[p].numel() == 1 && s2[p].is_cuda(), "s2: one float32 on CUDA");
    check_aligned("nvfp4_gemv", q[p]);
    check_aligned("nvfp4_gemv", scale[p]);
    qp.push_back(q[p].data_ptr());
    sp.push_back(scale[p].data_ptr());
    s2p.push_back(s2[p].data_ptr<float>());
  }
  check_aligned("nvfp4_gemv", x);
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch("nvfp4_gemv",
               ninfer_nvfp4_gemv_sm90(x.data_ptr(), static_cast<int>(n.size()), qp.data(), sp.data(), s2p.data(),
                                      n.data(), yp.data(), M, K, warps, depth, tiled, pdl, static_cast<int>(pipeline), glu,
                                      norm, c10::cuda::getCurrentCUDAStream()),
               warps, depth);
}

void int4_gemv_body(const at::Tensor& x, at::TensorList q, at::TensorList scale,
                    const c10::List<std::optional<at::Tensor>>& zero, at::TensorList y, int64_t warps, int64_t depth,
                    bool tiled, bool pdl, int64_t pipeline, bool glu, const NinferAddNorm* norm = nullptr) {
  require(scale.size() == q.size() && zero.size() == q.size(), "int4_gemv: as many scales and zeros as weights");
  std::vector<int> n;
  const char* q_shape = tiled ? "q: i32 [N/16, K/128, 256] (tiled)" : "q: i32 [N, K/8]";
  for (const at::Tensor& t : q) {
    require(t.dim() == (tiled ? 3 : 2), q_shape);
    n.push_back(static_cast<int>(t.size(0) * (tiled ? 16 : 1)));
  }
  const auto [M, K, yp] = check_rows("int4_gemv", x, y, n, glu);
  std::vector<const void*> qp, sp, zp;
  for (size_t p = 0; p < q.size(); ++p) {
    require(q[p].scalar_type() == at::kInt && q[p].is_contiguous() &&
                (tiled ? q[p].size(1) * 128 == K && q[p].size(2) == 256 : q[p].size(1) * 8 == K), q_shape);
    const std::optional<at::Tensor> z = zero.get(p);
    if (tiled)  // tile_int4's records: the tile's scales and zero points
      require(scale[p].scalar_type() == at::kByte && scale[p].is_contiguous() && scale[p].dim() == 3 &&
                  scale[p].size(0) * 16 == n[p] && scale[p].size(1) * 128 == K && scale[p].size(2) == 40 && !z.has_value(),
              "tiled: scale u8 [N/16, K/128, 40] (tile_int4's records, the zero points in them), zero None");
    else
      require(scale[p].scalar_type() == at::kBFloat16 && scale[p].is_contiguous() && scale[p].dim() == 2 &&
                  scale[p].size(0) == n[p] && scale[p].size(1) == K / 128, "scale: bf16 [N, K/128] (group 128)");
    if (z.has_value())
      require(z->scalar_type() == at::kInt && z->is_contiguous() && z->dim() == 2 && z->size(0) == n[p] / 8 &&
                  z->size(1) == K / 128, "zero: i32 [N/8, K/128]");
    check_aligned("int4_gemv", q[p]);
    if (tiled) check_aligned("int4_gemv", scale[p]);  // (the records' words are loaded as such)
    qp.push_back(q[p].data_ptr());
    sp.push_back(scale[p].data_ptr());
    zp.push_back(z.has_value() ? z->data_ptr() : nullptr);
  }
  check_aligned("int4_gemv", x);
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch("int4_gemv",
               ninfer_int4_gemv_sm90(x.data_ptr(), static_cast<int>(n.size()), qp.data(), sp.data(), zp.data(),
                                     n.data(), yp.data(), M, K, warps, depth, tiled, pdl, static_cast<int>(pipeline),
                                     glu, norm, c10::cuda::getCurrentCUDAStream()),
               warps, depth);
}

std::string nvfp4_gemv(const at::Tensor& x, at::TensorList q, at::TensorList scale, at::TensorList s2, at::TensorList y,
                       int64_t warps, int64_t depth, bool tiled, bool pdl, int64_t pipeline, bool glu) {
  return guarded([&] { nvfp4_gemv_body(x, q, scale, s2, y, warps, depth, tiled, pdl, pipeline, glu); });
}

// One row x [1, K] (bf16) and what NinferAddNorm takes: residual and the outputs [1, K] bf16 as x, weight
// bf16 [K]; the outputs apart from x and residual (other blocks still read those while block 0 writes).
// -> the norm the launch stages.
NinferAddNorm checked_norm(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& residual,
                           const at::Tensor& weight, const std::optional<at::Tensor>& sum_out,
                           const std::optional<at::Tensor>& normed_out, double eps, double offset) {
  require(x.dim() == 2 && x.size(0) == 1, op, ": one row x [1, K]");
  const auto like_x = [&x](const at::Tensor& t) {
    return t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous() && t.numel() == x.numel() &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  require(like_x(weight), op, ": weight bf16 [K], contiguous, 16-byte aligned");
  for (const auto* t : {&residual, &sum_out, &normed_out})
    require(!t->has_value() || like_x(**t), op, ": residual and outputs bf16 [1, K] as x, 16-byte aligned");
  for (const auto* out : {&sum_out, &normed_out})
    require(!out->has_value() || ((*out)->data_ptr() != x.data_ptr() &&
                                  (!residual.has_value() || (*out)->data_ptr() != residual->data_ptr())),
            op, ": the outputs must not be x or residual");
  const auto pointer = [](const std::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; };
  return {pointer(residual), weight.data_ptr(), pointer(sum_out), pointer(normed_out), static_cast<float>(eps),
          static_cast<float>(offset)};
}

std::string nvfp4_norm_gemv(const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
                            const std::optional<at::Tensor>& sum_out, const std::optional<at::Tensor>& normed_out,
                            double eps, double offset, at::TensorList q, at::TensorList scale, at::TensorList s2,
                            at::TensorList y, int64_t warps, int64_t depth, bool pdl, int64_t pipeline, bool glu) {
  return guarded([&] {
    const NinferAddNorm norm = checked_norm("nvfp4_norm_gemv", x, residual, weight, sum_out, normed_out, eps, offset);
    nvfp4_gemv_body(x, q, scale, s2, y, warps, depth, true, pdl, pipeline, glu, &norm);
  });
}

std::string int4_norm_gemv(const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight,
                           const std::optional<at::Tensor>& sum_out, const std::optional<at::Tensor>& normed_out,
                           double eps, double offset, at::TensorList q, at::TensorList scale, at::TensorList y,
                           int64_t warps, int64_t depth, bool pdl, int64_t pipeline, bool glu) {
  return guarded([&] {
    const NinferAddNorm norm = checked_norm("int4_norm_gemv", x, residual, weight, sum_out, normed_out, eps, offset);
    c10::List<std::optional<at::Tensor>> zero;  // (tiled: the zero points are in the records)
    for (size_t p = 0; p < q.size(); ++p) zero.push_back(std::nullopt);
    int4_gemv_body(x, q, scale, zero, y, warps, depth, true, pdl, pipeline, glu, &norm);
  });
}

std::string int4_gemv(const at::Tensor& x, at::TensorList q, at::TensorList scale,
                      const c10::List<std::optional<at::Tensor>>& zero, at::TensorList y, int64_t warps, int64_t depth,
                      bool tiled, bool pdl, int64_t pipeline, bool glu) {
  return guarded([&] { int4_gemv_body(x, q, scale, zero, y, warps, depth, tiled, pdl, pipeline, glu); });
}

}  // namespace

// nvfp4_norm_gemv: nvfp4_gemv of one row in a block-columns pipeline (tiled; glu: bulk-block-columns) with x
// first normalized as NinferAddNorm says (x + residual, its RMSNorm), the sum and the normed row written
// where given; int4_norm_gemv likewise for tiled int4 in bulk-staged-x.
// One launch for 1 to 3 weights that read the same x, each into its own y [M, N] -> "" or why not (guarded);
// glu (tiled, the bulk pipelines): gate and up into one y = SiLU(x @ gate^T) * (x @ up^T).
// pdl: launched as a programmatic dependent of the kernel before it; pipeline: how the NVFP4 GEMV streams
// its weights (quant_gemv_sm90.h's Pipeline: the staged and block-columns ones for the tiled layouts only,
// bulk for both tiled layouts, bulk-block-columns for tiled NVFP4 only).
TORCH_LIBRARY(ninfer, m) {
  m.def("nvfp4_gemv(Tensor x, Tensor[] q, Tensor[] scale, Tensor[] s2, Tensor(a!)[] y, int warps, int depth, "
        "bool tiled, bool pdl, int pipeline, bool glu) -> str");
  m.def("nvfp4_norm_gemv(Tensor x, Tensor? residual, Tensor weight, Tensor(b!)? sum_out, Tensor(c!)? normed_out, "
        "float eps, float offset, Tensor[] q, Tensor[] scale, Tensor[] s2, Tensor(a!)[] y, int warps, int depth, "
        "bool pdl, int pipeline, bool glu) -> str");
  m.def("int4_gemv(Tensor x, Tensor[] q, Tensor[] scale, Tensor?[] zero, Tensor(a!)[] y, int warps, int depth, "
        "bool tiled, bool pdl, int pipeline, bool glu) -> str");
  m.def("int4_norm_gemv(Tensor x, Tensor? residual, Tensor weight, Tensor(b!)? sum_out, Tensor(c!)? normed_out, "
        "float eps, float offset, Tensor[] q, Tensor[] scale, Tensor(a!)[] y, int warps, int depth, "
        "bool pdl, int pipeline, bool glu) -> str");
}

TORCH_LIBRARY_IMPL(ninfer, CUDA, m) {
  m.impl("nvfp4_gemv", &nvfp4_gemv);
  m.impl("nvfp4_norm_gemv", &nvfp4_norm_gemv);
  m.impl("int4_gemv", &int4_gemv);
  m.impl("int4_norm_gemv", &int4_norm_gemv);
}
