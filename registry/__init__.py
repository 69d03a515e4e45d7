"""The closed set of supported models, as data: models/*.toml + families/*.toml + profiles.toml.

`load(id)` returns a validated RegistryEntry; its `resolved` dict (model fields + family tensor
rules) is what artifacts embed and hash. Pure stdlib so the compiler and the tests can read it
without the runtime; the runtime reads only the copy embedded in each artifact.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_HERE = Path(__file__).parent
_MODEL_KEYS = {"id", "family", "display_name", "hf_repo", "hf_model_type", "hf_architectures", "test_only",
               "profiles", "targets", "config", "config_optional", "profile_overrides"}
_FAMILY_KEYS = {"family", "layer_pattern", "available_parts", "scopes", "tensors"}
_RULE_KEYS = {"name", "shape", "class", "part", "repeat", "layer_type", "fuse", "when"}
_TARGETS = ("sm_120a", "sm_90a", "linear")


class RegistryError(ValueError):
    """A registry file is malformed, or an id / profile is not in the closed set."""


@dataclass(frozen=True)
class RegistryEntry:
    id: str
    family: str
    display_name: str
    hf_repo: str
    hf_model_type: str
    hf_architectures: tuple[str, ...]
    test_only: bool
    profiles: tuple[str, ...]
    targets: tuple[str, ...]
    config: dict  # dotted config path -> exact required value
    config_optional: dict  # dotted config path -> allowed values when present
    resolved: dict  # what artifacts embed

    @property
    def sha256(self) -> str:
        canonical = json.dumps(self.resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def available_parts(self) -> tuple[str, ...]:
        return tuple(self.resolved["available_parts"])

    def expected_config(self) -> dict:
        """The nested config the [config] table pins (used to self-check the rules)."""
        out: dict = {}
        for path, value in self.config.items():
            node = out
            *parents, leaf = path.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return out


def _toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"{path.name}: invalid TOML: {e}") from None


def _require(data: dict, keys: set[str], where: str, optional: set[str] = frozenset()) -> None:
    extra, missing = set(data) - keys - optional, keys - set(data)
    if extra or missing:
        raise RegistryError(f"{where}: unknown keys {sorted(extra)}, missing keys {sorted(missing)}")


@cache
def profiles() -> dict:
    """{"schemes": {name: scheme}, "profiles": {name: {"description", "classes": {class: scheme name}}}}."""
    data = _toml(_HERE / "profiles.toml")
    for name, prof in data["profiles"].items():
        for cls, scheme in prof["classes"].items():
            if scheme not in data["schemes"]:
                raise RegistryError(f"profiles.toml: profile {name} class {cls} uses unknown scheme {scheme!r}")
    return data


@cache
def _family(name: str) -> dict:
    path = _HERE / "families" / f"{name}.toml"
    if not path.is_file():
        raise RegistryError(f"unknown family {name!r}")
    data = _toml(path)
    _require(data, _FAMILY_KEYS, path.name)
    known_classes = set(next(iter(profiles()["profiles"].values()))["classes"])
    for i, rule in enumerate(data["tensors"]):
        _require(rule, {"name", "shape", "class", "part"}, f"{path.name} tensors[{i}]", _RULE_KEYS)
        if rule["class"] not in known_classes:
            raise RegistryError(f"{path.name}: {rule['name']} has unknown class {rule['class']!r}")
        if rule["part"] not in data["available_parts"]:
            raise RegistryError(f"{path.name}: {rule['name']} is in part {rule['part']!r}, not in available_parts")
    return data


def ids(include_test_only: bool = False) -> list[str]:
    out = []
    for path in sorted((_HERE / "models").glob("*.toml")):
        if include_test_only or not _toml(path).get("test_only", False):
            out.append(path.stem)
    return out


@cache
def load(model_id: str) -> RegistryEntry:
    path = _HERE / "models" / f"{model_id}.toml"
    if "/" in model_id or not path.is_file():
        raise RegistryError(f"{model_id!r} is not a registered model; registered: {', '.join(ids())}")
    data = _toml(path)
    _require(data, _MODEL_KEYS - {"config_optional", "profile_overrides"}, path.name, {"config_optional", "profile_overrides"})
    if data["id"] != model_id:
        raise RegistryError(f"{path.name}: id {data['id']!r} does not match the file name")
    known_profiles = profiles()["profiles"]
    for p in data["profiles"]:
        if p not in known_profiles:
            raise RegistryError(f"{path.name}: unknown profile {p!r}")
    for t in data["targets"]:
        if t not in _TARGETS:
            raise RegistryError(f"{path.name}: unknown target {t!r}")
    family = _family(data["family"])
    resolved = {k: v for k, v in data.items()}
    resolved.update({k: family[k] for k in ("layer_pattern", "available_parts", "scopes", "tensors")})
    entry = RegistryEntry(
        id=data["id"], family=data["family"], display_name=data["display_name"], hf_repo=data["hf_repo"],
        hf_model_type=data["hf_model_type"], hf_architectures=tuple(data["hf_architectures"]),
        test_only=bool(data["test_only"]), profiles=tuple(data["profiles"]), targets=tuple(data["targets"]),
        config=dict(data["config"]), config_optional=dict(data.get("config_optional", {})), resolved=resolved,
    )
    return entry


def scheme_classes(entry: RegistryEntry, profile: str, overrides: dict[str, str] | None = None) -> dict[str, dict]:
    """Tensor class -> scheme dict for `profile` on this model (entry overrides, then caller overrides)."""
    if profile not in entry.profiles:
        raise RegistryError(f"profile {profile!r} is not allowed for {entry.id} (allowed: {', '.join(entry.profiles)})")
    data = profiles()
    names = dict(data["profiles"][profile]["classes"])
    names.update(entry.resolved.get("profile_overrides", {}).get(profile, {}))
    for cls, scheme in (overrides or {}).items():
        if cls not in names:
            raise RegistryError(f"unknown tensor class {cls!r} (classes: {', '.join(sorted(names))})")
        if scheme not in data["schemes"]:
            raise RegistryError(f"unknown scheme {scheme!r} (schemes: {', '.join(sorted(data['schemes']))})")
        names[cls] = scheme
    return {cls: dict(data["schemes"][name]) for cls, name in names.items()}
