"""Whole-model benchmark on the GPU box (issue 6): qwen3.8-27b at full size, random weights.

    python tools/bench.py [--out DIR] [--profiles nvfp4 int4] [--prefill 8192 32768 100000]
    python tools/bench.py --smoke     # tiny-qwen3.5 on any machine: checks the script, times nothing useful

The model is built in GPU memory from the registry's own tensor list (64 layers + the MTP head, the
27B's shapes): random bf16 weights quantized on the GPU by the packer's quantizers, kept packed as
`load(kernels=True)` keeps an artifact's weights (plain tensors in bf16, as the loader casts them).
NVFP4 global scales are per tensor here (the packer shares one across fused q/k/v and gate/up; the
kernels read either the same way). Everything then runs through the real engine (paged INT8 KV,
chunked prefill, the GPU kernels, fla-core's Gated DeltaNet):
  - prefill: TTFT of one 8K / 32K / 100K-token prompt; tok/s and model FLOP/s vs the bf16 ceiling; then
    (--turn N, default 2048) an agent's next turn after the longest, N new tokens on its reused prefix, and
    the turn after (the first pays what the warm-up did not compile: the compile count says what);
  - decode: aggregate tok/s at C = 1, 2, 4, 8 vs the weight-bandwidth roofline (bytes every token reads),
    and at C = 1 after 32K- and 100K-token prompts (--decode-context), the KV read added to the roofline;
    sampled (temperature 0.6, top-p 0.95, top-k 20, seeded) at C = 1 and the largest C;
  - MTP (--draft-tokens 3): at the real acceptance (random weights: near 0) at C = 1, and at a forced
    one (successive verifies accept 3, 0, 2, 1 drafts: 50%) at every C;
  - torch.profiler tables of 8 decode steps at C = 1 and at the largest C (decode_profile*.txt): where
    a token's time goes; with --profile-prefill N, one of an N-token prefill too (prefill_profile.txt);
  - KV capacity: tokens of INT8 KV that fit beside the weights (the planner, and free memory);
  - with --ab-pipeline NAME, decode each concurrency again, with the default pipeline and then with the
    NVFP4 GEMV streaming its weights through NAME (cuda_ops.PIPELINE_NAMES; an A/B of adjacent runs: each
    decode captures its own graphs); with --ab-fused-norm, likewise with the one-row layer norms staged
    by the GEMV after them and with a norm kernel of their own (cuda_ops.FUSED_NORM flipped); with
    --ab-fused-glu, with SwiGLU's SiLU-mul written by gate and up's launch and by a kernel of its own
    (cuda_ops.FUSED_GLU flipped); with --ab-fused-draw, the sampled decode with the draw after the top-k as
    one kernel and as torch's ops (sampling.FUSED_DRAW flipped); with --ab-triton-pdl, with the step's Triton
    kernels launched as programmatic dependents of the kernel ahead and as plain launches
    (kernels.common.TRITON_PDL flipped);
    with --ab-conv-gates, with a GDN layer's conv and gates in one launch and in two
    (kernels.gdn_decode.CONV_GATES); with --ab-norm-rope-write, with an attention layer's q/k norm and RoPE
    in the KV write's launch and apart (kernels.kv_write.NORM_ROPE_WRITE);
    with --ab-overlap, with the host reading a step's tokens while the next
    step runs and after it (OVERLAP_STEPS); with --ab-mlp-pipeline NAME, with the MLP's GEMVs alone
    streamed through NAME (cuda_ops.MLP_PIPELINE); with --ab-int4-pipeline NAME, an int4 profile's tiled
    GEMVs through NAME (cuda_ops.INT4_PIPELINE); with
    --ab-prefill-attention MODE, each prefill (the longest with its next turns) in the default long-chunk
    attention and in MODE, back to back (prefill_modes); with
    --anatomy, each concurrency's step with the GDN layers' chain of small kernels left out, the attention
    layers', and both (the GEMVs alone): what each chain costs inside the graph (ANATOMY).
Peer in the same run: transformers' Qwen3_5ForCausalLM in bf16 with 4 and 8 of the layers (3 GDN : 1
attention, full width and vocab), prefill 8K and decode, extrapolated to 64 layers by the per-layer
difference. Ceilings first (copy GB/s, bf16 matmul TFLOP/s). JSON is rewritten after every figure,
so a run cut short keeps what it measured; PNG and a table of ratios last.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ninfer_format.rules import expand  # noqa: E402
from ninfer_pack.quant import quantize_tensor  # noqa: E402
from ninfer_registry import load as registry_entry  # noqa: E402
from ninfer_registry import scheme_classes  # noqa: E402
from ninfer_run import sampling  # noqa: E402
from ninfer_run.engine import EngineConfig, Request, build_engine  # noqa: E402
from ninfer_run.kernels import common as kernel_common  # noqa: E402
from ninfer_run.kernels import cuda_ops, gated_delta, gdn_decode, kv_write, prefill_modes  # noqa: E402
from ninfer_run.kernels.common import counting_compiles  # noqa: E402
from ninfer_run.kernels.linear import QuantizedLinear, Scratch  # noqa: E402
from ninfer_run.memory import ModelShape, plan  # noqa: E402
from ninfer_run.models import model_class, qwen3_5  # noqa: E402
from ninfer_run.sampling import SamplingParams  # noqa: E402
from ninfer_run.static_step import StaticBatch  # noqa: E402
from ninfer_run.warmup import warm_up  # noqa: E402

from bench_common import gpu_tag, write_results  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.6, top_p=0.95, top_k=20)  # Qwen's recommended sampling, as agents send it
SAMPLED_LABEL = "sampled T 0.6 top-p 0.95 top-k 20"
OVERLAP_STEPS = EngineConfig.overlap_steps  # the engine's default; --ab-overlap flips it
FORCED_CYCLE = (3, 0, 2, 1)  # drafts accepted at successive verifies: 1.5 of 3 on average


# -- the model -----------------------------------------------------------------------------------
def _random_weight(name: str, shape: tuple[int, ...], tensor_class: str, gen: torch.Generator, device) -> torch.Tensor:
    """Values in the ranges trained checkpoints have, so activations stay finite over 64 layers."""
    if name.endswith("A_log"):
        return torch.rand(shape, generator=gen, device=device) * 2.7  # decay rates exp(A) in 1..15
    if name.endswith("dt_bias"):
        return torch.ones(shape, device=device)
    noise = torch.randn(shape, generator=gen, device=device) * 0.02
    if tensor_class == "norm":
        return noise + (1.0 if "linear_attn.norm" in name else 0.0)  # plain-weight norm vs (1 + w) norms
    return noise.to(torch.bfloat16)


def build_model(model_id: str, profile: str, device: str, dtype: torch.dtype, lm_head: str | None = None):
    """(model, bytes of all its weights, bytes each decoded token reads: all but the embedding table
    and the MTP head, entry, config). lm_head: its scheme in place of the profile's (ninfer-pack --lm-head)."""
    entry = registry_entry(model_id)
    config = entry.expected_config()
    classes = scheme_classes(entry, profile, {"lm_head": lm_head} if lm_head else None)
    scratch = Scratch()
    gen = torch.Generator(device=device).manual_seed(0)
    weights, total_bytes, read_bytes = {}, 0, 0
    for t in expand(entry.resolved, config, tuple(p for p in entry.available_parts if p != "vision")).values():
        w = _random_weight(t.name, t.shape, t.tensor_class, gen, device)
        scheme = classes[t.tensor_class]
        if scheme["kind"] != "plain" and len(t.shape) == 2:
            parts = quantize_tensor(scheme, w, t.name)
            weights[t.name] = QuantizedLinear(scheme, parts, t.shape, scratch, t.name)
            nbytes = sum(p.numel() * p.element_size() for p in parts.values())
        else:
            weights[t.name] = w.to(dtype)
            nbytes = weights[t.name].numel() * weights[t.name].element_size()
        total_bytes += nbytes
        if "embed_tokens" not in t.name and not t.name.startswith("mtp."):
            read_bytes += nbytes
        del w
    model = model_class(entry.resolved["family"])(config, entry.resolved, weights)
    return model, total_bytes, read_bytes, entry, config


# -- measurements through the engine ---------------------------------------------------------------
def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n,), generator=g).tolist()


def _profiled(run, profile_to: Path | None) -> None:
    """run(); with `profile_to`, under torch.profiler, its top ops (by GPU, then CPU time) written there."""
    if profile_to is None:
        return run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
    ops = prof.key_averages()
    kernels = [e for e in ops if e.device_type == torch.autograd.DeviceType.CUDA]
    head = (f"GPU kernels launched: {sum(e.count for e in kernels)}, their time: "
            f"{sum(e.self_device_time_total for e in kernels) / 1000:.2f} ms\n")
    profile_to.write_text(head + ops.table(sort_by="self_cuda_time_total", row_limit=30) + "\n"
                          + ops.table(sort_by="self_cpu_time_total", row_limit=30))


def prefill(model, tokens: int, chunk: int, seed: int, profile_to: Path | None = None, turn: int = 0) -> dict:
    """TTFT of one `tokens`-token prompt; with `turn`, then of an agent's next turn in the same engine: the
    prompt, its reply token and `turn` new tokens, the prompt's prefix reused (cached_tokens says how much)."""
    engine = build_engine(model, EngineConfig(max_context=tokens + 2 * turn + 64, prefill_chunk=chunk, max_frontiers=1))
    prompt = _prompt(tokens, model.cfg.vocab_size, seed)
    result = engine.submit(Request(prompt, max_tokens=1, params=GREEDY))
    with counting_compiles() as compiled:
        _profiled(engine.run_until_done, profile_to)
        _sync()
    ttft = result.first_token - result.admitted
    row = {"tokens": tokens, "chunk": chunk, "ttft_s": ttft, "tok_s": tokens / ttft, **_compiled(compiled)}
    for n in range(2 if turn else 0):  # the next turn, then another: what the first compiles shows as the gap
        follow = prompt + result.tokens + _prompt(turn, model.cfg.vocab_size, seed + 1 + n)
        result = engine.submit(Request(follow, max_tokens=1, params=GREEDY))
        with counting_compiles() as compiled:
            engine.run_until_done()
            _sync()
        row["turn_again" if n else "turn"] = {"new_tokens": len(follow) - result.cached_tokens,
                                              "cached_tokens": result.cached_tokens,
                                              "ttft_s": result.first_token - result.admitted, **_compiled(compiled)}
        prompt = follow
    del engine
    gc.collect()
    return row


def prefill_row(model, tokens: int, args, flops: float, ceil: dict) -> dict:
    """prefill's row for a `tokens`-token prompt (the longest of --prefill with its next turns), with the
    share of the bf16 FLOP ceiling its linears reached."""
    row = prefill(model, tokens, args.chunk, seed=tokens, turn=args.turn if tokens == max(args.prefill) else 0)
    row["of_flop_ceiling"] = flops * row["tok_s"] / (ceil["bf16_TFLOP_s"] * 1e12)
    return row


def prefill_attention_ab(model, args, p: dict, flops: float, ceil: dict, save) -> None:
    """Each prefill length (the longest with its next turns) in the default long-chunk attention and in
    --ab-prefill-attention's, back to back (adjacent: the machine's drift stays out of the A/B), after a
    warm-up in the other mode too (its first uses: Triton compiles, cuDNN plans)."""
    default, other = prefill_modes.PREFILL_ATTENTION, args.ab_prefill_attention
    try:
        prefill_modes.PREFILL_ATTENTION = other
        server_warm_up(model, args.chunk, 1)
        for tokens in args.prefill:
            for mode in (default, other):
                prefill_modes.PREFILL_ATTENTION = mode
                row = prefill_row(model, tokens, args, flops, ceil) | {"variant": f"prefill attention {mode}"}
                p["prefill"].append(row)
                save()
                turn = f", next turn {row['turn']['ttft_s']:.3f} s" if "turn" in row else ""
                print(f"prefill {tokens} (prefill attention {mode}): {row['ttft_s']:.2f} s{turn} "
                      f"({row['triton_compiled']} Triton kernels compiled)", flush=True)
    finally:
        prefill_modes.PREFILL_ATTENTION = default


def server_warm_up(model, chunk: int, concurrency: int) -> dict:
    """ninfer_run.warmup on an engine of the server's defaults (graphs on CUDA) with this prefill chunk and
    --max-concurrency (its batched requests: what a server of that concurrency spends at start-up)."""
    engine = build_engine(model, EngineConfig(max_context=2 * chunk + 256, prefill_chunk=chunk, max_frontiers=1,
                                              max_concurrency=concurrency))
    with counting_compiles() as compiled:
        done = warm_up(engine, model.cfg.vocab_size)
        _sync()
    del engine
    gc.collect()
    return {**dataclasses.asdict(done), **_compiled(compiled)}


def _compiled(counts) -> dict:
    """counting_compiles' count as the bench's row fields (None: this Triton cannot count them)."""
    return {"triton_compiled": None if counts is None else sum(counts.values()),
            "triton_compiled_kernels": {} if counts is None else dict(counts)}


def decode(model, concurrency: int, new_tokens: int, prompt: int, draft_tokens: int = 0, forced: bool = False,
           seed: int = 0, profile_to: Path | None = None, params: SamplingParams = GREEDY) -> dict:
    """Aggregate decode tok/s once every sequence has its first token; `forced`: see ForcedAcceptance.
    `profile_to`: also write torch.profiler's top ops of the timed steps there. `params`: each sequence's
    sampling (sampled ones seeded seed + i)."""
    warm = 4 * (draft_tokens + 1)
    # room past the timed tokens: speculative steps keep their full draft count to the end, and an overlapped
    # step launched ahead lands in the final drain without ending its run (a run's retirement - frontier,
    # GDN slot - must not count as decode time)
    max_tokens = warm + new_tokens + draft_tokens + 2
    blocks = -(-(prompt + max_tokens + draft_tokens) // 64)  # each sequence's whole blocks (a 64-token block)
    config = EngineConfig(max_context=concurrency * blocks * 64, max_concurrency=concurrency, block_size=64,
                          prefill_chunk=4096, draft_tokens=draft_tokens, max_frontiers=1, overlap_steps=OVERLAP_STEPS)
    engine = build_engine(model, config)
    if forced:
        engine.verify_rows = ForcedAcceptance(engine.verify_rows)
    # untimed first: every prompt (a long one takes several chunks), then a few steps in which a graphed
    # engine captures this shape's graphs (decode; verify and drafts with MTP)
    results = [engine.submit(Request(_prompt(prompt, model.cfg.vocab_size, seed + i),
                                     max_tokens=max_tokens,
                                     params=params if params.greedy else dataclasses.replace(params, seed=seed + i)))
               for i in range(concurrency)]
    _steps_until(engine, results, warm)
    engine.drain()  # a step launched ahead (overlapped steps) counts where its device time does
    _sync()
    start_tokens, t0 = sum(len(r.tokens) for r in results), time.perf_counter()

    _profiled(functools.partial(_steps_until, engine, results, warm + new_tokens), profile_to)
    engine.drain()
    _sync()
    seconds = time.perf_counter() - t0
    made = sum(len(r.tokens) for r in results) - start_tokens
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    engine.run_until_done()
    row = {"concurrency": concurrency, "context": prompt, "draft_tokens": draft_tokens, "forced": forced,
           "spec_max_batch": config.spec_max_batch,
           "tokens": made, "seconds": seconds, "tok_s": made / seconds,
           "acceptance": accepted / drafted if drafted else None}
    if not draft_tokens:  # a plain step: one token a sequence
        row["step_ms"] = 1000 * seconds * concurrency / made
        row["graph_ms"] = _graph_replay_ms(engine, concurrency)
    del engine
    gc.collect()
    return row


def _graph_replay_ms(engine, concurrency: int, replays: int = 20) -> float | None:
    """The plain decode step's graph of `concurrency` rows replayed back to back (ms a replay): the device's
    share of a step; the rest of its wall time (step_ms) is the host's (staging, sampling, bookkeeping),
    which the GPU waits for. Run after the timed steps (the replays rewrite the finished rows' KV slots
    and GDN states: nothing reads them again). None where no graph was captured."""
    bucket = engine.graphs.buckets.get((concurrency, 1)) if engine.graphs is not None else None
    if bucket is None or bucket.graph is None:
        return None
    bucket.graph.replay()
    _sync()
    t0 = time.perf_counter()
    for _ in range(replays):
        bucket.graph.replay()
    _sync()
    return 1000 * (time.perf_counter() - t0) / replays


def _steps_until(engine, results, tokens: int) -> None:
    """Engine steps until every result holds `tokens` tokens (or has finished)."""
    while any(len(r.tokens) < tokens and not r.done for r in results):
        engine.step()


class ForcedAcceptance:
    """An engine's verify_rows, except that each sequence's logits are changed so that greedy
    verification accepts FORCED_CYCLE[i % 4] drafts at its i-th verify (3, 0, 2, 1: half of three
    drafts on average, exactly over every four steps, whatever the random weights predict): the drafts
    before that count are made the target's argmax, the next one its least likely token. The head and
    the target (graphed or not) still do all their work."""

    def __init__(self, verify_rows):
        self._verify_rows, self._step = verify_rows, 0

    def __call__(self, token_lists, states):
        out = []
        for tokens, (hidden, logits) in zip(token_lists, self._verify_rows(token_lists, states)):
            logits = logits.clone()  # a graph's output buffer is not ours to change
            accept = FORCED_CYCLE[self._step % len(FORCED_CYCLE)]
            self._step += 1
            for j, draft in enumerate(tokens[1:]):
                if j <= accept:  # the dtype's extremes: max + 1 could round back to a tie in bf16
                    logits[j, draft] = torch.finfo(logits.dtype).max if j < accept else torch.finfo(logits.dtype).min
            out.append((hidden, logits))
        return out


def kv_capacity(model, entry, config, weights: int, device: str) -> dict:
    """Tokens of INT8 KV that fit beside the weights: by the planner (each token also costs its share of
    the dense prefill's scratch) on the whole card, and by the memory free right now."""
    shape = ModelShape.from_config(entry.resolved["family"], config, entry.resolved)
    fixed = plan(shape, weights, EngineConfig(max_context=0), device)
    per_token = fixed.kv_per_token + shape.scratch_per_token(device != "cpu")
    free, total = torch.cuda.mem_get_info() if device == "cuda" else (0, 0)
    tokens = max(0, (total - fixed.device_total) // per_token) if total else None
    return {"kv_bytes_per_token": fixed.kv_per_token, "planned_bytes_per_token": per_token, "weights_bytes": weights,
            "planner_tokens_C1": tokens, "free_now_tokens": free // per_token if free else None,
            "sequences_of_100k": tokens // 100_000 if tokens else None}


# -- the transformers peer ---------------------------------------------------------------------------
def transformers_peer(config: dict, layer_pattern: list[str], layers: int, prefill_tokens: int, new_tokens: int,
                      device: str) -> dict:
    import transformers

    text = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    text.update(num_hidden_layers=layers, layer_types=[layer_pattern[i % len(layer_pattern)] for i in range(layers)])
    cfg = transformers.Qwen3_5TextConfig(**text)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    ids = torch.tensor([_prompt(prefill_tokens, cfg.vocab_size, 1)], device=device)
    with torch.no_grad():
        model(ids, logits_to_keep=1)  # warm-up at the timed length: compilation and fla's autotuning
        _sync()
        t0 = time.perf_counter()
        out = model(ids, use_cache=True, logits_to_keep=1)
        _sync()
        prefill_s = time.perf_counter() - t0
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        out = model(token, past_key_values=cache, use_cache=True)  # warm-up steps
        for _ in range(7):
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(new_tokens):  # each step timed alone: the median ignores a one-off stall
            _sync()
            t0 = time.perf_counter()
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            _sync()
            steps.append(time.perf_counter() - t0)
        step_s = statistics.median(steps)
    del model, cache, out
    gc.collect()
    torch.cuda.empty_cache() if device == "cuda" else None
    return {"layers": layers, "prefill_tokens": prefill_tokens, "prefill_s": prefill_s, "decode_step_s": step_s}


def extrapolate(a: dict, b: dict, layers: int) -> dict:
    """Time at `layers` from two measured depths: the fixed part (embedding, lm_head) plus per-layer cost.
    Where the deeper model measured faster (seen for transformers' decode step: 4 layers slower than 8
    on two runs) no line fits; the deeper time scaled in proportion is then reported instead, marked
    as an upper bound (it scales the fixed part too)."""
    out: dict = {"layers": layers}
    for key in ("prefill_s", "decode_step_s"):
        if b[key] >= a[key]:
            out[key] = a[key] + (b[key] - a[key]) / (b["layers"] - a["layers"]) * (layers - a["layers"])
        else:
            out[key] = b[key] * layers / b["layers"]
            out[f"{key}_is_upper_bound"] = True
    return out


# -- the run ----------------------------------------------------------------------------------------
def model_flops_per_token(model) -> int:
    """2 x the multiply-adds of every linear a token goes through (attention over context excluded)."""
    total = 0
    for name, w in model.w.items():
        if name.startswith("mtp.") or "embed_tokens" in name or name.endswith("lm_head.weight"):
            continue
        shape = w.shape if isinstance(w, QuantizedLinear) else tuple(w.shape)
        if len(shape) == 2:
            total += 2 * shape[0] * shape[1]
    return total


def bars_of(results: dict) -> dict[str, float]:
    """Prefill and decode tok/s of every profile, for the plot."""
    bars = {}
    for profile, p in results["profiles"].items():
        for row in p["prefill"]:
            variant = f" {row['variant']}" if "variant" in row else ""
            bars[f"{profile} prefill {row['tokens'] // 1000}K{variant}"] = row["tok_s"]
        for row in p["decode"]:
            mtp = f" MTP{'f' if row['forced'] else ''}" if row["draft_tokens"] else ""
            ctx = f" @{row['context'] // 1000}K" if row.get("context", 512) > 512 else ""
            ctx += f" {row['variant']}" if "variant" in row else ""
            bars[f"{profile} decode C={row['concurrency']}{mtp}{ctx}"] = row["tok_s"]
    return bars


def table(r: dict) -> str:
    c = r.get("ceilings", {})
    lines = [f"ceilings: copy {c.get('copy_GB_s', 0):.0f} GB/s, bf16 matmul {c.get('bf16_TFLOP_s', 0):.0f} TFLOP/s"]
    peer = r.get("transformers_64_layers")
    for profile, p in r.get("profiles", {}).items():
        lines.append(f"[{profile}] weights {p['weights_GiB']:.2f} GiB, a decoded token reads {p['read_GiB']:.2f} GiB "
                     f"-> roofline {p['roofline_tok_s']:.0f} tok/s")
        for row in p.get("prefill", []):
            vs = f", {peer['prefill_s'] / row['ttft_s']:.2f}x transformers" if peer and row["tokens"] == peer.get(
                "prefill_tokens") else ""
            variant = f" ({row['variant']})" if "variant" in row else ""
            lines.append(f"  prefill {row['tokens']:>6}{variant}: TTFT {row['ttft_s']:6.2f} s, {row['tok_s']:7.0f} tok/s, "
                         f"linears at {row['of_flop_ceiling']:.0%} of the FLOP ceiling{vs}")
            for key, name in (("turn", "its next turn"), ("turn_again", "the turn after")):
                if key in row:
                    t = row[key]
                    lines.append(f"    {name}: {t['new_tokens']} new tokens on {t['cached_tokens']:,} reused, "
                                 f"TTFT {t['ttft_s']:.3f} s ({t['triton_compiled']} Triton kernels compiled: "
                                 f"{t['triton_compiled_kernels']})")
        for row in p.get("decode", []):
            mtp = f" MTP{row['draft_tokens']}{' forced' if row['forced'] else ''}" if row["draft_tokens"] else ""
            acc = f" accept {row['acceptance']:.0%}" if row["acceptance"] is not None else ""
            mtp += f" at {row['context']:,} tokens of context" if row.get("context", 512) > 512 else ""
            mtp += f" ({row['variant']})" if "variant" in row else ""
            bound = "<= " if peer and peer.get("decode_step_s_is_upper_bound") else ""
            vs = f", {bound}{row['tok_s'] * peer['decode_step_s']:.2f}x transformers C=1" if peer else ""
            lines.append(f"  decode C={row['concurrency']}{mtp}: {row['tok_s']:7.1f} tok/s "
                         f"({row['of_roofline']:.0%} of its {row.get('roofline_tok_s', 0):.0f} tok/s roofline{acc})"
                         f"{_step_split(row)}{vs}")
        kv = p.get("kv_capacity")
        if kv and kv.get("planner_tokens_C1"):
            lines.append(f"  KV: {kv['kv_bytes_per_token']} B/token; {kv['planner_tokens_C1']:,} tokens fit beside the "
                         f"weights ({kv['sequences_of_100k']} sequences of 100K)")
    if peer:
        bound = ">= " if peer.get("decode_step_s_is_upper_bound") else ""
        lines.append(f"transformers bf16, 64 layers (extrapolated): prefill {peer['prefill_tokens']} in "
                     f"{peer['prefill_s']:.2f} s, decode {bound}{1 / peer['decode_step_s']:.1f} tok/s")
    return "\n".join(lines)


# The on/off A/Bs of decode: (option, label, module, setting, what the option's help says): each concurrency
# decoded with the module's setting as it is and flipped (decode_figures)
TOGGLES = (
    ("--ab-fused-norm", "fused norm", cuda_ops, "FUSED_NORM", "the one-row layer norms fused into the GEMVs and not"),
    ("--ab-fused-glu", "fused glu", cuda_ops, "FUSED_GLU", "SwiGLU's SiLU-mul in gate and up's launch and not"),
    ("--ab-triton-pdl", "triton pdl", kernel_common, "TRITON_PDL",
     "the step's Triton kernels launched as programmatic dependents and not (NINFER_TRITON_PDL)"),
    ("--ab-conv-gates", "conv gates", gdn_decode, "CONV_GATES",
     "a GDN layer's conv and gates in one launch and apart (NINFER_GDN_CONV_GATES)"),
    ("--ab-norm-rope-write", "norm rope write", kv_write, "NORM_ROPE_WRITE",
     "an attention layer's q/k norm and RoPE in its KV write's launch and apart (NINFER_NORM_ROPE_WRITE)"),
    ("--ab-overlap", "overlap", sys.modules[__name__], "OVERLAP_STEPS",
     "the host reading a step's tokens while the next step runs and after it (EngineConfig.overlap_steps)"),
    ("--ab-fused-draw", "fused draw", sampling, "FUSED_DRAW",
     "sampled steps drawn by one kernel after the top-k and by torch's ops (NINFER_FUSED_DRAW)"),
)
SAMPLED_TOGGLES = {"FUSED_DRAW"}  # the toggles whose A/B decodes sampled (SAMPLED), not greedy


# --anatomy: the decode step's graph with a layer kind's chain of small kernels left out (their outputs left
# unwritten): the graphs' difference is what that chain costs where it runs, between the GEMVs, overlaps
# and launch gaps included - what a per-kernel profile cannot say under PDL, where a kernel's time holds its
# wait for the one ahead. The tokens such a step makes mean nothing; only its time is read.
ANATOMY = {"no gdn chain": ("gdn",), "no attention chain": ("attention",), "gemvs only": ("gdn", "attention")}


def _skipping(model, chains: tuple[str, ...]) -> contextlib.ExitStack:
    """Patches that leave out each of `chains`: "gdn" (a GDN layer's gates, conv, recurrence and gated
    norm: its in_proj and out_proj GEMVs stay), "attention" (an attention layer's q/k norm + RoPE, KV
    write and attention, all inside state.attend: its qkv and o_proj GEMVs stay)."""
    c, stack = model.cfg, contextlib.ExitStack()
    if "gdn" in chains:
        def gates(h, w_ab, *_):
            return tuple(h.new_empty(h.shape[0], w_ab.shape[0] // 2, dtype=torch.float32) for _ in range(2))

        def recurrence(_, __, qkv, *___):
            return qkv.new_empty(qkv.shape[0], c.v_heads, c.v_dim)

        stack.enter_context(mock.patch.object(qwen3_5, "projected_gates", gates))
        paths = (StaticBatch, "gdn"), (qwen3_5.Model, "_gdn_decode_batch"), (qwen3_5.Model, "_gdn_sequence")
        for owner, name in paths:  # whichever runs the step
            stack.enter_context(mock.patch.object(owner, name, recurrence))
        stack.enter_context(mock.patch.object(qwen3_5, "gated_rms_norm", lambda x, z, *_: torch.empty_like(z)))
    if "attention" in chains:
        stack.enter_context(mock.patch.object(qwen3_5, "attend", lambda segments, key, q, *_: torch.empty_like(q)))
    return stack


def anatomy(model, p: dict, args, save) -> None:
    """Each concurrency's decode step in full and with each ANATOMY variant's chains left out, adjacent
    (each captures its own graphs) -> p["anatomy"]: the graphs' ms (the steps' wall time where no graph
    was captured: CPU), what each chain adds to the full one, and the weights' read alone (GEMVs, lm_head)
    against the roofline's time for their bytes at the copy rate."""
    for c in args.concurrency:
        graphs = {}
        for label, chains in [("full", ())] + list(ANATOMY.items()):
            with _skipping(model, chains):
                row = decode(model, c, args.new_tokens, 512) | {"variant": f"anatomy: {label}"}
            p["decode"].append(row)
            graphs[label] = row["graph_ms"] or row["step_ms"]
            save()
        full, alone = graphs["full"], graphs["gemvs only"]
        summary = {"concurrency": c, "graph_ms": graphs,
                   "gdn_chain_ms": full - graphs["no gdn chain"], "attention_chain_ms": full - graphs["no attention chain"],
                   "gemvs_alone_of_copy": 1000 / p["roofline_tok_s"] / alone}
        p.setdefault("anatomy", []).append(summary)
        save()
        print(f"anatomy C={c}: step graph {full:.3f} ms; GDN chains {summary['gdn_chain_ms']:.3f} ms, attention "
              f"chains {summary['attention_chain_ms']:.3f} ms; GEMVs + lm_head alone {alone:.3f} ms "
              f"({summary['gemvs_alone_of_copy']:.0%} of copy for the weights' bytes)", flush=True)


def _step_split(row: dict) -> str:
    """A plain decode row's step wall time against its graph's replay alone (the host's share is the rest)."""
    if row.get("graph_ms") is None:
        return ""
    return f" (a step {row['step_ms']:.2f} ms, its graph {row['graph_ms']:.2f} ms)"


def decode_figures(model, profile: str, p: dict, args, first: bool, save) -> None:
    """Decode rows into p["decode"]: every concurrency for every profile, and a profile of 8 steps at C = 1
    (decode_profile_<profile>.txt after the first's decode_profile.txt: where a token's time goes in each
    weight format); for the first also a long context, MTP (real and forced acceptance) and its other
    profiles (device time)."""
    decode(model, 1, 4, 128)  # warm-up
    for c in args.concurrency:
        row = decode(model, c, args.new_tokens, 512)
        p["decode"].append(row)
        save()
        print(f"[{profile}] decode C={c}: {row['tok_s']:.1f} tok/s{_step_split(row)}", flush=True)
    if not first:
        decode(model, 1, 8, 512, profile_to=args.out / f"decode_profile_{profile}.txt")
        return
    for c in sorted({1, max(args.concurrency)}):  # sampled on the device, as a client asking for temperature
        row = decode(model, c, args.new_tokens, 512, params=SAMPLED) | {"variant": SAMPLED_LABEL}
        p["decode"].append(row)
        save()
        print(f"[{profile}] decode C={c} ({SAMPLED_LABEL}): {row['tok_s']:.1f} tok/s{_step_split(row)}", flush=True)
    for context in args.decode_context:  # decode after a long prompt: the KV read joins the weights'
        row = decode(model, 1, args.new_tokens, context)
        p["decode"].append(row)
        save()
        print(f"[{profile}] decode C=1 at {context} tokens: {row['tok_s']:.1f} tok/s", flush=True)
    if model.has_mtp and not args.no_mtp:
        decode(model, 1, 8, 128, draft_tokens=3)  # warm-up: verify (M = 4) and head kernels compile here
        # the real acceptance (random weights: ~0) at C = 1; the forced one at every concurrency
        for c, forced in [(1, False)] + [(c, True) for c in args.concurrency]:
            row = decode(model, c, args.new_tokens, 512, draft_tokens=3, forced=forced)
            p["decode"].append(row)
            save()
            print(f"[{profile}] decode C={c} MTP3 forced={forced}: {row['tok_s']:.1f} tok/s "
                  f"accept {row['acceptance']}", flush=True)
    # each concurrency with cuda_ops' setting as it is and flipped, back to back (adjacent runs: the
    # machine's drift over the run stays out of the A/B)
    flips = [("pipeline", cuda_ops, "PIPELINE", args.ab_pipeline)] if args.ab_pipeline else []
    flips += [("mlp pipeline", cuda_ops, "MLP_PIPELINE", args.ab_mlp_pipeline)] if args.ab_mlp_pipeline else []
    if args.ab_int4_pipeline and profile.startswith("int4"):
        flips += [("int4 pipeline", cuda_ops, "INT4_PIPELINE", args.ab_int4_pipeline)]
    flips += [(label, module, name, not getattr(module, name)) for option, label, module, name, _ in TOGGLES
              if getattr(args, option.removeprefix("--").replace("-", "_"))]
    for label, module, name, other in flips:
        default = getattr(module, name)
        try:
            for c in args.concurrency:
                for value in (default, other):
                    setattr(module, name, value)
                    params = SAMPLED if name in SAMPLED_TOGGLES else GREEDY
                    row = decode(model, c, args.new_tokens, 512, params=params) | {"variant": f"{label} {value}"}
                    p["decode"].append(row)
                    save()
                    print(f"[{profile}] decode C={c} ({label} {value}): {row['tok_s']:.1f} tok/s{_step_split(row)}",
                          flush=True)
        finally:
            setattr(module, name, default)
    if args.anatomy:
        anatomy(model, p, args, save)
    decode(model, 1, 8, 512, profile_to=args.out / "decode_profile.txt")
    if model.has_mtp and not args.no_mtp:  # a speculative step's device and host time: head drafts and observe, verify
        decode(model, 1, 8, 512, draft_tokens=3, forced=True, profile_to=args.out / "decode_profile_mtp.txt")
    if max(args.concurrency) > 1:  # and at the largest concurrency: what grows with the batch
        c = max(args.concurrency)
        decode(model, c, 8, 512, profile_to=args.out / f"decode_profile_c{c}.txt")
        # sampled there: what the draws add to a step (stop 42: +1.8 ms at C = 8, +0.26 at C = 1)
        decode(model, c, 8, 512, params=SAMPLED, profile_to=args.out / f"decode_profile_c{c}_sampled.txt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    parser.add_argument("--profiles", nargs="+", default=["nvfp4", "int4"])
    parser.add_argument("--prefill", nargs="+", type=int, default=[8192, 32768, 100_000])
    parser.add_argument("--chunk", type=int, default=8192, help="prefill chunk (tokens)")
    parser.add_argument("--turn", type=int, default=2048, metavar="TOKENS",
                        help="after the longest prompt, the TTFT of a next turn of this many new tokens on its "
                             "reused prefix, as an agent's (0: none)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--new-tokens", type=int, default=48, help="timed tokens per sequence")
    parser.add_argument("--decode-context", nargs="*", type=int, default=[32768, 100_000], metavar="TOKENS",
                        help="also decode C = 1 after prompts this long (none: no)")
    parser.add_argument("--profile-prefill", type=int, default=0, metavar="TOKENS",
                        help="also profile one prefill of this many tokens (prefill_profile.txt)")
    parser.add_argument("--no-decode", action="store_true", help="prefill figures only (no decode, MTP, profiles)")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers")
    parser.add_argument("--no-mtp", action="store_true", help="skip the speculative (MTP) figures")
    parser.add_argument("--ab-pipeline", choices=cuda_ops.PIPELINE_NAMES, default=None,
                        help="also decode each concurrency with the NVFP4 GEMV's weights streamed this way (an A/B)")
    parser.add_argument("--ab-int4-pipeline", choices=cuda_ops.INT4_PIPELINES, default=None,
                        help="also decode each concurrency (int4 profiles) with the tiled int4 GEMVs streamed this "
                             "way (an A/B; cuda_ops.INT4_PIPELINE)")
    parser.add_argument("--ab-mlp-pipeline", choices=cuda_ops.PIPELINE_NAMES, default=None,
                        help="also decode each concurrency with the MLP's NVFP4 GEMVs streamed this way (an A/B)")
    for option, *_, what in TOGGLES:
        parser.add_argument(option, action="store_true", help=f"also decode each concurrency with {what}")
    parser.add_argument("--anatomy", action="store_true",
                        help="also decode each concurrency with the GDN layers' small kernels left out, the attention "
                             "layers', and both: what each chain costs in the step's graph (the tokens mean nothing)")
    parser.add_argument("--ab-prefill-attention", choices=prefill_modes.MODES, default=None,
                        help="also time each prefill with the long chunks' attention in the default mode and in this "
                             "one, back to back (NINFER_PREFILL_ATTENTION)")
    parser.add_argument("--lm-head", metavar="SCHEME",
                        help="lm_head's scheme in place of the profile's bf16 (as ninfer-pack --lm-head), e.g. nvfp4")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.smoke
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model_id = "qwen3.8-27b" if gpu else "tiny-qwen3.5"
    if not gpu:
        args.prefill, args.chunk, args.concurrency, args.new_tokens = [64], 32, [1, 2], 4
        args.turn = min(args.turn, 40)
        args.decode_context = [min(n, 600) for n in args.decode_context[:1]]
    if gpu and not gated_delta.available(torch.device(device)):
        raise SystemExit("fla-core is missing: the Gated DeltaNet reference loop would take hours at these lengths")
    results: dict = {"model": model_id, "chunk": args.chunk, "profiles": {}}
    name = f"bench_{gpu_tag()}" if gpu else "bench_smoke"

    def save():  # after every figure: a run cut short keeps what it measured, plot included
        write_results(args.out, name, results, bars=bars_of(results), ylabel="tok/s")

    if gpu:
        from bench_kernels import ceilings  # tools/ is on the path, as for bench_common

        results["ceilings"] = ceilings()
    ceil = results.get("ceilings", {"copy_GB_s": float("nan"), "bf16_TFLOP_s": float("nan")})
    for n, profile in enumerate(args.profiles):
        t0 = time.perf_counter()
        model, weights, read_bytes, entry, config = build_model(model_id, profile, device, dtype, args.lm_head)
        p = results["profiles"][profile + (f" lm_head={args.lm_head}" if args.lm_head else "")] = {
            "build_s": time.perf_counter() - t0, "lm_head": args.lm_head or "profile's", "weights_GiB": weights / 2**30, "read_GiB": read_bytes / 2**30,
            "roofline_tok_s": ceil["copy_GB_s"] * 1e9 / read_bytes, "gemv_pipeline": cuda_ops.PIPELINE,
            "fused_norm": cuda_ops.FUSED_NORM, "fused_glu": cuda_ops.FUSED_GLU,
            "mlp_pipeline": cuda_ops.MLP_PIPELINE,
            "prefill": [], "decode": []}
        p["kv_capacity"] = kv_capacity(model, entry, config, weights, device)
        save()
        flops = model_flops_per_token(model)
        # warm-up: the server's own (ninfer-run serve --warm-up), so each timed prefill's compiles say
        # what a served first prompt would still compile
        warm = server_warm_up(model, args.chunk, max(args.concurrency))
        p["warm_up"] = warm
        print(f"[{profile}] server warm-up ({warm['prompt_tokens']} tokens, {warm['new_tokens']} generated, a next "
              f"turn of {warm['turn_tokens']} new tokens, {warm['batched']} together): "
              f"{warm['seconds']:.2f} s, {warm['triton_compiled']} Triton kernels compiled", flush=True)
        for tokens in args.prefill if n == 0 else args.prefill[:1]:  # later profiles: the 8K point (device time)
            row = prefill_row(model, tokens, args, flops, ceil)
            p["prefill"].append(row)
            save()
            print(f"[{profile}] prefill {tokens}: {row['ttft_s']:.2f} s ({row['triton_compiled']} Triton kernels "
                  f"compiled meanwhile: {row['triton_compiled_kernels']})", flush=True)
        if args.ab_prefill_attention and n == 0:
            prefill_attention_ab(model, args, p, flops, ceil, save)
        if args.profile_prefill and n == 0:
            prefill(model, args.profile_prefill, args.chunk, seed=7, profile_to=args.out / "prefill_profile.txt")
        if not args.no_decode:
            decode_figures(model, profile, p, args, n == 0, save)
        kv_token = p["kv_capacity"].get("kv_bytes_per_token", 0)
        for row in p["decode"]:  # a step of C sequences reads the weights once and each sequence's KV
            step_bytes = read_bytes + row["concurrency"] * row["context"] * kv_token
            row["roofline_tok_s"] = row["concurrency"] * ceil["copy_GB_s"] * 1e9 / step_bytes
            row["of_roofline"] = row["tok_s"] / row["roofline_tok_s"]
        save()
        del model
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
    if gpu and not args.no_peer:
        entry = registry_entry(model_id)
        config = entry.expected_config()
        try:
            depth = []
            for layers in (4, 8):
                depth.append(transformers_peer(config, entry.resolved["layer_pattern"], layers, args.prefill[0],
                                               args.new_tokens, device))
                print(f"[transformers] {layers} layers: {depth[-1]}", flush=True)
            results["transformers"] = depth
            results["transformers_64_layers"] = {**extrapolate(*depth, 64), "prefill_tokens": args.prefill[0]}
        except Exception as e:  # noqa: BLE001 - the peer's failure must not take our figures with it
            results["transformers_error"] = repr(e)
            print(f"transformers peer failed: {e!r}", flush=True)
    save()
    print(table(results))


if __name__ == "__main__":
    main()
