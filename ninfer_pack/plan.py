"""Per-tensor decisions, all made from registry data before any weight is read: scheme, stored
parts, write order, and the groups that share an NVFP4 global scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ninfer_format import PartSpec, TensorPlan, part_specs
from ninfer_format.constants import DTYPES
from ninfer_format.rules import ExpectedTensor, expand
from ninfer_registry import RegistryEntry


@dataclass(frozen=True)
class PlannedTensor:
    expected: ExpectedTensor
    plan: TensorPlan
    group: tuple[str, ...]  # names sharing one global scale (this tensor alone when not fused)


def _group_key(t: ExpectedTensor) -> tuple | None:
    return None if t.fuse is None else (t.part, t.layer, t.fuse)


def build_plan(entry: RegistryEntry, config: dict, parts: tuple[str, ...], classes: dict[str, dict],
               target: str, source_dtypes: dict[str, str]) -> list[PlannedTensor]:
    """Plans in write order: members of a fused group are written together, at the first member's place."""
    expected = expand(entry.resolved, config, parts)
    groups: dict[tuple, list[str]] = {}
    for t in expected.values():
        key = _group_key(t)
        if key is not None:
            groups.setdefault(key, []).append(t.name)
    out, done = [], set()
    for t in expected.values():
        if t.name in done:
            continue
        key = _group_key(t)
        members = tuple(groups[key]) if key is not None else (t.name,)
        for name in members:
            e = expected[name]
            scheme = classes[e.tensor_class]
            dtype = source_dtypes[name]
            specs = tuple(part_specs(scheme, e.shape, dtype, target))
            out.append(PlannedTensor(e, TensorPlan(name, scheme, e.shape, dtype, specs), members))
            done.add(name)
    return out


def stored_bytes(specs: tuple[PartSpec, ...]) -> int:
    return sum(DTYPES[s.dtype][1] * math.prod(s.shape) for s in specs)
