"""Quantizers: one module per scheme kind; `quantize_tensor` dispatches on the registry's scheme dict."""

from __future__ import annotations

import torch

from ninfer_format.constants import DTYPES

from .intgroup import quantize_int
from .nvfp4 import NonFiniteWeight, abs_max, global_scale_of, quantize_nvfp4

__all__ = ["NonFiniteWeight", "abs_max", "global_scale_of", "quantize_int", "quantize_nvfp4", "quantize_tensor"]


def quantize_tensor(scheme: dict, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One source tensor -> its logical (row-major) parts under `scheme`."""
    kind = scheme["kind"]
    if kind == "plain":
        if w.is_floating_point():
            abs_max(w, name)
        return {"data": w.to(DTYPES[scheme["dtype"]][0])}
    if kind == "nvfp4":
        q, s8, s2 = quantize_nvfp4(w, global_scale, name)
        return {"qweight": q, "block_scale": s8, "global_scale": s2}
    if kind == "int":
        return quantize_int(w, scheme["bits"], scheme["group_size"], scheme["symmetric"], name)
    raise ValueError(f"unknown scheme kind {kind!r}")
