"""Open an artifact and build its model on the reference path (weights dequantized by pure torch).

Reads only the artifact (config + registry entry embedded in it); never the compiler or registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ninfer_format import Artifact

from .models import model_class
from .vision.encoder import PREFIX as VISION_PREFIX
from .vision.encoder import VisionTower


@dataclass
class Loaded:
    artifact: Artifact
    model: object
    family: str
    vision: VisionTower | None = None


def load(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", check: bool = False,
         vision: bool = False, kernels: bool | None = None) -> Loaded:
    """`check=True` verifies every tensor's checksum while loading; `vision=True` also loads the
    vision tower (ValueError if the artifact has none). With `kernels` (default: on a CUDA device)
    quantized 2-D weights stay packed and run through the GPU kernels (kernels/linear.py); otherwise
    every weight is dequantized once, the reference path."""
    artifact = Artifact(path)
    m = artifact.manifest
    kernels = str(device).startswith("cuda") if kernels is None else kernels
    scratch = None
    if kernels:
        from .kernels import cuda_ops
        from .kernels.linear import QuantizedLinear, Scratch

        scratch = Scratch()
        cuda_ops.available()  # the CUDA kernels build (once per machine) now, not in the first request

    def weight(name: str):
        t = artifact.entry(name)
        if kernels and t.scheme["kind"] != "plain" and len(t.logical_shape) == 2:
            parts = {role: p.to(device) for role, p in artifact.logical_parts(name, check=check).items()}
            return QuantizedLinear(t.scheme, parts, t.logical_shape, scratch, name)
        return artifact.dequantized(name, check=check).to(device=device, dtype=dtype)

    def weights(keep) -> dict:
        return {name: weight(name) for name in artifact.tensor_names if keep(name)}

    model = model_class(m.model["family"])(m.config, m.model["registry_entry"],
                                           weights(lambda n: not n.startswith(VISION_PREFIX)))
    tower = None
    if vision:
        if "vision" not in m.model["parts"]:
            raise ValueError(f"{artifact.path.name} has no vision tower (packed without it, or the model has none)")
        tower = VisionTower.from_config(m.config, weights(lambda n: n.startswith(VISION_PREFIX)))
    return Loaded(artifact, model, m.model["family"], tower)
