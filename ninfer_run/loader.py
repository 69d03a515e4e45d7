"""Open an artifact and build its model on the reference path (weights dequantized by pure torch).

Reads only the artifact (config + registry entry embedded in it); never the compiler or registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ninfer_format import Artifact

from .models import model_class


@dataclass
class Loaded:
    artifact: Artifact
    model: object
    family: str


def load(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", check: bool = False) -> Loaded:
    """`check=True` verifies every tensor's checksum while loading."""
    artifact = Artifact(path)
    m = artifact.manifest
    weights = {name: artifact.dequantized(name, check=check).to(device=device, dtype=dtype)
               for name in artifact.tensor_names if not name.startswith("model.visual.")}
    model = model_class(m.model["family"])(m.config, m.model["registry_entry"], weights)
    return Loaded(artifact, model, m.model["family"])
