"""Check a checkpoint against its registry entry before any heavy work.

Every problem names the config key or tensor and both values. The set is closed: there is no
override for an unregistered or mismatching model.
"""

from __future__ import annotations

from ninfer_format.rules import RuleError, expand, layer_type
from ninfer_registry import RegistryEntry

from .source import Checkpoint

_FLOAT_DTYPES = ("torch.bfloat16", "torch.float16", "torch.float32")


class ValidationError(ValueError):
    """The checkpoint is not the registered model."""


_MISSING = object()


def _get(config: dict, path: str):
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def normalize_config(config: dict, entry: RegistryEntry) -> dict:
    """Accept the legacy spelling of RoPE settings (`rope_theta` beside the other keys, as older
    config.json files have it) by mirroring it into `rope_parameters`, which transformers 5 writes."""
    scope = entry.resolved["scopes"]["text"]
    text = _get(config, scope) if scope else config
    if isinstance(text, dict) and "rope_parameters" not in text and "rope_theta" in text:
        scaling = text.get("rope_scaling") or {}
        text["rope_parameters"] = {"rope_type": scaling.get("rope_type", "default"), "rope_theta": text["rope_theta"],
                                   **{k: v for k, v in scaling.items() if k != "rope_type"}}
    return config


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def check_config(config: dict, entry: RegistryEntry) -> list[str]:
    problems = []
    if config.get("model_type") != entry.hf_model_type:
        problems.append(f"model_type is {config.get('model_type')!r}, {entry.id} needs {entry.hf_model_type!r}")
    archs = config.get("architectures") or []
    if not set(archs) & set(entry.hf_architectures):
        problems.append(f"architectures {archs} are not {list(entry.hf_architectures)}")
    for path, want in entry.config.items():
        got = _get(config, path)
        if got is _MISSING:
            problems.append(f"config key {path} is missing ({entry.id} needs {want!r})")
        elif not _same(got, want):
            problems.append(f"config key {path} is {got!r}, {entry.id} needs {want!r}")
    for path, allowed in entry.config_optional.items():
        got = _get(config, path)
        if got is not _MISSING and got not in allowed:
            problems.append(f"config key {path} is {got!r}, {entry.id} allows {allowed} or absent")
    scope = entry.resolved["scopes"]["text"]
    text = _get(config, scope) if scope else config
    types = text.get("layer_types") if isinstance(text, dict) else None
    if types is not None:
        want = [layer_type(entry.resolved, i) for i in range(len(types))]
        if types != want:
            bad = next(i for i, (a, b) in enumerate(zip(types, want)) if a != b) if len(types) == len(want) else 0
            problems.append(f"config key {scope + '.' if scope else ''}layer_types[{bad}] is {types[bad]!r}, "
                            f"{entry.id} needs {want[bad]!r}")
    return problems


def check_tensors(ckpt: Checkpoint, entry: RegistryEntry, parts: tuple[str, ...]) -> list[str]:
    try:
        wanted = expand(entry.resolved, ckpt.config, parts)
        everything = expand(entry.resolved, ckpt.config, entry.available_parts)
    except RuleError as e:
        return [f"registry rules do not apply to this config: {e}"]
    problems = []
    for name in sorted(set(wanted) - set(ckpt.tensors)):
        problems.append(f"tensor {name} is missing from the checkpoint")
    for name in sorted(set(ckpt.tensors) - set(everything)):
        problems.append(f"tensor {name} is not part of {entry.id}")
    for name in sorted(set(wanted) & set(ckpt.tensors)):
        got, want = ckpt.tensors[name].shape, wanted[name].shape
        if got != want:
            problems.append(f"tensor {name} has shape {list(got)}, {entry.id} needs {list(want)}")
        if str(ckpt.tensors[name].dtype) not in _FLOAT_DTYPES:
            problems.append(f"tensor {name} has dtype {ckpt.tensors[name].dtype}, expected a float dtype")
    return problems


def validate(ckpt: Checkpoint, entry: RegistryEntry, parts: tuple[str, ...]) -> None:
    """Raise ValidationError listing every mismatch (config first: tensor checks need a sane config)."""
    problems = check_config(ckpt.config, entry)
    if not problems:
        problems = check_tensors(ckpt, entry, parts)
    if problems:
        more = f" (+{len(problems) - 8} more)" if len(problems) > 8 else ""
        raise ValidationError(f"{ckpt.root} is not {entry.id}: " + "; ".join(problems[:8]) + more)
