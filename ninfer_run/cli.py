"""ninfer-run: load a .ninfer artifact and serve it (the engine lands with the runtime issues)."""

from __future__ import annotations

from pathlib import Path

import typer

from ninfer_format import Artifact, FormatError

app = typer.Typer(help="Load a .ninfer artifact and serve it over OpenAI / Anthropic HTTP APIs.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command()
def check(path: Path = typer.Argument(..., help="a .ninfer file"),
          checksums: bool = typer.Option(False, "--checksums", help="also hash every tensor")) -> None:
    """Open an artifact the way the server will (mmap, closed-set check) and report what it holds."""
    try:
        with Artifact(path) as a:
            m = a.manifest
            problems = a.verify() if checksums else []
            total = sum(p.length for t in m.tensors for p in t.parts)
    except (FormatError, OSError) as err:
        typer.echo(f"error: {path}: {err}", err=True)
        raise typer.Exit(1) from None
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    typer.echo(f"{path}: {m.registry_id} {m.quantization['profile']} {m.target}, {len(m.tensors)} tensors, "
               f"{total / 2**30:.2f} GiB of weights{', checksums ok' if checksums and not problems else ''}")
    raise typer.Exit(1 if problems else 0)
