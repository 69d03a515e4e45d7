"""ninfer-run: load a .ninfer artifact and serve it over OpenAI- and Anthropic-compatible HTTP APIs.

    ninfer-run model.ninfer [--port 18080] [--max-context T] [--max-concurrency C] [--spec mtp --draft-tokens N] ...
    ninfer-run check model.ninfer [--checksums]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from ninfer_format import Artifact, FormatError

app = typer.Typer(help="Load a .ninfer artifact and serve it (OpenAI + Anthropic APIs); `check` inspects one.\n\n"
                  "Usage: ninfer-run MODEL.ninfer [options]   (same as `ninfer-run serve MODEL.ninfer ...`)",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

TOOL_STYLES = {"qwen3_5_hybrid": "qwen3_xml", "qwen3_dense": "qwen3_json"}


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


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
        _fail(f"{path}: {err}")
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    typer.echo(f"{path}: {m.registry_id} {m.quantization['profile']} {m.target}, {len(m.tensors)} tensors, "
               f"{total / 2**30:.2f} GiB of weights{', checksums ok' if checksums and not problems else ''}")
    raise typer.Exit(1 if problems else 0)


@app.command()
def serve(
    path: Path = typer.Argument(..., help="a .ninfer file"),
    host: str = typer.Option("127.0.0.1", "--host", help="bind address (loopback by default)"),
    port: int = typer.Option(18080, "--port"),
    max_context: int = typer.Option(32768, "--max-context", help="KV pool size in tokens (the only KV memory)"),
    max_concurrency: int = typer.Option(1, "--max-concurrency", help="sequences decoded together"),
    pending_timeout_ms: int = typer.Option(600_000, "--pending-timeout-ms", help="max wait for admission"),
    max_queued_requests: int = typer.Option(256, "--max-queued-requests",
                                            help="requests waiting for admission beyond this get HTTP 429"),
    prefill_chunk: int = typer.Option(1024, "--prefill-chunk", help="prompt tokens per prefill step"),
    kv_dtype: str = typer.Option("int8", "--kv-dtype", help="int8 (group-64) | bf16"),
    spec: str | None = typer.Option(None, "--spec", help="mtp: speculative decoding with the artifact's MTP head"),
    draft_tokens: int = typer.Option(3, "--draft-tokens", help="drafts per step with --spec mtp"),
    api_key: str | None = typer.Option(None, "--api-key", envvar="NINFER_API_KEY", help="require this key"),
    served_model_name: str | None = typer.Option(None, "--served-model-name", help="model id in the API"),
    device: str = typer.Option("cpu", "--device", help="cpu (reference path); GPU kernels arrive with the GPU issue"),
) -> None:
    """Serve an artifact over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/models) and Anthropic
    (/v1/messages, /v1/messages/count_tokens) APIs, /health and Prometheus /metrics."""
    import uvicorn

    from .chat import Chat
    from .engine import EngineConfig, build_engine
    from .loader import load
    from .server.app import create_app

    if spec not in (None, "mtp"):
        _fail(f"--spec must be mtp, got {spec!r}")
    if kv_dtype not in ("int8", "bf16"):
        _fail(f"--kv-dtype must be int8 or bf16, got {kv_dtype!r}")
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        typer.echo(f"warning: serving on {host} without --api-key: anyone who can reach it can use it", err=True)
    try:
        loaded = load(path, device=device)
        chat = Chat.from_artifact(loaded.artifact)
    except (FormatError, OSError, ValueError) as err:
        _fail(f"{path}: {err}")
    config = EngineConfig(max_context=max_context, max_concurrency=max_concurrency, prefill_chunk=prefill_chunk,
                          pending_timeout_ms=pending_timeout_ms, draft_tokens=draft_tokens if spec else 0,
                          max_queued=max_queued_requests)
    try:
        engine = build_engine(loaded.model, config, kv_dtype=kv_dtype)
    except ValueError as err:
        _fail(str(err))
    vocab = chat.tokenizer.get_vocab()
    eos = [t for t in (chat.special_tokens.get("eos_token"), "<|im_end|>", "<|endoftext|>") if t in vocab]
    stop_ids = tuple(dict.fromkeys(vocab[t] for t in eos))
    name = served_model_name or loaded.artifact.manifest.registry_id
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = create_app(engine, chat, name, TOOL_STYLES[loaded.family], stop_ids, api_key)
    uvicorn.run(server, host=host, port=port, log_level="info")


_COMMANDS = {"check", "serve", "--help", "-h"}


def main() -> None:
    """Entry point: `ninfer-run MODEL.ninfer ...` is shorthand for `ninfer-run serve MODEL.ninfer ...`."""
    argv = sys.argv[1:]
    if argv and argv[0] not in _COMMANDS and not argv[0].startswith("-"):
        argv = ["serve", *argv]
    app(args=argv, prog_name="ninfer-run")
