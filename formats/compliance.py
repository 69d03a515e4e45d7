"""The closed-set check: an artifact holds exactly the tensors its embedded registry entry allows.

Run by the reader on open and by the writer before it creates a file, so nothing outside the
registry can be written or loaded. Uses only the entry embedded in the manifest (the runtime never
imports the registry package); `ninfer-pack verify` additionally compares that entry's hash with
the installed registry.
"""

from __future__ import annotations

import hashlib
import json

from .errors import FormatError
from .manifest import Manifest
from .quants import SchemeError, part_specs
from .rules import RuleError, expand


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def entry_sha256(entry: dict) -> str:
    """The registry-entry hash recorded in every artifact (sha256 of its canonical JSON)."""
    return hashlib.sha256(canonical_json(entry)).hexdigest()


def check_compliance(m: Manifest) -> None:
    entry = m.model["registry_entry"]
    try:
        digest = entry_sha256(entry)
    except (TypeError, ValueError) as e:
        raise FormatError(f"registry entry is not canonical JSON: {e}") from None
    if digest != m.model["registry_sha256"]:
        raise FormatError(f"embedded registry entry hashes to {digest[:12]}…, manifest says {m.model['registry_sha256'][:12]}…")
    if entry.get("id") != m.registry_id or entry.get("family") != m.model["family"]:
        raise FormatError(f"embedded registry entry is {entry.get('id')!r}/{entry.get('family')!r}, manifest says "
                          f"{m.registry_id!r}/{m.model['family']!r}")
    if m.target not in entry.get("targets", ()):
        raise FormatError(f"target {m.target} is not allowed for {m.registry_id} (allowed: {entry.get('targets')})")
    profile = m.quantization["profile"]
    if profile not in entry.get("profiles", ()):
        raise FormatError(f"profile {profile} is not allowed for {m.registry_id} (allowed: {entry.get('profiles')})")
    try:
        expected = expand(entry, m.config, m.parts_included)
    except (RuleError, KeyError, TypeError) as e:
        raise FormatError(f"registry entry {m.registry_id} does not expand against the embedded config: {e}") from None
    names = {t.name for t in m.tensors}
    unexpected = sorted(names - set(expected))
    missing = sorted(set(expected) - names)
    if unexpected:
        raise FormatError(f"{len(unexpected)} tensor(s) not in registry entry {m.registry_id}: {unexpected[:3]}")
    if missing:
        raise FormatError(f"{len(missing)} tensor(s) of {m.registry_id} missing: {missing[:3]}")
    classes = m.quantization["classes"]
    for t in m.tensors:
        exp = expected[t.name]
        if t.logical_shape != exp.shape:
            raise FormatError(f"tensor {t.name}: shape {list(t.logical_shape)}, registry says {list(exp.shape)}")
        if classes.get(exp.tensor_class) != t.scheme:
            raise FormatError(f"tensor {t.name}: scheme {t.scheme} differs from the profile's "
                              f"{exp.tensor_class!r} scheme {classes.get(exp.tensor_class)}")
        try:
            specs = part_specs(t.scheme, t.logical_shape, t.logical_dtype, m.target)
        except SchemeError as e:
            raise FormatError(f"tensor {t.name}: {e}") from None
        got = [(p.role, p.dtype, p.shape, p.layout) for p in t.parts]
        want = [(s.role, s.dtype, s.shape, s.layout) for s in specs]
        if got != want:
            raise FormatError(f"tensor {t.name}: parts {got} do not match scheme {t.scheme['kind']} on {m.target}: {want}")
