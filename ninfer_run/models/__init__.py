"""Model families: family name (from the artifact's registry entry) -> module, imported lazily."""

from __future__ import annotations

import importlib

FAMILIES = {"qwen3_5_hybrid": "ninfer_run.models.qwen3_5", "qwen3_dense": "ninfer_run.models.qwen3"}


def model_class(family: str):
    if family not in FAMILIES:
        raise ValueError(f"no runtime model for family {family!r} (known: {', '.join(FAMILIES)})")
    return importlib.import_module(FAMILIES[family]).Model
