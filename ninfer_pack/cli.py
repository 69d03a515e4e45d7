"""ninfer-pack: compile a registered Hugging Face checkpoint into a .ninfer artifact, and inspect/verify one.

Only this module prints or exits; everything below it raises typed errors.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

import ninfer_registry
from ninfer_format import Artifact, FormatError

from .build import PackOptions, run_pack
from .verify import verify_artifact

app = typer.Typer(
    help="Compile registered Hugging Face checkpoints into .ninfer artifacts; inspect and verify them.\n\n"
    "Usage: ninfer-pack MODEL_ID --profile nvfp4 [...]   (same as `ninfer-pack pack MODEL_ID ...`)",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


@app.command("pack")
def pack_cmd(
    model_id: str = typer.Argument(..., help="registry id (see `ninfer-pack list`), e.g. qwen3.8-27b"),
    profile: str = typer.Option(..., "--profile", "-p", help="nvfp4 | int4 | int4-asym | int8 | bf16"),
    target: str = typer.Option("sm_120a", "--target", "-t", help="sm_120a (RTX 5090) | sm_90a (H100/H200) | linear"),
    source: Path | None = typer.Option(None, "--source", help="local checkpoint folder (else the HF cache / hub)"),
    revision: str | None = typer.Option(None, "--revision", help="HF revision (branch, tag or commit)"),
    output: Path | None = typer.Option(None, "-o", "--output", help="output file [MODEL-PROFILE-TARGET.ninfer]"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda: where to quantize (same bytes either way)"),
    lm_head: str | None = typer.Option(None, "--lm-head", help="scheme for lm_head (default: the profile's, bf16)"),
    vision: bool = typer.Option(True, "--vision/--no-vision", help="pack the vision tower when the model has one"),
    mtp: bool = typer.Option(True, "--mtp/--no-mtp", help="pack the MTP draft head when the model has one"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output file"),
    as_json: bool = typer.Option(False, "--json", help="no progress bar; print a JSON summary"),
) -> None:
    """Compile a registered checkpoint into one .ninfer file (streaming, atomic, verified on the way)."""
    opts = PackOptions(model_id=model_id, profile=profile, target=target, source=source, revision=revision,
                       output=output, device=device, lm_head=lm_head, vision=vision, mtp=mtp, force=force,
                       progress=not as_json and sys.stderr.isatty())
    try:
        summary = run_pack(opts)
    except KeyboardInterrupt:
        _fail("interrupted; no output was written", 130)
    except Exception as err:  # noqa: BLE001 - the CLI boundary: one line, never a traceback
        _fail(str(err) or type(err).__name__)
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    typer.echo(f"wrote {summary['output']}: {_human_bytes(summary['file_bytes'])} "
               f"({summary['compression_vs_bf16']:.2f}x smaller than bf16), {summary['tensors']} tensors "
               f"in {summary['seconds']:.1f} s ({summary['mb_per_s']:.0f} MB/s of bf16 input)")
    for cls, stats in sorted(summary["error_by_class"].items()):
        typer.echo(f"  {cls:<14} {stats['tensors']:>5} tensors  rel RMS error {stats['rel_rms']:.4f}  "
                   f"max abs error {stats['max_abs']:.3g}")


@app.command("list")
def list_models(
    all_: bool = typer.Option(False, "--all", help="include test-only entries (tiny fixtures)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """List the registered models (the closed set ninfer-pack accepts)."""
    entries = [ninfer_registry.load(i) for i in ninfer_registry.ids(include_test_only=all_)]
    if as_json:
        typer.echo(json.dumps([{"id": e.id, "family": e.family, "display_name": e.display_name, "hf_repo": e.hf_repo,
                                "profiles": e.profiles, "targets": e.targets, "test_only": e.test_only} for e in entries],
                              indent=1))
        return
    typer.echo(f"{'ID':<16} {'FAMILY':<16} {'PROFILES':<34} HF REPO")
    for e in entries:
        typer.echo(f"{e.id:<16} {e.family:<16} {','.join(e.profiles):<34} {e.hf_repo or '-'}")


@app.command()
def show(model_id: str = typer.Argument(..., help="registry id, e.g. qwen3.8-27b"),
         as_json: bool = typer.Option(False, "--json", help="print the resolved entry as JSON")) -> None:
    """Show one registry entry: required config values, parts, tensor count and sizes."""
    from ninfer_format.rules import expand

    try:
        e = ninfer_registry.load(model_id)
    except ninfer_registry.RegistryError as err:
        _fail(str(err))
    if as_json:
        typer.echo(json.dumps(e.resolved, indent=1))
        return
    expected = expand(e.resolved, e.expected_config(), e.available_parts)
    params: dict[str, int] = {}
    for t in expected.values():
        params[t.part] = params.get(t.part, 0) + math.prod(t.shape)
    typer.echo(f"{e.id}  ({e.display_name})  family={e.family}  sha256={e.sha256[:16]}")
    typer.echo(f"  hf: {e.hf_repo or '-'}  model_type={e.hf_model_type}  architectures={', '.join(e.hf_architectures)}")
    typer.echo(f"  profiles: {', '.join(e.profiles)}   targets: {', '.join(e.targets)}")
    typer.echo(f"  tensors: {len(expected)}   " + "   ".join(f"{p}: {n / 1e9:.3f} B params" for p, n in params.items()))
    typer.echo("  required config:")
    for key, value in e.config.items():
        typer.echo(f"    {key} = {json.dumps(value)}")
    for key, values in e.config_optional.items():
        typer.echo(f"    {key} (optional) in {json.dumps(values)}")


@app.command()
def inspect(path: Path = typer.Argument(..., help="a .ninfer file"),
            as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
            tensors: bool = typer.Option(False, "--tensors", help="list every tensor")) -> None:
    """Print an artifact's header, provenance and tensor table (checks structure, not checksums)."""
    try:
        with Artifact(path) as a:
            m = a.manifest
            rows = [{"name": t.name, "scheme": t.scheme["kind"], "shape": list(t.logical_shape),
                     "bytes": sum(p.length for p in t.parts)} for t in m.tensors]
            summary = {
                "path": str(path), "file_bytes": path.stat().st_size, "format_version": m.format_version,
                "registry_id": m.registry_id, "family": m.model["family"], "registry_sha256": m.model["registry_sha256"],
                "parts": list(m.parts_included), "profile": m.quantization["profile"], "target": m.target,
                "tensors": len(m.tensors), "blobs": [b.name for b in m.blobs], "provenance": m.provenance,
            }
    except (FormatError, OSError) as err:
        _fail(f"{path}: {err}")
    if as_json:
        typer.echo(json.dumps({**summary, "tensor_table": rows}, indent=1))
        return
    for key in ("path", "format_version", "registry_id", "family", "profile", "target", "parts", "tensors", "blobs"):
        typer.echo(f"{key:>16}: {summary[key]}")
    typer.echo(f"{'file size':>16}: {_human_bytes(summary['file_bytes'])}")
    prov = summary["provenance"]
    typer.echo(f"{'built':>16}: {prov.get('created_utc', '?')} by ninfer {prov.get('ninfer_version', '?')} "
               f"from {prov.get('source', '?')} ({len(prov.get('source_files', []))} source files)")
    by_scheme: dict[str, list[int]] = {}
    for r in rows:
        agg = by_scheme.setdefault(r["scheme"], [0, 0])
        agg[0] += 1
        agg[1] += r["bytes"]
    for scheme, (count, nbytes) in sorted(by_scheme.items()):
        typer.echo(f"{'scheme ' + scheme:>16}: {count} tensors, {_human_bytes(nbytes)}")
    if tensors:
        for r in rows:
            typer.echo(f"  {r['name']:<64} {r['scheme']:<6} {str(r['shape']):<18} {_human_bytes(r['bytes'])}")


@app.command()
def verify(path: Path = typer.Argument(..., help="a .ninfer file"),
           as_json: bool = typer.Option(False, "--json", help="machine-readable report on stdout"),
           source: Path | None = typer.Option(None, "--source", help="checkpoint folder: also check the numbers")) -> None:
    """Check an artifact for CI: structure, every checksum and padding byte, registry compliance
    (and with --source, dequantized weights vs the checkpoint). Exit 0 only if nothing is wrong."""
    report = verify_artifact(path, source)
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        for check in report["checks"]:
            typer.echo(f"[{'ok' if check['ok'] else 'FAIL':>4}] {check['name']}: {check['detail']}")
        typer.echo(f"{path}: {'OK' if report['ok'] else 'DEFECTIVE'}")
    raise typer.Exit(0 if report["ok"] else 1)


@app.command()
def export(path: Path = typer.Argument(..., help="a .ninfer file"),
           to: str = typer.Option(..., "--to", help="compressed-tensors (the Hugging Face format vLLM loads)"),
           out: Path = typer.Argument(..., help="output folder (a Hugging Face checkpoint)"),
           shard_mib: int = typer.Option(4096, "--shard-mib", min=1, help="safetensors shard size, MiB"),
           force: bool = typer.Option(False, "--force", help="replace an existing output folder"),
           as_json: bool = typer.Option(False, "--json", help="print a JSON summary")) -> None:
    """Export an artifact as a Hugging Face checkpoint in the compressed-tensors format (for vLLM's
    tensor-parallel serving): the quantized bytes as they are, no re-quantization."""
    from .export import export_compressed_tensors

    if to != "compressed-tensors":
        _fail(f"--to must be compressed-tensors, got {to!r}")
    try:
        r = export_compressed_tensors(path, out, shard_bytes=shard_mib << 20, force=force)
    except (FormatError, OSError, ValueError) as err:
        _fail(str(err))
    summary = {"output": str(r.out), "tensors": r.tensors, "shards": r.shards, "bytes": r.bytes, "formats": r.formats}
    typer.echo(json.dumps(summary, indent=1) if as_json else
               f"{r.out}: {r.tensors} tensors in {r.shards} shards, {_human_bytes(r.bytes)}, "
               f"format {', '.join(r.formats) or 'dense (no quantization_config)'}")


_COMMANDS = {"list", "show", "inspect", "verify", "pack", "export", "--help", "-h"}


def main() -> None:
    """Entry point: `ninfer-pack MODEL_ID ...` is shorthand for `ninfer-pack pack MODEL_ID ...`."""
    argv = sys.argv[1:]
    if argv and argv[0] not in _COMMANDS and not argv[0].startswith("-"):
        argv = ["pack", *argv]
    app(args=argv, prog_name="ninfer-pack")
