"""Find a checkpoint (local folder or the Hugging Face cache) and index its tensors as lazy thunks.

Only safetensors are read (never pickle). The index is cross-checked against the shards' own
headers before any tensor is loaded: a missing shard, a tensor listed in the wrong shard, or a
shard whose header lies is reported by name.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ninfer_format.constants import BLOB_NAMES

ALLOW_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "hf_quant_config.json", *BLOB_NAMES]
_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
_MAX_HEADER = 100_000_000


class SourceError(ValueError):
    """The checkpoint cannot be found or its files are inconsistent."""


@dataclass(frozen=True)
class SourceTensor:
    name: str
    shard: Path
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass
class Checkpoint:
    root: Path
    config: dict
    tensors: dict[str, SourceTensor]

    def loader(self, name: str) -> Callable[[], torch.Tensor]:
        t = self.tensors[name]

        def load() -> torch.Tensor:
            with safe_open(t.shard, framework="pt") as f:
                return f.get_tensor(name)

        return load

    def shards(self) -> list[Path]:
        return sorted({t.shard for t in self.tensors.values()})


def resolve(model_or_dir: str, hf_repo: str, revision: str | None = None) -> Path:
    """A local folder as is; otherwise the registry's HF repo through huggingface_hub (cache / offline aware)."""
    p = Path(model_or_dir)
    if p.is_dir():
        return p
    if not hf_repo:
        raise SourceError(f"{model_or_dir}: no local folder, and the registry entry names no Hugging Face repo")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(hf_repo, revision=revision, allow_patterns=ALLOW_PATTERNS))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise SourceError(f"cannot get {hf_repo}{'@' + revision if revision else ''} "
                          f"({'offline, not in the HF cache' if offline else type(e).__name__}: {e})".strip()) from None


def read_header(path: Path) -> dict[str, dict]:
    """Parse a safetensors header strictly (length, JSON, offsets inside the file, sizes match dtypes)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SourceError(f"{path.name}: truncated safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise SourceError(f"{path.name}: header length {n} is beyond the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SourceError(f"{path.name}: safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise SourceError(f"{path.name}: safetensors header is not an object")
    header.pop("__metadata__", None)
    for name, info in header.items():
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            start, end = info["data_offsets"]
            numel = 1
            for d in info["shape"]:
                numel *= d
        except (KeyError, TypeError, ValueError):
            raise SourceError(f"{path.name}: tensor {name!r} has a malformed header entry") from None
        if not (0 <= start <= end and 8 + n + end <= size) or end - start != numel * dtype.itemsize:
            raise SourceError(f"{path.name}: tensor {name!r} byte range [{start}, {end}) does not fit "
                              f"{info['dtype']} {info['shape']} inside the file (header lies or file is truncated)")
    return header


def open_checkpoint(root: Path) -> Checkpoint:
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise SourceError(f"{root}: no config.json")
    try:
        config = json.loads(cfg_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(f"{cfg_path}: not valid JSON ({e})") from None
    index_path = root / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (KeyError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SourceError(f"{index_path.name}: not a safetensors index ({e})") from None
    else:
        single = root / "model.safetensors"
        if not single.is_file():
            raise SourceError(f"{root}: no model.safetensors and no model.safetensors.index.json")
        weight_map = {name: single.name for name in read_header(single)}
    shard_names = sorted(set(weight_map.values()))
    missing = [s for s in shard_names if not (root / s).is_file()]
    if missing:
        raise SourceError(f"{root}: missing shard file(s) {missing} named by the index")
    tensors: dict[str, SourceTensor] = {}
    for shard in shard_names:
        header = read_header(root / shard)
        listed = {n for n, s in weight_map.items() if s == shard}
        absent = sorted(listed - set(header))
        if absent:
            raise SourceError(f"{shard}: the index lists {absent[:3]} here but the shard does not hold them")
        for name in listed:
            info = header[name]
            tensors[name] = SourceTensor(name, root / shard, _ST_DTYPES[info["dtype"]], tuple(info["shape"]))
    return Checkpoint(root, config, tensors)
