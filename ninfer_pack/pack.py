"""The streaming loop: source tensor -> quantize -> target layout -> writer, one fused group at a time.

Only the tensors of one group (at most gate+up of one layer) are resident; everything else is a
thunk in the source. The writer makes the file appear atomically at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ninfer_format import ArtifactWriter, dequantize, entry_sha256
from ninfer_format.constants import DTYPE_NAMES
from ninfer_format.layouts import apply_layout
from ninfer_format.quants import row_slices
from ninfer_registry import RegistryEntry, scheme_classes

from .plan import PlannedTensor, build_plan, stored_bytes
from .quant import global_scale_of, quantize_tensor

TensorThunk = Callable[[], torch.Tensor]
PartsThunk = Callable[[], dict[str, torch.Tensor]]
# The pack summary's error statistics decode every 4th row slab of each tensor (decoding everything
# cost as much as quantizing); `ninfer-pack verify --source` checks every element against its bound.
_ERROR_SAMPLE_EVERY = 4


_WIDTH = {torch.bfloat16: (8, 8), torch.float16: (11, 5), torch.float32: (24, 8), torch.float64: (53, 11)}


def _exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """True when every src value is representable in dst (same dtype, or more mantissa and exponent)."""
    return src == dst or all(d >= s for s, d in zip(_WIDTH[src], _WIDTH[dst]))


def _sq_norm(x: torch.Tensor) -> float:
    flat = x.reshape(-1)
    return float(torch.dot(flat, flat)) if flat.numel() else 0.0


def slab_errors(scheme: dict, shape: tuple[int, ...], parts: dict[str, torch.Tensor], ref: torch.Tensor,
                every: int = 1):
    """Yield (slab parts, source rows as float32, dequantized - source) one row slab at a time
    (every `every`-th slab), so error checks stay bounded in memory for any tensor size."""
    for i, (r0, r1, slab) in enumerate(row_slices(scheme, shape, parts)):
        if i % every:
            continue
        x = ref[r0:r1].float() if ref.ndim else ref.float()
        yield slab, x, dequantize(scheme, (r1 - r0, *shape[1:]), slab).reshape(x.shape) - x


@dataclass
class ErrorStats:
    """Per-class quantization error: sums for a size-weighted relative RMS error, and the worst case."""

    tensors: int = 0
    sq_err: float = 0.0
    sq_ref: float = 0.0
    max_abs: float = 0.0

    def add(self, scheme: dict, shape: tuple[int, ...], parts: dict[str, torch.Tensor], ref: torch.Tensor,
            sample_every: int = 1) -> None:
        """Accumulate one tensor's error, decoding every `sample_every`-th row slab (bounded memory)."""
        self.tensors += 1
        if scheme["kind"] == "plain" and _exact_cast(ref.dtype, parts["data"].dtype):
            return  # widening or identical: the stored values are the source values, error exactly 0
        for _, x, diff in slab_errors(scheme, shape, parts, ref, sample_every):
            self.sq_err += _sq_norm(diff)
            self.sq_ref += _sq_norm(x)
            self.max_abs = max(self.max_abs, float(diff.abs().max()) if diff.numel() else 0.0)

    @property
    def rel_rms(self) -> float:
        return (self.sq_err / self.sq_ref) ** 0.5 if self.sq_ref else 0.0


@dataclass
class PackResult:
    path: Path
    tensors: int
    bytes_out: int
    bytes_bf16: int
    seconds: float
    errors: dict[str, ErrorStats] = field(default_factory=dict)


def manifest_header(entry: RegistryEntry, config: dict, parts: tuple[str, ...], profile: str,
                    classes: dict[str, dict], target: str, provenance: dict) -> dict:
    return {
        "model": {"registry_id": entry.id, "registry_sha256": entry_sha256(entry.resolved), "family": entry.family,
                  "parts": list(parts), "registry_entry": entry.resolved},
        "quantization": {"profile": profile, "classes": classes},
        "target": target,
        "config": config,
        "provenance": provenance,
    }


def _check_prequantized(pre: dict[str, dict], members: tuple[str, ...], by_name: dict[str, PlannedTensor]) -> None:
    """Checkpoint NVFP4 tensors are written as they are only where the profile wants NVFP4 too, and a
    group the runtime fuses must share one global scale (as ModelOpt and compressed-tensors export it)."""
    for name in pre:
        scheme = by_name[name].plan.scheme
        if scheme["kind"] != "nvfp4":
            raise ValueError(f"{name} is NVFP4 in the checkpoint but the profile stores it as {scheme}; "
                             "pick a profile (or --lm-head) that keeps it NVFP4")
    if len(pre) != len(members):
        raise ValueError(f"fused group {list(members)}: only {sorted(pre)} are NVFP4 in the checkpoint")
    scales = [float(p["global_scale"]) for p in pre.values()]
    if len(set(scales)) > 1:
        raise ValueError(f"{list(members)} are fused at run time and need one NVFP4 global scale; the checkpoint "
                         f"has {scales} (re-export it with fused global scales, or pack the bf16 checkpoint)")


def pack(entry: RegistryEntry, config: dict, tensors: dict[str, TensorThunk], source_dtypes: dict[str, torch.dtype],
         out: Path, *, profile: str, target: str, parts: tuple[str, ...], blobs: dict[str, bytes], provenance: dict,
         class_overrides: dict[str, str] | None = None, device: str = "cpu", overwrite: bool = False,
         measure_error: bool = True, compress_blobs: bool = True,
         before_close: Callable[[dict], None] | None = None, progress: Callable[[PlannedTensor, int], None] | None = None,
         prequantized: dict[str, PartsThunk] | None = None) -> PackResult:
    """Compile one checkpoint into `out`. `tensors` maps each expected name to a loader thunk;
    `prequantized` maps names the checkpoint already holds as NVFP4 to their logical parts, which are
    written as they are (see prequant.py).

    `before_close(manifest)` may fill fixed-width fields (e.g. source sha256 digests computed in
    parallel with packing) just before the manifest is finalized.
    """
    start = time.perf_counter()
    classes = scheme_classes(entry, profile, class_overrides)
    dtypes = {name: DTYPE_NAMES[dt] for name, dt in source_dtypes.items()}
    planned = build_plan(entry, config, parts, classes, target, dtypes)
    header = manifest_header(entry, config, parts, profile, classes, target, provenance)
    result = PackResult(out, len(planned), 0, 0, 0.0)
    by_name = {p.plan.name: p for p in planned}
    with ArtifactWriter(out, header, blobs, [p.plan for p in planned], overwrite=overwrite,
                       compress_blobs=compress_blobs) as writer:
        i = 0
        while i < len(planned):
            members = planned[i].group
            pre = {name: prequantized[name]() for name in members if prequantized and name in prequantized}
            if pre:
                _check_prequantized(pre, members, by_name)
            weights = {name: tensors[name]().to(device) for name in members if name not in pre}
            s2 = None
            if len(members) > 1 and planned[i].plan.scheme["kind"] == "nvfp4" and not pre:
                s2 = global_scale_of(list(weights.values()), list(members))
            for name in members:
                p, w = by_name[name], weights.pop(name, None)
                logical = pre.pop(name) if w is None else quantize_tensor(p.plan.scheme, w, name, s2)
                kind = p.plan.scheme["kind"]
                stored = {role: apply_layout(target, kind, role, t) for role, t in logical.items()}
                writer.write(name, stored)
                if measure_error and w is not None:
                    stats = result.errors.setdefault(p.expected.tensor_class, ErrorStats())
                    stats.add(p.plan.scheme, p.plan.logical_shape, logical, w, _ERROR_SAMPLE_EVERY)
                nbytes, source_bytes = stored_bytes(p.plan.parts), 2 * math.prod(p.plan.logical_shape)
                result.bytes_out += nbytes
                result.bytes_bf16 += source_bytes
                if progress:
                    progress(p, source_bytes)
                del w, logical, stored
            i += len(members)
        if before_close:
            before_close(writer.manifest)
    result.seconds = time.perf_counter() - start
    return result
