"""Quantized weights that apply themselves (layers.linear calls them): the GPU path's linear layer.

Few rows (decode, MTP verification: T <= 16) run the GEMV kernels straight from the packed weight
(NVFP4 and int4-g128 on Hopper: the CUDA kernels of cuda_ops, else Triton);
more rows (prefill chunks) dequantize into one shared bf16 scratch buffer, sized to the largest
weight, and run a single cuBLAS matmul. The weight's parts are the artifact's logical (row-major)
parts, on the device; on Hopper the NVFP4 codes and scales are re-laid once in the CUDA GEMV's
tile order (cuda_ops.tile_nvfp4), which the dequantization reads too.
"""

from __future__ import annotations

import torch

from . import cuda_ops, int_linear, nvfp4_linear

GEMV_MAX_ROWS = 16


class Scratch:
    """One dequantization buffer shared by every quantized weight of a model (they run one at a time)."""

    def __init__(self):
        self._buffer: torch.Tensor | None = None

    def view(self, n: int, k: int, dtype: torch.dtype, device) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < n * k or self._buffer.dtype != dtype:
            self._buffer = torch.empty(n * k, dtype=dtype, device=device)
        return self._buffer[: n * k].view(n, k)


class QuantizedLinear:
    def __init__(self, scheme: dict, parts: dict[str, torch.Tensor], shape: tuple[int, int], scratch: Scratch):
        if scheme["kind"] not in ("nvfp4", "int"):
            raise ValueError(f"no kernel for scheme {scheme['kind']!r}")
        self.scheme, self.parts, self.shape, self.scratch = scheme, parts, shape, scratch
        # NVFP4 on Hopper: codes and scales re-laid once, at load, as the CUDA GEMV streams them (each
        # warp's tile contiguous); prefill dequantizes from the same bytes
        self.tiled = (scheme["kind"] == "nvfp4" and parts["qweight"].is_cuda and cuda_ops.tiles_nvfp4(*shape))
        if self.tiled:
            parts["qweight"], parts["block_scale"] = cuda_ops.tile_nvfp4(parts["qweight"], parts["block_scale"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        if x2.shape[0] <= GEMV_MAX_ROWS:
            y = self._gemv(x2)
        else:
            w = self._dequantize(self.scratch.view(*self.shape, x.dtype, x.device))
            y = x2 @ w.T
        return y.to(x.dtype).reshape(*lead, self.shape[0])

    def _gemv(self, x: torch.Tensor) -> torch.Tensor:
        p = self.parts
        if self.scheme["kind"] == "nvfp4":
            if self.tiled:  # (the kernel takes bf16 rows; __call__ casts the result back)
                return cuda_ops.nvfp4_gemv(x.to(torch.bfloat16), p["qweight"], p["block_scale"], p["global_scale"],
                                           tiled_n=self.shape[0])
            return nvfp4_linear.gemv(x, p["qweight"], p["block_scale"], p["global_scale"])
        bits, group = self.scheme["bits"], self.scheme["group_size"]
        if cuda_ops.int4_gemv_fits(x, self.shape[0], bits, group, p["scale"]):
            return cuda_ops.int4_gemv(x, p["qweight"], p["scale"], p.get("zero_point"))
        return int_linear.gemv(x, p["qweight"], p["scale"], p.get("zero_point"), bits, group)

    def _dequantize(self, out: torch.Tensor) -> torch.Tensor:
        p = self.parts
        if self.scheme["kind"] == "nvfp4":
            return nvfp4_linear.dequantize(p["qweight"], p["block_scale"], p["global_scale"], out=out,
                                           tiled_shape=self.shape if self.tiled else None)
        return int_linear.dequantize(p["qweight"], p["scale"], p.get("zero_point"), self.scheme["bits"],
                                     self.scheme["group_size"], self.shape[1], out=out)
