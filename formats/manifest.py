"""The manifest: typed dataclasses and a strict JSON decoder that accepts exactly the v1 schema.

Every field is type-checked; unknown keys, wrong types, bad names and impossible shapes raise
FormatError naming the field. Byte-range checks against the file happen in reader.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import prod

from . import constants as C
from .errors import FormatError

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_CHECKSUM_RE = re.compile(r"[0-9a-f]{%d}" % C.CHECKSUM_HEX_DIGITS)


@dataclass(frozen=True)
class Part:
    role: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    offset: int  # from the start of the data section
    length: int
    checksum: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class TensorEntry:
    name: str
    scheme: dict
    logical_shape: tuple[int, ...]
    logical_dtype: str
    parts: tuple[Part, ...]

    def part(self, role: str) -> Part | None:
        return next((p for p in self.parts if p.role == role), None)


@dataclass(frozen=True)
class Blob:
    name: str
    compression: str
    offset: int
    length: int
    raw_length: int
    checksum: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Manifest:
    format_version: int
    tensor_alignment: int
    model: dict
    quantization: dict
    target: str
    config: dict
    provenance: dict
    blobs: tuple[Blob, ...]
    tensors: tuple[TensorEntry, ...]
    raw: dict = field(repr=False, compare=False)

    @property
    def registry_id(self) -> str:
        return self.model["registry_id"]

    @property
    def parts_included(self) -> tuple[str, ...]:
        return tuple(self.model["parts"])


def _get(obj: dict, key: str, kind, where: str):
    if key not in obj:
        raise FormatError(f"manifest: {where} lacks the key {key!r}")
    value = obj[key]
    if kind is int:
        ok = type(value) is int
    elif kind is bool:
        ok = type(value) is bool
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise FormatError(f"manifest: {where}.{key} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def _exact_keys(obj: dict, keys: set[str], where: str, optional: set[str] = frozenset()) -> None:
    extra = set(obj) - keys - optional
    missing = keys - set(obj)
    if extra:
        raise FormatError(f"manifest: {where} has unknown keys {sorted(extra)}")
    if missing:
        raise FormatError(f"manifest: {where} lacks keys {sorted(missing)}")


def check_name(name: str, where: str) -> str:
    if not isinstance(name, str) or len(name) > C.MAX_NAME_LENGTH or not _NAME_RE.fullmatch(name):
        raise FormatError(f"manifest: {where} has an invalid name {name!r:.80} (allowed: [A-Za-z0-9_.-], <= 256 chars)")
    return name


def _shape(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > C.MAX_RANK:
        raise FormatError(f"manifest: {where} must be a list of at most {C.MAX_RANK} dimensions")
    if any(type(d) is not int or d < 0 or d > 1 << 40 for d in value):
        raise FormatError(f"manifest: {where} has an invalid dimension in {value!r:.80}")
    return tuple(value)


def _range(obj: dict, where: str) -> tuple[int, int, str]:
    offset, length = _get(obj, "offset", int, where), _get(obj, "length", int, where)
    checksum = _get(obj, "checksum", str, where)
    if offset < 0 or length < 0:
        raise FormatError(f"manifest: {where} has a negative offset or length")
    if not _CHECKSUM_RE.fullmatch(checksum):
        raise FormatError(f"manifest: {where}.checksum is not {C.CHECKSUM_HEX_DIGITS} lowercase hex digits")
    return offset, length, checksum


def check_scheme(scheme: dict, where: str) -> dict:
    kind = _get(scheme, "kind", str, where)
    if kind == "plain":
        _exact_keys(scheme, {"kind", "dtype"}, where)
        if scheme["dtype"] not in ("bf16", "f16", "f32"):
            raise FormatError(f"manifest: {where} plain dtype must be bf16, f16 or f32")
    elif kind == "nvfp4":
        _exact_keys(scheme, {"kind", "group_size", "global_scale"}, where)
        if scheme["group_size"] != 16 or scheme["global_scale"] != "decode":
            raise FormatError(f"manifest: {where} nvfp4 needs group_size 16 and global_scale 'decode'")
    elif kind == "int":
        _exact_keys(scheme, {"kind", "bits", "group_size", "symmetric"}, where)
        bits, group = _get(scheme, "bits", int, where), _get(scheme, "group_size", int, where)
        _get(scheme, "symmetric", bool, where)
        if bits not in (4, 8) or group not in (32, 64, 128, 256):
            raise FormatError(f"manifest: {where} int scheme needs bits in (4, 8) and group_size in (32, 64, 128, 256)")
    else:
        raise FormatError(f"manifest: {where} has unknown scheme kind {kind!r} (known: {sorted(C.SCHEME_KINDS)})")
    return scheme


def _part(obj, where: str) -> Part:
    if not isinstance(obj, dict):
        raise FormatError(f"manifest: {where} must be an object")
    _exact_keys(obj, {"role", "dtype", "shape", "layout", "offset", "length", "checksum"}, where)
    role, dtype, layout = (_get(obj, k, str, where) for k in ("role", "dtype", "layout"))
    if role not in C.ROLES:
        raise FormatError(f"manifest: {where} has unknown role {role!r:.40}")
    if dtype not in C.DTYPES:
        raise FormatError(f"manifest: {where} has unknown dtype {dtype!r:.40} (known: {sorted(C.DTYPES)})")
    if layout not in C.LAYOUTS:
        raise FormatError(f"manifest: {where} has unknown layout {layout!r:.40} (known: {list(C.LAYOUTS)})")
    shape = _shape(obj["shape"], f"{where}.shape")
    offset, length, checksum = _range(obj, where)
    if prod(shape) * C.DTYPES[dtype][1] != length:
        raise FormatError(f"manifest: {where} length {length} does not match {dtype} {list(shape)}")
    return Part(role, dtype, shape, layout, offset, length, checksum)


def _tensor(obj, index: int) -> TensorEntry:
    where = f"tensors[{index}]"
    if not isinstance(obj, dict):
        raise FormatError(f"manifest: {where} must be an object")
    _exact_keys(obj, {"name", "scheme", "logical_shape", "logical_dtype", "parts"}, where)
    name = check_name(obj["name"], where)
    where = f"tensor {name}"
    scheme = check_scheme(_get(obj, "scheme", dict, where), f"{where}.scheme")
    logical_dtype = _get(obj, "logical_dtype", str, where)
    if logical_dtype not in ("bf16", "f16", "f32"):
        raise FormatError(f"manifest: {where}.logical_dtype {logical_dtype!r:.40} is not bf16/f16/f32")
    parts_raw = _get(obj, "parts", list, where)
    parts = tuple(_part(p, f"{where}.parts[{i}]") for i, p in enumerate(parts_raw))
    roles = [p.role for p in parts]
    required = set(C.SCHEME_KINDS[scheme["kind"]])
    if scheme["kind"] == "int" and not scheme["symmetric"]:
        required |= set(C.OPTIONAL_ROLES["int"])
    if len(set(roles)) != len(roles) or set(roles) != required:
        raise FormatError(f"manifest: {where} has parts {roles}, scheme {scheme['kind']} needs {sorted(required)}")
    return TensorEntry(name, scheme, _shape(obj["logical_shape"], f"{where}.logical_shape"), logical_dtype, parts)


def _blob(obj, index: int) -> Blob:
    where = f"blobs[{index}]"
    if not isinstance(obj, dict):
        raise FormatError(f"manifest: {where} must be an object")
    _exact_keys(obj, {"name", "compression", "offset", "length", "raw_length", "checksum"}, where)
    name = check_name(obj["name"], where)
    if name not in C.BLOB_NAMES:
        raise FormatError(f"manifest: {where} has unknown blob name {name!r} (allowed: {', '.join(C.BLOB_NAMES)})")
    compression = _get(obj, "compression", str, f"blob {name}")
    if compression not in C.BLOB_COMPRESSIONS:
        raise FormatError(f"manifest: blob {name} has unknown compression {compression!r:.40}")
    raw_length = _get(obj, "raw_length", int, f"blob {name}")
    if not 0 <= raw_length <= C.MAX_BLOB_BYTES:
        raise FormatError(f"manifest: blob {name} raw_length {raw_length} is out of range")
    offset, length, checksum = _range(obj, f"blob {name}")
    if compression == "none" and raw_length != length:
        raise FormatError(f"manifest: blob {name} is uncompressed but raw_length != length")
    return Blob(name, compression, offset, length, raw_length, checksum)


def parse_manifest(obj) -> Manifest:
    """Validate a decoded JSON manifest against the v1 schema and return it typed."""
    if not isinstance(obj, dict):
        raise FormatError("manifest: top level must be a JSON object")
    _exact_keys(obj, set(C.MANIFEST_KEYS), "top level")
    version = _get(obj, "format_version", int, "top level")
    if _get(obj, "checksum_algorithm", str, "top level") != C.CHECKSUM_ALGORITHM:
        raise FormatError(f"manifest: checksum_algorithm must be {C.CHECKSUM_ALGORITHM!r}")
    alignment = _get(obj, "tensor_alignment", int, "top level")
    if alignment < C.TENSOR_ALIGNMENT or alignment > C.SECTION_ALIGNMENT or alignment & (alignment - 1):
        raise FormatError(f"manifest: tensor_alignment {alignment} must be a power of two in [256, 4096]")
    model = _get(obj, "model", dict, "top level")
    _exact_keys(model, {"registry_id", "registry_sha256", "family", "parts", "registry_entry"}, "model")
    check_name(_get(model, "registry_id", str, "model"), "model.registry_id")
    _get(model, "family", str, "model")
    if not _HEX64_RE.fullmatch(_get(model, "registry_sha256", str, "model")):
        raise FormatError("manifest: model.registry_sha256 is not 64 lowercase hex digits")
    parts = _get(model, "parts", list, "model")
    if not parts or any(p not in ("text", "mtp", "vision") for p in parts) or len(set(parts)) != len(parts):
        raise FormatError(f"manifest: model.parts {parts!r:.80} must be distinct values of text/mtp/vision")
    _get(model, "registry_entry", dict, "model")
    quantization = _get(obj, "quantization", dict, "top level")
    _exact_keys(quantization, {"profile", "classes"}, "quantization")
    check_name(_get(quantization, "profile", str, "quantization"), "quantization.profile")
    for cls, scheme in _get(quantization, "classes", dict, "quantization").items():
        check_name(cls, "quantization.classes")
        if not isinstance(scheme, dict):
            raise FormatError(f"manifest: quantization.classes.{cls} must be an object")
        check_scheme(scheme, f"quantization.classes.{cls}")
    target = _get(obj, "target", str, "top level")
    if target not in C.TARGETS:
        raise FormatError(f"manifest: unknown target {target!r:.40} (known: {list(C.TARGETS)})")
    blobs = tuple(_blob(b, i) for i, b in enumerate(_get(obj, "blobs", list, "top level")))
    tensors = tuple(_tensor(t, i) for i, t in enumerate(_get(obj, "tensors", list, "top level")))
    for kind, names in (("blob", [b.name for b in blobs]), ("tensor", [t.name for t in tensors])):
        if len(set(names)) != len(names):
            raise FormatError(f"manifest: duplicate {kind} names")
    return Manifest(
        format_version=version,
        tensor_alignment=alignment,
        model=model,
        quantization=quantization,
        target=target,
        config=_get(obj, "config", dict, "top level"),
        provenance=_get(obj, "provenance", dict, "top level"),
        blobs=blobs,
        tensors=tensors,
        raw=obj,
    )
