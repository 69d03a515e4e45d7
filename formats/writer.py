"""Streaming, atomic writer of .ninfer v1 files.

The caller declares every tensor up front (names, schemes, part shapes: all known from the config
before any weight is read), so offsets and the manifest's byte length are fixed before the first
tensor arrives. Tensors are then written one at a time in the declared order and hashed as they
go; checksums are fixed-width hex, so close() patches them into the manifest in place. Hashing and
disk writes run on a background thread, one tensor behind the caller, so quantizing the next
tensor overlaps the I/O of this one; memory held is two tensors plus the manifest. The file appears under its final name only after
fsync + rename; any error or interrupt removes the temp file.
"""

from __future__ import annotations

import json
import math
import os
import queue
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash
import zstandard

from . import constants as C
from .compliance import check_compliance
from .errors import FormatError
from .manifest import check_name, parse_manifest
from .quants import PartSpec

_PLACEHOLDER = "0" * C.CHECKSUM_HEX_DIGITS
_ZSTD_LEVEL = 19


@dataclass(frozen=True)
class TensorPlan:
    name: str
    scheme: dict
    logical_shape: tuple[int, ...]
    logical_dtype: str
    parts: tuple[PartSpec, ...]


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _hex(h: int) -> str:
    return f"{h:016x}"


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Raw little-endian bytes of a tensor, without a copy when it is already contiguous on the CPU."""
    t = t.detach().to("cpu").contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def encode_preamble(manifest_len: int, data_offset: int, data_len: int, manifest_hash: int) -> bytes:
    head = struct.pack(
        "<8sIIQQQQQ", C.MAGIC, C.FORMAT_VERSION, C.BYTE_ORDER_MARK, C.PREAMBLE_SIZE, manifest_len, data_offset, data_len, manifest_hash
    )
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


class ArtifactWriter:
    """Write one artifact: `with ArtifactWriter(path, header, blobs, plans) as w: w.write(name, parts)`."""

    def __init__(self, path: str | os.PathLike, header: dict, blobs: dict[str, bytes], plans: list[TensorPlan],
                 alignment: int = C.TENSOR_ALIGNMENT, overwrite: bool = False, compress_blobs: bool = True):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists (pass overwrite/--force to replace it)")
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"output directory {self.path.parent} does not exist")
        self._alignment = alignment
        self._plans = list(plans)
        self._next = 0
        self._offset = 0  # next free byte in the data section
        self._blob_bytes: list[bytes] = []
        self._compress = compress_blobs
        self.manifest = self._build_manifest(header, blobs)
        self._manifest_len = len(self._manifest_json())
        self._data_offset = _align(C.PREAMBLE_SIZE + self._manifest_len, C.SECTION_ALIGNMENT)
        self._data_len = _align(self._offset, C.SECTION_ALIGNMENT)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="ninfer-writer", daemon=True)
        try:
            self._file.seek(self._data_offset)
            for blob, data in zip(self.manifest["blobs"], self._blob_bytes):
                self._put(blob, [memoryview(data)])
        except BaseException:
            self.abort()
            raise
        self._blob_bytes.clear()
        self._thread.start()

    # -- layout --------------------------------------------------------------------------------
    def _reserve(self, length: int) -> int:
        offset = _align(self._offset, self._alignment)
        self._offset = offset + length
        return offset

    def _build_manifest(self, header: dict, blobs: dict[str, bytes]) -> dict:
        blob_entries = []
        for name, raw in blobs.items():
            check_name(name, "blob")
            data = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(raw) if self._compress else raw
            compression = "zstd"
            if not self._compress or len(data) >= len(raw):
                data, compression = raw, "none"
            self._blob_bytes.append(data)
            blob_entries.append({"name": name, "compression": compression, "offset": self._reserve(len(data)),
                                 "length": len(data), "raw_length": len(raw), "checksum": _PLACEHOLDER})
        tensors = []
        for plan in self._plans:
            parts = []
            for spec in plan.parts:
                length = C.DTYPES[spec.dtype][1] * math.prod(spec.shape)
                parts.append({"role": spec.role, "dtype": spec.dtype, "shape": list(spec.shape), "layout": spec.layout,
                              "offset": self._reserve(length), "length": length, "checksum": _PLACEHOLDER})
            tensors.append({"name": plan.name, "scheme": plan.scheme, "logical_shape": list(plan.logical_shape),
                            "logical_dtype": plan.logical_dtype, "parts": parts})
        manifest = {"format_version": C.FORMAT_VERSION, "checksum_algorithm": C.CHECKSUM_ALGORITHM,
                    "tensor_alignment": self._alignment, **header, "blobs": blob_entries, "tensors": tensors}
        check_compliance(parse_manifest(json.loads(self._dump(manifest))))  # refuse what the reader would refuse
        return manifest

    @staticmethod
    def _dump(manifest: dict) -> bytes:
        return json.dumps(manifest, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()

    def _manifest_json(self) -> bytes:
        return self._dump(self.manifest)

    # -- data ----------------------------------------------------------------------------------
    def _put(self, entry: dict, chunks: list[memoryview]) -> None:
        pos = self._file.tell() - self._data_offset
        if entry["offset"] > pos:
            self._file.write(b"\0" * (entry["offset"] - pos))
        h = xxhash.xxh3_64()
        written = 0
        for chunk in chunks:
            h.update(chunk)
            self._file.write(chunk)
            written += len(chunk)
        if written != entry["length"]:
            raise FormatError(f"{entry.get('name', entry.get('role'))}: wrote {written} bytes, planned {entry['length']}")
        entry["checksum"] = _hex(h.intdigest())

    def _drain(self) -> None:
        """Background thread: hash and write queued parts in order; remember the first failure."""
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._put(*item)
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                    self._error = e

    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, name: str, parts: dict[str, torch.Tensor]) -> None:
        """Write the next declared tensor; `parts` maps role -> tensor in the stored (laid-out) form.

        The bytes are written asynchronously: do not modify the tensors after passing them here."""
        self._raise_pending()
        if self._next >= len(self._plans):
            raise FormatError(f"tensor {name!r} was not declared (all {len(self._plans)} are written)")
        plan, entry = self._plans[self._next], self.manifest["tensors"][self._next]
        if name != plan.name:
            raise FormatError(f"expected tensor {plan.name!r} next, got {name!r}")
        if set(parts) != {s.role for s in plan.parts}:
            raise FormatError(f"{name}: parts {sorted(parts)} do not match the plan {[s.role for s in plan.parts]}")
        for spec, part_entry in zip(plan.parts, entry["parts"]):
            t = parts[spec.role]
            if C.DTYPE_NAMES.get(t.dtype) != spec.dtype or tuple(t.shape) != spec.shape:
                raise FormatError(f"{name}.{spec.role}: got {t.dtype} {list(t.shape)}, planned {spec.dtype} {list(spec.shape)}")
            self._queue.put((part_entry, [tensor_bytes(t)]))
        self._next += 1

    # -- finish --------------------------------------------------------------------------------
    def _stop_thread(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def close(self) -> Path:
        self._stop_thread()
        self._raise_pending()
        if self._next != len(self._plans):
            raise FormatError(f"only {self._next} of {len(self._plans)} declared tensors were written")
        pos = self._file.tell() - self._data_offset
        self._file.write(b"\0" * (self._data_len - pos))
        manifest = self._manifest_json()
        if len(manifest) != self._manifest_len:
            raise FormatError(f"manifest changed length while writing ({self._manifest_len} -> {len(manifest)} bytes); "
                              "only fixed-width fields (checksums, sha256 digests) may be filled in late")
        preamble = encode_preamble(len(manifest), self._data_offset, self._data_len, xxhash.xxh3_64_intdigest(manifest))
        self._file.seek(0)
        self._file.write(preamble + manifest + b"\0" * (self._data_offset - C.PREAMBLE_SIZE - len(manifest)))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return self.path

    def abort(self) -> None:
        self._error = self._error or FormatError("aborted")  # the thread skips what is still queued
        if self._thread.ident is not None:
            self._stop_thread()
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.close()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()
