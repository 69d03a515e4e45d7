"""`ninfer-pack verify`: everything that can be wrong with an artifact, as a machine-readable report.

Checks, in order: structure (preamble, manifest, byte ranges, closed set), every checksum and padding
byte, the embedded registry entry against this ninfer's registry, and with a source checkpoint a
tensor-by-tensor numeric check that the dequantized weights lie within the scheme's error bound.
"""

from __future__ import annotations

from pathlib import Path

import torch

import ninfer_registry
from ninfer_format import Artifact, FormatError

from .pack import slab_errors
from .source import SourceError, open_checkpoint


def error_bound(scheme: dict, parts: dict[str, torch.Tensor], ref: torch.Tensor) -> torch.Tensor:
    """Per-element bound on |dequant - ref| that correct quantization never exceeds.

    nvfp4: half the widest grid step (1.0 of the block's decode scale d) plus the saturation excess
    when rounding the E4M3 scale down pushed the block max past 6 d. int: half a step (a full step
    with a rounded zero point) plus the saturation excess from the bf16-rounded scale.
    plain: the rounding of the stored dtype.
    """
    kind = scheme["kind"]
    x = ref.float()
    if kind == "plain":
        return x.abs() * 2.0 ** -8 + 1e-30
    n, k = x.shape
    if kind == "nvfp4":
        d = parts["block_scale"].float() * parts["global_scale"].float()
        amax = x.view(n, k // 16, 16).abs().amax(-1)
        blk = d * 1.0 + (amax - 6.0 * d).clamp(min=0)
        return (blk * (1 + 1e-6) + 1e-30).repeat_interleave(16, dim=1)
    g = scheme["group_size"]
    s = parts["scale"].float()
    amax = x.view(n, k // g, g).abs().amax(-1)
    step = 0.5 if scheme["symmetric"] else 1.0
    blk = s * step + amax * 2.0 ** -7 + 1e-30
    return blk.repeat_interleave(g, dim=1)


def _numeric_check(a: Artifact, source: Path) -> dict:
    ckpt = open_checkpoint(source)
    worst, failures, checked = 0.0, [], 0
    for t in a.manifest.tensors:
        if t.name not in ckpt.tensors:
            failures.append(f"{t.name}: not in the source checkpoint")
            continue
        ref = ckpt.loader(t.name)()
        if tuple(ref.shape) != t.logical_shape:
            failures.append(f"{t.name}: source shape {list(ref.shape)} != artifact {list(t.logical_shape)}")
            continue
        parts = a.logical_parts(t.name)
        ratio, err_max = 0.0, 0.0
        for slab, x, diff in slab_errors(t.scheme, t.logical_shape, parts, ref):
            err = diff.abs()
            if err.numel():
                ratio = max(ratio, float((err / error_bound(t.scheme, slab, x)).max()))
                err_max = max(err_max, float(err.max()))
        worst = max(worst, ratio)
        checked += 1
        if ratio > 1.0:
            failures.append(f"{t.name}: error {err_max:.3g} exceeds the {t.scheme['kind']} bound ({ratio:.2f}x)")
    detail = f"{checked} tensors within bound (worst {worst:.2f} of bound)" if not failures else "; ".join(failures[:5])
    return {"name": "numeric", "ok": not failures, "detail": detail, "problems": failures}


def verify_artifact(path: Path, source: Path | None = None) -> dict:
    checks: list[dict] = []
    report = {"path": str(path), "ok": False, "checks": checks}
    try:
        a = Artifact(path)
    except (FormatError, OSError) as e:
        checks.append({"name": "structure", "ok": False, "detail": str(e), "problems": [str(e)]})
        return report
    with a:
        m = a.manifest
        checks.append({"name": "structure", "ok": True, "problems": [],
                       "detail": f"v{m.format_version}, {len(m.tensors)} tensors, {m.registry_id} {m.quantization['profile']} {m.target}"})
        problems = a.verify()
        checks.append({"name": "checksums", "ok": not problems, "problems": problems,
                       "detail": "all tensor, blob and padding bytes intact" if not problems else "; ".join(problems[:5])})
        try:
            entry = ninfer_registry.load(m.registry_id)
            same = entry.sha256 == m.model["registry_sha256"]
            detail = f"entry {m.registry_id} sha256 {entry.sha256[:12]}… matches" if same else (
                f"artifact was built against a different {m.registry_id} entry "
                f"({m.model['registry_sha256'][:12]}… vs installed {entry.sha256[:12]}…)")
        except ninfer_registry.RegistryError as e:
            same, detail = False, str(e)
        checks.append({"name": "registry", "ok": same, "detail": detail, "problems": [] if same else [detail]})
        if source is not None:
            try:
                checks.append(_numeric_check(a, source))
            except (SourceError, OSError) as e:
                checks.append({"name": "numeric", "ok": False, "detail": str(e), "problems": [str(e)]})
    report["ok"] = all(c["ok"] for c in checks)
    return report
