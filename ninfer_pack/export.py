"""`ninfer-pack export model.ninfer --to compressed-tensors DIR`: a Hugging Face checkpoint in the
compressed-tensors format, which vLLM loads for tensor-parallel serving on several GPUs.

The artifact's quantized bytes are written as they are (no re-quantization), with the target layout
undone (compressed-tensors stores scales row-major):
    nvfp4 -> `nvfp4-pack-quantized`: weight_packed u8 [N, K/2], weight_scale f8_e4m3 [N, K/16],
             weight_global_scale f32 [1] = 1 / s2 (compressed-tensors keeps the *encode* direction)
    int4  -> `pack-quantized`: weight_packed i32 [N, K/8] (already in this packing), weight_scale,
             weight_zero_point i32 [ceil(N/8), K/G] (asymmetric), weight_shape i64 [2]
    int8  -> `pack-quantized` too: four offset-binary bytes per i32 word (vLLM's WNA16 path reads 4 and 8 bits)
Every other tensor keeps its name and dtype. Each quantization scheme is one config group whose
targets are the exact module names; plain Linear modules are listed under `ignore`. Shards are
written one at a time (memory stays bounded by the shard size) into a temporary folder that is
renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from ninfer_format import Artifact
from ninfer_format.constants import BLOB_NAMES
from ninfer_format.quants import pack_int32

CT_VERSION = "0.20.1"  # the compressed-tensors release whose schema the config follows (checked in tests)


@dataclass
class ExportResult:
    out: Path
    tensors: int
    shards: int
    bytes: int
    formats: list[str]


def _weights_args(scheme: dict) -> dict:
    if scheme["kind"] == "nvfp4":
        return {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
                "dynamic": False, "observer": "minmax", "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": None}
    return {"num_bits": scheme["bits"], "type": "int", "strategy": "group", "group_size": scheme["group_size"],
            "symmetric": scheme["symmetric"], "dynamic": False, "observer": "minmax"}


def _format(scheme: dict) -> str:
    return "nvfp4-pack-quantized" if scheme["kind"] == "nvfp4" else "pack-quantized"


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def quantization_config(artifact: Artifact) -> dict | None:
    """The config.json `quantization_config`: one group per scheme, exact module names as targets."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    ignore = []
    for t in artifact.manifest.tensors:
        if t.scheme["kind"] == "plain":
            if len(t.logical_shape) == 2 and t.name.endswith(".weight"):
                ignore.append(_module(t.name))
            continue
        key = json.dumps(t.scheme, sort_keys=True)
        groups.setdefault(key, (t.scheme, []))[1].append(_module(t.name))
    if not groups:
        return None
    config_groups = {f"group_{i}": {"targets": names, "weights": _weights_args(scheme), "input_activations": None,
                                    "output_activations": None, "format": _format(scheme)}
                     for i, (scheme, names) in enumerate(groups.values())}
    formats = sorted({g["format"] for g in config_groups.values()})
    return {"quant_method": "compressed-tensors", "format": formats[0] if len(formats) == 1 else "mixed-precision",
            "quantization_status": "compressed", "config_groups": config_groups, "ignore": sorted(ignore),
            "kv_cache_scheme": None, "global_compression_ratio": None, "sparsity_config": {}, "transform_config": {},
            "version": CT_VERSION}


def export_tensors(artifact: Artifact, name: str) -> dict[str, torch.Tensor]:
    """One artifact tensor as compressed-tensors names it (row-major, no re-quantization)."""
    t = artifact.entry(name)
    parts = artifact.logical_parts(name)
    kind, module = t.scheme["kind"], _module(name)
    if kind == "plain":
        return {name: parts["data"]}
    if kind == "nvfp4":
        return {f"{module}.weight_packed": parts["qweight"], f"{module}.weight_scale": parts["block_scale"],
                f"{module}.weight_global_scale": (1.0 / parts["global_scale"].float()).reshape(1)}
    bits, (n, k) = t.scheme["bits"], t.logical_shape
    out = {f"{module}.weight_packed": parts["qweight"] if bits == 4 else pack_int32(parts["qweight"], 8, dim=1),
           f"{module}.weight_scale": parts["scale"],
           f"{module}.weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if "zero_point" in parts:
        zp = parts["zero_point"]
        out[f"{module}.weight_zero_point"] = zp if bits == 4 else pack_int32(zp, 8, dim=0)
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export_compressed_tensors(path: Path, out: Path, shard_bytes: int = 4 << 30, force: bool = False) -> ExportResult:
    """Write `out` (a folder) atomically: nothing appears there unless the whole export succeeds."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    if not out.parent.resolve().is_dir():
        raise FileNotFoundError(f"output directory {out.parent} does not exist")
    with Artifact(path) as artifact:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            result = _write(artifact, tmp, shard_bytes)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    _fsync_dir(out.parent)
    result.out = out
    return result


def _write(artifact: Artifact, tmp: Path, shard_bytes: int) -> ExportResult:
    m = artifact.manifest
    config = dict(m.config)
    qc = quantization_config(artifact)
    if qc is not None:
        config["quantization_config"] = qc
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    for blob in BLOB_NAMES:
        if artifact.has_blob(blob):
            (tmp / blob).write_bytes(artifact.blob(blob))
    shards: list[list[str]] = []
    weight_map: dict[str, int] = {}
    pending: dict[str, torch.Tensor] = {}
    size, total = 0, 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            shard = tmp / f"shard-{len(shards):05d}.safetensors"
            save_file(pending, shard, metadata={"format": "pt"})
            with open(shard, "rb+") as f:
                os.fsync(f.fileno())
            shards.append(list(pending))
            pending, size = {}, 0

    for name in artifact.tensor_names:
        tensors = export_tensors(artifact, name)
        nbytes = sum(x.numel() * x.element_size() for x in tensors.values())
        if size and size + nbytes > shard_bytes:
            flush()
        for key, x in tensors.items():
            pending[key] = x.contiguous()
            weight_map[key] = len(shards)
        size += nbytes
        total += nbytes
    flush()
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for i, name in enumerate(names):
        (tmp / f"shard-{i:05d}.safetensors").rename(tmp / name)
    index = {"metadata": {"total_size": total}, "weight_map": {k: names[i] for k, i in sorted(weight_map.items())}}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    formats = sorted({g["format"] for g in qc["config_groups"].values()}) if qc else []
    return ExportResult(tmp, len(weight_map), len(shards), total, formats)
