"""`ninfer-pack MODEL --profile P`: resolve, validate, then stream the checkpoint into an artifact."""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

import ninfer_registry
from ninfer_format.constants import BLOB_NAMES
from ninfer_format.rules import expand

from . import __version__
from .pack import pack
from .prequant import adopt_prequantized
from .source import Checkpoint, open_checkpoint, resolve
from .validate import normalize_config, validate

_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PackOptions:
    model_id: str
    profile: str
    target: str = "sm_120a"
    source: Path | None = None
    revision: str | None = None
    output: Path | None = None
    device: str = "cpu"
    lm_head: str | None = None
    vision: bool = True
    mtp: bool = True
    force: bool = False
    progress: bool = False


def _sha256(path: Path) -> str:
    """The HF cache names LFS blobs by their sha256: reuse that instead of re-reading the file."""
    if path.is_symlink() and _SHA256_NAME.fullmatch(Path(os.readlink(path)).name):
        return Path(os.readlink(path)).name
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def _provenance(ckpt: Checkpoint, source_label: str, pool: ThreadPoolExecutor) -> tuple[dict, Callable[[dict], None]]:
    """Provenance with sha256 placeholders, and a hook that fills them in from hashes computed in
    `pool` while the pack runs (hashing 50 GB of shards up front would cost a whole extra pass)."""
    files = ["config.json", "model.safetensors.index.json", *[s.name for s in ckpt.shards()], *BLOB_NAMES]
    present = [ckpt.root / f for f in dict.fromkeys(files) if (ckpt.root / f).is_file()]
    digests = [pool.submit(_sha256, p) for p in present]
    prov = {
        "ninfer_version": __version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source": source_label,
        "source_files": [{"name": p.name, "bytes": p.stat().st_size, "sha256": "0" * 64} for p in present],
    }

    def fill(manifest: dict) -> None:
        for entry, digest in zip(manifest["provenance"]["source_files"], digests):
            entry["sha256"] = digest.result()

    return prov, fill


def _clean_stale_temps(out: Path) -> None:
    """A killed pack (SIGKILL) cannot clean up after itself; the next one to the same path does."""
    for stale in out.parent.glob(f".{out.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def _validate_options(opts: PackOptions, entry) -> None:
    if opts.target not in entry.targets:  # the registry loader keeps entry targets within the format's
        raise ValueError(f"target {opts.target!r} is not allowed for {entry.id} (allowed: {', '.join(entry.targets)})")
    if opts.profile not in entry.profiles:
        raise ValueError(f"profile {opts.profile!r} is not allowed for {entry.id} (allowed: {', '.join(entry.profiles)})")
    if opts.device not in ("cpu", "cuda") and not opts.device.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {opts.device!r}")
    if opts.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but no CUDA device is available")


def run_pack(opts: PackOptions) -> dict:
    entry = ninfer_registry.load(opts.model_id)
    _validate_options(opts, entry)
    parts = tuple(p for p in entry.available_parts if (p != "vision" or opts.vision) and (p != "mtp" or opts.mtp))
    root = resolve(str(opts.source) if opts.source else opts.model_id, entry.hf_repo, opts.revision)
    ckpt = open_checkpoint(root)
    prequantized = adopt_prequantized(ckpt)
    ckpt.config.pop("quantization_config", None)  # the artifact's manifest says how it is quantized
    normalize_config(ckpt.config, entry)
    validate(ckpt, entry, parts)
    out = opts.output or Path(f"{entry.id}-{opts.profile}-{opts.target}.ninfer")
    if out.exists() and not opts.force:
        raise FileExistsError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.resolve().is_dir():
        raise FileNotFoundError(f"output directory {out.parent} does not exist")
    _clean_stale_temps(out)
    blobs = {name: (root / name).read_bytes() for name in BLOB_NAMES if (root / name).is_file()}
    pool = ThreadPoolExecutor(max_workers=1)
    label = opts.source.as_posix() if opts.source else f"hf:{entry.hf_repo}@{opts.revision or 'main'}"
    provenance, fill_digests = _provenance(ckpt, label, pool)
    wanted = expand(entry.resolved, ckpt.config, parts)
    total = sum(math.prod(t.shape) for t in wanted.values())
    bar = tqdm(total=2 * total, unit="B", unit_scale=True, desc=f"pack {entry.id}", disable=not opts.progress)
    done = [0]

    def progress(p, nbytes: int) -> None:
        done[0] += 1
        bar.update(nbytes)
        bar.set_postfix_str(f"tensor {done[0]}/{len(wanted)} {p.plan.name[-40:]}")

    overrides = {"lm_head": opts.lm_head} if opts.lm_head else None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = pack(entry, ckpt.config, {n: ckpt.loader(n) for n in wanted},
                      {n: ckpt.tensors[n].dtype for n in wanted}, out, profile=opts.profile, target=opts.target,
                      parts=parts, blobs=blobs, provenance=provenance, class_overrides=overrides, device=opts.device,
                      overwrite=opts.force, before_close=fill_digests, progress=progress,
                      prequantized={name: p.load for name, p in prequantized.items()})
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.close()
        pool.shutdown(cancel_futures=True)
    file_bytes = out.stat().st_size
    return {
        "output": str(out), "model": entry.id, "profile": opts.profile, "target": opts.target, "parts": list(parts),
        "tensors": result.tensors, "file_bytes": file_bytes, "bf16_bytes": result.bytes_bf16,
        "compression_vs_bf16": result.bytes_bf16 / max(file_bytes, 1), "seconds": result.seconds,
        "mb_per_s": result.bytes_bf16 / 1e6 / max(result.seconds, 1e-9),
        "error_by_class": {c: {"tensors": s.tensors, "rel_rms": s.rel_rms, "max_abs": s.max_abs} for c, s in result.errors.items()},
        "prequantized_tensors": len(prequantized),
    }


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
