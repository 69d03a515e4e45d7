"""ninfer-run: load a .ninfer artifact and serve it over OpenAI- and Anthropic-compatible HTTP APIs.

    ninfer-run model.ninfer [--port 18080] [--max-context T] [--max-concurrency C] [--spec mtp --draft-tokens N] ...
    ninfer-run plan model.ninfer --gpu-mem 32GiB [--max-context T] [--max-concurrency C] [--median-prompt P] ...
    ninfer-run check model.ninfer [--checksums]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from ninfer_format import Artifact, FormatError

app = typer.Typer(help="Load a .ninfer artifact and serve it (OpenAI + Anthropic APIs); `plan` sizes its memory; "
                  "`check` inspects one.\n\n"
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


# options shared by `serve` and `plan`: the planner reads exactly the configuration the server would run
_MAX_CONTEXT = typer.Option(32768, "--max-context", help="KV pool size in tokens (the only KV memory)")
_MAX_CONCURRENCY = typer.Option(1, "--max-concurrency", help="sequences decoded together")
_PREFILL_CHUNK = typer.Option(None, "--prefill-chunk", help="prompt tokens per prefill step (default: 8192 on a GPU, "
                              "what the H200 prefill figures were measured with; 1024 on the CPU path)")
_KV_DTYPE = typer.Option("int8", "--kv-dtype", help="int8 (group-64) | bf16")
_SPEC = typer.Option(None, "--spec", help="mtp: speculative decoding with the artifact's MTP head")
_DRAFT_TOKENS = typer.Option(3, "--draft-tokens", help="drafts per step with --spec mtp")
_SPEC_MAX_BATCH = typer.Option(1, "--spec-max-batch", min=1,
                               help="speculate while at most this many sequences decode (beyond: plain batched steps)")
_MAX_FRONTIERS = typer.Option(32, "--max-frontiers", help="prefix-cache frontiers kept (GDN snapshots)")
_CUDA_GRAPHS = typer.Option(None, "--cuda-graphs/--no-cuda-graphs",
                            help="replay plain decode steps from CUDA graphs (default: on with a CUDA device)")
_WARM_UP = typer.Option(None, "--warm-up/--no-warm-up",
                        help="run a throwaway 2-chunk prompt, a next turn on its prefix and (with --max-concurrency C) C "
                             "requests together before serving, so kernels compile and graphs are captured at "
                             "start-up, not in the first requests (default: on with a CUDA device)")


def _default_chunk(prefill_chunk: int | None, device: str) -> int:
    return prefill_chunk or (8192 if device.startswith("cuda") else 1024)


def _engine_config(max_context: int, max_concurrency: int, prefill_chunk: int, kv_dtype: str, spec: str | None,
                   draft_tokens: int, max_frontiers: int, **rest):
    from .engine import EngineConfig

    if spec not in (None, "mtp"):
        _fail(f"--spec must be mtp, got {spec!r}")
    if kv_dtype not in ("int8", "bf16"):
        _fail(f"--kv-dtype must be int8 or bf16, got {kv_dtype!r}")
    if min(max_context, max_concurrency, prefill_chunk) < 1:
        _fail("--max-context, --max-concurrency and --prefill-chunk must be positive")
    return EngineConfig(max_context=max_context, max_concurrency=max_concurrency, prefill_chunk=prefill_chunk,
                        kv_dtype=kv_dtype, draft_tokens=draft_tokens if spec else 0, max_frontiers=max_frontiers,
                        **rest)


def _split_attention(device: str) -> bool:
    """Whether long prefill chunks attend split on `device` (NINFER_PREFILL_ATTENTION; the plan counts its
    buffers). A plan made where no GPU is resolves "auto" as the masked path."""
    if not device.startswith("cuda"):
        return False
    from .kernels.prefill_modes import splits_long_chunks

    return splits_long_chunks()


def _size(text: str | None) -> int | None:
    from .memory import parse_size

    try:
        return None if text is None else parse_size(text)
    except ValueError as err:
        _fail(str(err))


@app.command()
def plan(
    path: Path = typer.Argument(..., help="a .ninfer file"),
    gpu_mem: str = typer.Option(..., "--gpu-mem", help="the card's memory, e.g. 32GiB, 141GB, 24000MiB"),
    max_context: int = _MAX_CONTEXT,
    max_concurrency: int = _MAX_CONCURRENCY,
    median_prompt: int | None = typer.Option(None, "--median-prompt", help="typical prompt length, tokens"),
    vision: bool = typer.Option(False, "--vision", help="count the vision tower and media buffers"),
    media_cache_mib: int = typer.Option(1024, "--media-cache-mib", help="vision encoder cache"),
    media_live_mib: int = typer.Option(2048, "--media-live-mib", help="images being encoded"),
    prefill_chunk: int | None = _PREFILL_CHUNK,
    kv_dtype: str = _KV_DTYPE,
    spec: str | None = _SPEC,
    draft_tokens: int = _DRAFT_TOKENS,
    max_frontiers: int = _MAX_FRONTIERS,
    cuda_graphs: bool | None = _CUDA_GRAPHS,
    as_json: bool = typer.Option(False, "--json", help="machine-readable plan"),
) -> None:
    """Plan GPU memory for a serving configuration: does it fit, the slack, whether prefix reuse holds
    (C x median prompt <= pool), and the --max-context / --max-concurrency that would fit. Exit 1 if it
    does not fit."""
    import json

    from .memory import artifact_plan, format_plan, recommend, reuse_holds

    config = _engine_config(max_context, max_concurrency, _default_chunk(prefill_chunk, "cuda"), kv_dtype, spec,
                            draft_tokens, max_frontiers, cuda_graphs=cuda_graphs)
    capacity = _size(gpu_mem)
    sizes = {"media_cache_mib": media_cache_mib, "media_live_mib": media_live_mib,
             "split_attention": _split_attention("cuda")}
    try:
        with Artifact(path) as a:
            shape, weights, p = artifact_plan(a.manifest, config, "cuda", vision, **sizes)
    except (FormatError, OSError, ValueError) as err:
        _fail(f"{path}: {err}")
    advice = recommend(shape, weights, config, capacity, median_prompt, device="cuda", vision=vision, **sizes)
    fits = p.slack(capacity) >= 0
    if as_json:
        typer.echo(json.dumps({"fits": fits, "capacity": capacity, "slack": p.slack(capacity),
                               "device_total": p.device_total, "host_total": p.host_total,
                               "components": {name: value for name, value, _ in p.rows()},
                               "kv_bytes_per_token": p.kv_per_token,
                               "reuse_holds": reuse_holds(config, median_prompt) if median_prompt else None,
                               "recommended": {"max_context": advice.max_context,
                                               "max_concurrency": advice.max_concurrency, "why": advice.reason}},
                              indent=1))
    else:
        typer.echo(format_plan(p, capacity, median_prompt))
        typer.echo(f"recommended: --max-context {advice.max_context} --max-concurrency {advice.max_concurrency} "
                   f"({advice.reason})")
    raise typer.Exit(0 if fits else 1)


@app.command()
def serve(
    path: Path = typer.Argument(..., help="a .ninfer file"),
    host: str = typer.Option("127.0.0.1", "--host", help="bind address (loopback by default)"),
    port: int = typer.Option(18080, "--port"),
    max_context: int = _MAX_CONTEXT,
    max_concurrency: int = _MAX_CONCURRENCY,
    pending_timeout_ms: int = typer.Option(600_000, "--pending-timeout-ms", help="max wait for admission"),
    max_queued_requests: int = typer.Option(256, "--max-queued-requests",
                                            help="requests waiting for admission beyond this get HTTP 429"),
    prefill_chunk: int | None = _PREFILL_CHUNK,
    kv_dtype: str = _KV_DTYPE,
    spec: str | None = _SPEC,
    draft_tokens: int = _DRAFT_TOKENS,
    spec_max_batch: int = _SPEC_MAX_BATCH,
    max_frontiers: int = _MAX_FRONTIERS,
    cuda_graphs: bool | None = _CUDA_GRAPHS,
    warm_up: bool | None = _WARM_UP,
    api_key: str | None = typer.Option(None, "--api-key", envvar="NINFER_API_KEY", help="require this key"),
    served_model_name: str | None = typer.Option(None, "--served-model-name", help="model id in the API"),
    device: str = typer.Option("cpu", "--device", help="cpu (pure-torch reference path) or cuda[:N] (GPU kernels)"),
    mem: str | None = typer.Option(None, "--gpu-mem", help="memory to plan against (default: what the device has free)"),
    vision: bool = typer.Option(False, "--vision", help="serve the vision tower: images in both APIs"),
    media_cache_mib: int = typer.Option(1024, "--media-cache-mib", help="vision encoder output cache"),
    media_live_mib: int = typer.Option(2048, "--media-live-mib", help="memory for one request's images being encoded"),
    allow_image_urls: bool = typer.Option(False, "--allow-image-urls",
                                          help="fetch http(s) image URLs (off: only data URLs / base64)"),
) -> None:
    """Serve an artifact over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/models) and Anthropic
    (/v1/messages, /v1/messages/count_tokens) APIs, /health and Prometheus /metrics. Refuses, with the
    memory plan, a configuration that does not fit."""
    import torch
    import uvicorn

    from .chat import Chat
    from .engine import build_engine
    from .loader import load
    from .memory import artifact_plan, device_capacity, format_plan
    from .server.app import create_app

    config = _engine_config(max_context, max_concurrency, _default_chunk(prefill_chunk, device), kv_dtype, spec,
                            draft_tokens, max_frontiers, pending_timeout_ms=pending_timeout_ms, max_queued=max_queued_requests,
                            cuda_graphs=cuda_graphs, spec_max_batch=spec_max_batch)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        typer.echo(f"warning: serving on {host} without --api-key: anyone who can reach it can use it", err=True)
    sizes = {"media_cache_mib": media_cache_mib, "media_live_mib": media_live_mib,
             "split_attention": _split_attention(device)}
    try:
        with Artifact(path) as a:
            _, _, p = artifact_plan(a.manifest, config, device, vision, **sizes)
    except (FormatError, OSError, ValueError) as err:
        _fail(f"{path}: {err}")
    capacity = _size(mem) or device_capacity(device)
    if p.slack(capacity) < 0:
        typer.echo(format_plan(p, capacity), err=True)
        _fail("this configuration does not fit in memory: lower --max-context or --max-concurrency "
              "(`ninfer-run plan` recommends values)")
    try:
        # the GPU path computes in bf16 through the kernels; the CPU reference path in float32
        loaded = load(path, device=device, vision=vision,
                      dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32)
        chat = Chat.from_artifact(loaded.artifact)
        support = _vision_support(loaded, media_cache_mib, media_live_mib, allow_image_urls) if vision else None
    except (FormatError, OSError, ValueError) as err:
        _fail(f"{path}: {err}")
    try:
        engine = build_engine(loaded.model, config, media=support.media if support else None)
    except ValueError as err:
        _fail(str(err))
    if warm_up if warm_up is not None else device.startswith("cuda"):
        from .warmup import warm_up as run_warm_up

        done = run_warm_up(engine, loaded.model.cfg.vocab_size)
        typer.echo(f"warm-up: {done.prompt_tokens}-token prompt and {done.new_tokens} tokens, then a next turn of "
                   f"{done.turn_tokens} new tokens on {done.turn_cached_tokens} reused"
                   + (f", then {done.batched} requests decoded together" if done.batched else "")
                   + f", in {done.seconds:.1f} s" if done else "warm-up: skipped (no room in the context)", err=True)
    vocab = chat.tokenizer.get_vocab()
    eos = [t for t in (chat.special_tokens.get("eos_token"), "<|im_end|>", "<|endoftext|>") if t in vocab]
    stop_ids = tuple(dict.fromkeys(vocab[t] for t in eos))
    name = served_model_name or loaded.artifact.manifest.registry_id
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = create_app(engine, chat, name, TOOL_STYLES[loaded.family], stop_ids, api_key, support)
    uvicorn.run(server, host=host, port=port, log_level="info")


def _vision_support(loaded, cache_mib: int, live_mib: int, allow_urls: bool):
    import json

    from .server.images import VisionSupport
    from .vision.media import MediaEncoder
    from .vision.preprocess import ImageConfig

    artifact = loaded.artifact
    if not artifact.has_blob("preprocessor_config.json"):
        raise ValueError("--vision needs the checkpoint's preprocessor_config.json, which this artifact lacks")
    config = artifact.manifest.config
    return VisionSupport(ImageConfig.from_preprocessor(json.loads(artifact.blob("preprocessor_config.json"))),
                         config["image_token_id"], config["vision_config"]["spatial_merge_size"],
                         MediaEncoder(loaded.vision, cache_mib << 20, live_mib << 20), allow_urls)


_COMMANDS = {"check", "plan", "serve", "--help", "-h"}


def main() -> None:
    """Entry point: `ninfer-run MODEL.ninfer ...` is shorthand for `ninfer-run serve MODEL.ninfer ...`."""
    argv = sys.argv[1:]
    if argv and argv[0] not in _COMMANDS and not argv[0].startswith("-"):
        argv = ["serve", *argv]
    app(args=argv, prog_name="ninfer-run")
