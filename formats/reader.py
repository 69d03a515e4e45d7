"""mmap reader of .ninfer v1 files: strict validation on open, zero-copy torch views of every part.

open() checks the preamble (magic, version, byte order, its own hash), the exact file size, the
manifest hash and schema, every byte range (aligned, inside the data section, non-overlapping) and
the closed set (compliance.py). Tensor checksums and the zero padding are checked by verify(), or per
tensor with `check=True`, because hashing 20 GB on every start is not free.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash
import zstandard

from . import constants as C
from .compliance import check_compliance
from .errors import ChecksumMismatch, FormatError, Truncated, UnsupportedVersion
from .layouts import undo_layout
from .manifest import Blob, Manifest, Part, TensorEntry, parse_manifest
from .quants import dequantize, part_specs


@dataclass(frozen=True)
class Preamble:
    version: int
    manifest_offset: int
    manifest_length: int
    data_offset: int
    data_length: int
    manifest_hash: int


def _decode_preamble(raw: bytes, file_size: int) -> Preamble:
    if len(raw) < C.PREAMBLE_SIZE:
        raise Truncated(f"file is {len(raw)} bytes, shorter than the {C.PREAMBLE_SIZE}-byte preamble")
    magic, version, bom, m_off, m_len, d_off, d_len, m_hash, p_hash = struct.unpack("<8sIIQQQQQQ", raw[: C.PREAMBLE_SIZE])
    if magic != C.MAGIC:
        raise FormatError(f"not a .ninfer file (magic {magic!r})")
    if bom != C.BYTE_ORDER_MARK:
        raise FormatError(f"byte-order mark {bom:#010x} is not {C.BYTE_ORDER_MARK:#010x} (not little-endian v1)")
    if version not in C.SUPPORTED_VERSIONS:
        raise UnsupportedVersion(f"format version {version} is not supported (this reader knows {list(C.SUPPORTED_VERSIONS)})")
    if xxhash.xxh3_64_intdigest(raw[:56]) != p_hash:
        raise ChecksumMismatch("preamble checksum mismatch (header bytes 0-55 are corrupt)")
    if m_off != C.PREAMBLE_SIZE:
        raise FormatError(f"manifest offset {m_off} must be {C.PREAMBLE_SIZE}")
    if m_len > C.MAX_MANIFEST_BYTES:
        raise FormatError(f"manifest length {m_len} exceeds the {C.MAX_MANIFEST_BYTES}-byte limit")
    if d_off % C.SECTION_ALIGNMENT or d_len % C.SECTION_ALIGNMENT or d_off < m_off + m_len:
        raise FormatError(f"data section [{d_off}, +{d_len}) is misaligned or overlaps the manifest")
    if d_off + d_len != file_size:
        raise Truncated(f"file is {file_size} bytes but its preamble describes {d_off + d_len} (truncated or padded)")
    return Preamble(version, m_off, m_len, d_off, d_len, m_hash)


def _strict_object(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise FormatError(f"manifest: duplicate JSON key {key!r:.60}")
        obj[key] = value
    return obj


def _reject_constant(name):
    raise FormatError(f"manifest: JSON constant {name} is not allowed")


def decode_manifest(raw: bytes) -> Manifest:
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_strict_object, parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise FormatError(f"manifest is not valid UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"manifest is not valid JSON: {e.msg} at byte {e.pos}") from None
    except RecursionError:
        raise FormatError("manifest JSON is nested too deeply") from None
    return parse_manifest(obj)


def _check_ranges(m: Manifest, data_length: int) -> list[tuple[int, int, str]]:
    ranges = [(b.offset, b.end, f"blob {b.name}") for b in m.blobs]
    ranges += [(p.offset, p.end, f"tensor {t.name}.{p.role}") for t in m.tensors for p in t.parts]
    ranges.sort()
    prev_end, prev_name = 0, "start of data"
    for start, end, name in ranges:
        if start % m.tensor_alignment:
            raise FormatError(f"{name} offset {start} is not {m.tensor_alignment}-byte aligned")
        if end > data_length:
            raise FormatError(f"{name} [{start}, {end}) runs past the data section ({data_length} bytes)")
        if start < prev_end:
            raise FormatError(f"{name} [{start}, {end}) overlaps {prev_name}")
        prev_end, prev_name = end, name
    return ranges


class Artifact:
    """An open .ninfer file. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mm = None
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.preamble = _decode_preamble(f.read(C.PREAMBLE_SIZE), size)
            raw = f.read(self.preamble.manifest_length)
            if len(raw) != self.preamble.manifest_length:
                raise Truncated("manifest is truncated")
            if xxhash.xxh3_64_intdigest(raw) != self.preamble.manifest_hash:
                raise ChecksumMismatch("manifest checksum mismatch (manifest bytes are corrupt)")
            self.manifest = decode_manifest(raw)
            if self.manifest.format_version != self.preamble.version:
                raise FormatError(f"manifest says version {self.manifest.format_version}, preamble {self.preamble.version}")
            self._ranges = _check_ranges(self.manifest, self.preamble.data_length)
            check_compliance(self.manifest)
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._tensors = {t.name: t for t in self.manifest.tensors}
        self._blobs = {b.name: b for b in self.manifest.blobs}

    # -- access --------------------------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def entry(self, name: str) -> TensorEntry:
        if name not in self._tensors:
            raise KeyError(f"{self.path.name} has no tensor {name!r}")
        return self._tensors[name]

    def _bytes(self, offset: int, length: int) -> memoryview:
        start = self.preamble.data_offset + offset
        return memoryview(self._mm)[start : start + length]

    def _check(self, what: str, offset: int, length: int, checksum: str) -> None:
        if f"{xxhash.xxh3_64_intdigest(self._bytes(offset, length)):016x}" != checksum:
            raise ChecksumMismatch(f"{what}: checksum mismatch (stored bytes are corrupt)")

    def part(self, p: Part, check: bool = False, what: str = "") -> torch.Tensor:
        """Zero-copy view of one stored part (copy-on-write mapping: writes never reach the file)."""
        if check:
            self._check(what or p.role, p.offset, p.length, p.checksum)
        dtype = C.DTYPES[p.dtype][0]
        if p.length == 0:
            return torch.empty(p.shape, dtype=dtype)
        flat = torch.frombuffer(self._mm, dtype=torch.uint8, count=p.length, offset=self.preamble.data_offset + p.offset)
        return flat.view(dtype).reshape(p.shape)

    def stored_parts(self, name: str, check: bool = False) -> dict[str, torch.Tensor]:
        t = self.entry(name)
        return {p.role: self.part(p, check, f"tensor {name}.{p.role}") for p in t.parts}

    def logical_parts(self, name: str, check: bool = False) -> dict[str, torch.Tensor]:
        """Parts with the target layout undone (row-major), as the reference dequantizer expects."""
        t = self.entry(name)
        linear = {s.role: s.shape for s in part_specs(t.scheme, t.logical_shape, t.logical_dtype, "linear")}
        return {p.role: undo_layout(p.layout, self.part(p, check, f"tensor {name}.{p.role}"), linear[p.role]) for p in t.parts}

    def dequantized(self, name: str, check: bool = False) -> torch.Tensor:
        t = self.entry(name)
        return dequantize(t.scheme, t.logical_shape, self.logical_parts(name, check))

    def blob(self, name: str) -> bytes:
        """A blob's decompressed bytes, checksum-verified (blobs are small)."""
        if name not in self._blobs:
            raise KeyError(f"{self.path.name} has no blob {name!r}")
        b: Blob = self._blobs[name]
        self._check(f"blob {name}", b.offset, b.length, b.checksum)
        data = bytes(self._bytes(b.offset, b.length))
        if b.compression == "zstd":
            try:
                data = zstandard.ZstdDecompressor().decompress(data, max_output_size=b.raw_length)
            except zstandard.ZstdError as e:
                raise FormatError(f"blob {name}: zstd data is invalid: {e}") from None
        if len(data) != b.raw_length:
            raise FormatError(f"blob {name}: decoded {len(data)} bytes, manifest says {b.raw_length}")
        return data

    def has_blob(self, name: str) -> bool:
        return name in self._blobs

    # -- verification --------------------------------------------------------------------------
    def verify(self) -> list[str]:
        """Every checksum, blob decoding and padding byte; returns the problems found (empty = sound)."""
        problems: list[str] = []
        for b in self.manifest.blobs:
            try:
                self.blob(b.name)
            except FormatError as e:
                problems.append(str(e))
        for t in self.manifest.tensors:
            for p in t.parts:
                try:
                    self._check(f"tensor {t.name}.{p.role}", p.offset, p.length, p.checksum)
                except ChecksumMismatch as e:
                    problems.append(str(e))
        problems += self._padding_problems()
        return problems

    def _padding_problems(self) -> list[str]:
        gaps = [(C.PREAMBLE_SIZE + self.preamble.manifest_length, self.preamble.data_offset, "manifest padding")]
        prev = 0
        for start, end, name in self._ranges:
            gaps.append((self.preamble.data_offset + prev, self.preamble.data_offset + start, f"padding before {name}"))
            prev = end
        gaps.append((self.preamble.data_offset + prev, self.preamble.data_offset + self.preamble.data_length, "final padding"))
        view = memoryview(self._mm)
        return [f"{what}: non-zero bytes in [{a}, {b})" for a, b, what in gaps if b > a and any(view[a:b])]

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # torch views still alive; the mapping closes when they are collected
            self._mm = None

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_artifact(path: str | os.PathLike) -> Artifact:
    return Artifact(path)
