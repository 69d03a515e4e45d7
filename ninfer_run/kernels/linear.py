"""Quantized weights that apply themselves (layers.linear calls them): the GPU path's linear layer.

Few rows (decode, MTP verification: T <= 16) run the GEMV kernels straight from the packed weight
(NVFP4 and int4-g128 on Hopper: the CUDA kernels of cuda_ops, else Triton);
more rows (prefill chunks) dequantize into one shared bf16 scratch buffer, sized to the largest
weight, and run a single cuBLAS matmul. The weight's parts are the artifact's logical (row-major)
parts, on the device; on Hopper the NVFP4 and int4-g128 codes and scales (and zero points) are re-laid
once in the CUDA GEMV's tile order (cuda_ops.tile_nvfp4, tile_int4), which the dequantization reads too.
"""

from __future__ import annotations

import torch

from . import cuda_ops, int_linear, nvfp4_linear

GEMV_MAX_ROWS = 16
MAX_GROUP = 3  # weights one CUDA GEMV launch takes (csrc kMaxParts)


class Scratch:
    """One dequantization buffer shared by every quantized weight of a model (they run one at a time)."""

    def __init__(self):
        self._buffer: torch.Tensor | None = None

    def view(self, n: int, k: int, dtype: torch.dtype, device) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < n * k or self._buffer.dtype != dtype:
            self._buffer = torch.empty(n * k, dtype=dtype, device=device)
        return self._buffer[: n * k].view(n, k)


class QuantizedLinear:
    """`name`: the artifact's tensor name; an MLP's weight (gate, up, down: ".mlp." in it) may run its NVFP4
    GEMVs in a pipeline of their own (cuda_ops.MLP_PIPELINE)."""

    def __init__(self, scheme: dict, parts: dict[str, torch.Tensor], shape: tuple[int, int], scratch: Scratch,
                 name: str = ""):
        if scheme["kind"] not in ("nvfp4", "int"):
            raise ValueError(f"no kernel for scheme {scheme['kind']!r}")
        self.scheme, self.parts, self.shape, self.scratch = scheme, parts, shape, scratch
        self.mlp = ".mlp." in name
        # NVFP4 and int4-g128 on Hopper: codes (and NVFP4's scales) re-laid once, at load, as the CUDA GEMV
        # streams them (each warp's tile contiguous); prefill dequantizes from the same bytes
        on_gpu = parts["qweight"].is_cuda
        if scheme["kind"] == "nvfp4":
            self.tiled = on_gpu and cuda_ops.tiles_nvfp4(*shape)
            if self.tiled:
                parts["qweight"], parts["block_scale"] = cuda_ops.tile_nvfp4(parts["qweight"], parts["block_scale"])
        else:
            self.tiled = on_gpu and cuda_ops.tiles_int4(*shape, scheme["bits"], scheme["group_size"], parts["scale"])
            if self.tiled:
                parts["qweight"], parts["scale"] = cuda_ops.tile_int4(parts["qweight"], parts["scale"],
                                                                      parts.pop("zero_point", None))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        grouped = QuantizedLinear.group(x, [self])
        if grouped is not None:
            return grouped[0]
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        if x2.shape[0] <= GEMV_MAX_ROWS:
            y = self._triton_gemv(x2)
        else:
            w = self._dequantize(self.scratch.view(*self.shape, x.dtype, x.device))
            y = x2 @ w.T
        return y.to(x.dtype).reshape(*lead, self.shape[0])

    @staticmethod
    def group(x: torch.Tensor, weights: list, glu: bool = False) -> list[torch.Tensor] | None:
        """x @ W^T for 1 to 3 weights as one CUDA GEMV launch (they read the same x: gate and up, q/k/v):
        one launch instead of three; None where they cannot share one (more rows than a GEMV takes, a
        plain tensor among them, a weight the CUDA kernels do not read). `glu`: weights are gate and up
        of one shape -> [SiLU(x @ gate^T) * (x @ up^T)] from the kernel's float32 sums, where the launch of
        these rows writes it (_writes_glu), else None."""
        lead, k = x.shape[:-1], x.shape[-1]
        if not x.is_cuda or x.numel() // k > GEMV_MAX_ROWS or len(weights) > MAX_GROUP:
            return None
        x2 = x.reshape(-1, k)
        kernels = {w._cuda_gemv(x2) if isinstance(w, QuantizedLinear) else None for w in weights}
        if len(kernels) != 1 or None in kernels:
            return None
        mlp = weights[0].mlp
        if glu and (len(weights) != 2 or weights[0].shape != weights[1].shape
                    or not QuantizedLinear._writes_glu(kernels, x2.shape[0], k, mlp)):
            return None
        x2 = x2.to(torch.bfloat16)  # (the tiled NVFP4 kernel takes any rows as bf16; results are cast back)
        if kernels == {"nvfp4"}:
            ys = cuda_ops.nvfp4_gemv_group(x2, [w._nvfp4_parts() for w in weights], tiled=True, glu=glu,
                                           pipeline=cuda_ops.pipeline_for(rows=x2.shape[0], mlp=mlp))
        else:
            ys = cuda_ops.int4_gemv_group(x2, [w._int4_parts() for w in weights], tiled=weights[0].tiled, glu=glu)
        return [y.to(x.dtype).reshape(*lead, w.shape[0]) for y, w in zip(ys, weights)]

    @staticmethod
    def group_after_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                         offset: float, weights: list, normed: bool, glu: bool = False) -> tuple | None:
        """layers.add_rms_norm_linear_group as one launch: (x + residual, its RMSNorm if `normed`, that norm
        @ W^T for each weight) where the one-row GEMV stages the norm itself (cuda_ops.norm_gemv_fits: tiled
        NVFP4; int4_norm_gemv_fits: tiled int4 in bulk-staged-x), else None. `glu`: weights are gate and up ->
        [SiLU(gate) * up] as the outputs, where the launch writes it (_writes_glu), else None."""
        k = x.shape[-1]
        if (not x.is_cuda or x.numel() != k or len(weights) > MAX_GROUP or x.dtype != torch.bfloat16
                or (residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype))):
            return None
        x2 = x.reshape(1, k)
        kernels = {w._cuda_gemv(x2) if isinstance(w, QuantizedLinear) else None for w in weights}
        if kernels not in ({"nvfp4"}, {"int4-tiled"}):
            return None
        mlp = weights[0].mlp
        if glu and not QuantizedLinear._writes_glu(kernels, 1, k, mlp):
            return None
        h = residual.reshape(1, k) if residual is not None else None
        if kernels == {"int4-tiled"}:
            if not cuda_ops.int4_norm_gemv_fits(x2, [w.shape[0] for w in weights], norm_weight, glu=glu):
                return None
            s, y, ys = cuda_ops.int4_norm_gemv_group(x2, h, norm_weight, eps, offset, [w._int4_parts() for w in weights],
                                                     normed=normed, glu=glu)
            return QuantizedLinear._shaped(x, s, y, ys, weights)
        parts = [w._nvfp4_parts() for w in weights]
        pipeline = cuda_ops.pipeline_for(mlp=mlp)
        if not cuda_ops.norm_gemv_fits(x2, parts, norm_weight, glu=glu, pipeline=pipeline):
            return None
        s, y, ys = cuda_ops.nvfp4_norm_gemv_group(x2, h, norm_weight, eps, offset, parts, normed=normed, glu=glu,
                                                  pipeline=pipeline)
        return QuantizedLinear._shaped(x, s, y, ys, weights)

    @staticmethod
    def _shaped(x: torch.Tensor, s: torch.Tensor, y: torch.Tensor | None, ys: list[torch.Tensor], weights: list) -> tuple:
        """A one-row norm launch's outputs in x's shape (group_after_norm)."""
        return (s.view(x.shape), y.view(x.shape) if y is not None else None,
                [out.reshape(*x.shape[:-1], w.shape[0]) for out, w in zip(ys, weights)])

    @staticmethod
    def _writes_glu(kernels: set, rows: int, k: int, mlp: bool) -> bool:
        """Whether the launch of gate and up whose kernel is `kernels` ({"nvfp4"} or {"int4-tiled"}), of `rows`
        rows of K, writes SiLU(gate) * up itself (cuda_ops.uses_glu, int4_uses_glu)."""
        if kernels == {"nvfp4"}:
            return cuda_ops.uses_glu(rows, mlp)
        return kernels == {"int4-tiled"} and cuda_ops.int4_uses_glu(k)

    def _nvfp4_parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qweight, block_scale, global_scale), as cuda_ops' NVFP4 GEMVs take a weight."""
        return self.parts["qweight"], self.parts["block_scale"], self.parts["global_scale"]

    def _int4_parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(qweight, scale, zero_point), as cuda_ops' int4 GEMVs take a weight (tiled: codes, records, None)."""
        return self.parts["qweight"], self.parts["scale"], self.parts.get("zero_point")

    def _cuda_gemv(self, x: torch.Tensor) -> str | None:
        """Which CUDA GEMV takes these (<= 16) rows: "nvfp4" or "int4-tiled" (the tiled layouts: the shape
        fits, checked at load), "int4" (row-major int4-g128, bf16 rows), or None. (Weights of one launch
        share one: tiled and row-major int4 never mix.)"""
        if self.tiled:
            return "nvfp4" if self.scheme["kind"] == "nvfp4" else "int4-tiled"
        if self.scheme["kind"] == "int" and cuda_ops.int4_gemv_fits(x, self.shape[0], self.scheme["bits"],
                                                                   self.scheme["group_size"], self.parts["scale"]):
            return "int4"
        return None

    def _triton_gemv(self, x: torch.Tensor) -> torch.Tensor:
        p = self.parts
        if self.scheme["kind"] == "nvfp4":
            return nvfp4_linear.gemv(x, p["qweight"], p["block_scale"], p["global_scale"])
        return int_linear.gemv(x, p["qweight"], p["scale"], p.get("zero_point"), self.scheme["bits"],
                               self.scheme["group_size"])

    def _dequantize(self, out: torch.Tensor) -> torch.Tensor:
        p = self.parts
        if self.scheme["kind"] == "nvfp4":
            return nvfp4_linear.dequantize(p["qweight"], p["block_scale"], p["global_scale"], out=out,
                                           tiled_shape=self.shape if self.tiled else None)
        return int_linear.dequantize(p["qweight"], p["scale"], p.get("zero_point"), self.scheme["bits"],
                                     self.scheme["group_size"], self.shape[1], out=out, tiled=self.tiled)
