"""Kernel figures against the roofline and a peer measured in the same run (the GPU box; issue 6).

    python tools/bench_kernels.py [--out DIR]     # on the H200: check every kernel, then time it
    python tools/bench_kernels.py --smoke         # anywhere: tiny shapes, Triton's interpreter on a CPU,
                                                  # checks only (catches a broken script before device time)

Ceilings, measured first: device-to-device copy (bytes read + written) and a bf16 cuBLAS matmul on
random data. Then, on qwen3.8-27b's shapes:
  - decode GEMV (NVFP4, int4-g128) at M = 1, 4, 8, 16: weight GB/s vs the copy ceiling, and speed vs the
    peer, torch.matmul with the same weight in bf16 (what transformers runs; 4x the bytes); at M = 1
    also the GEMV's loads alone (tools/csrc/gemv_read_floor.cu): its memory floor;
  - prefill at M = 8192: dequantize + cuBLAS vs the bf16 matmul peer and the FLOP ceiling;
  - paged INT8 attention decode at 8K / 32K / 100K context, 1 and 8 sequences: KV GB/s vs the copy
    ceiling, and speed vs torch SDPA over the same KV in bf16;
  - paged attention for a prefill chunk of 8K queries at the end of 8K / 32K / 100K contexts: TFLOP/s
    vs the ceiling for the paged kernel and for the dense path the engine takes (KV decoded once,
    then SDPA flash), and vs SDPA (flash, bf16) on the square 8K case;
  - Gated DeltaNet (fla-core) for one layer: the chunked prefill at 8K / 32K tokens vs transformers'
    pure-torch chunked form, and the decode step vs the state-bytes roofline.
Weights rotate over copies that outsize the L2, so timings are of HBM, not cache. Medians of
triton.testing.do_bench. JSON + PNG to --out; a table of ratios last.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

from ninfer_pack.quant import quantize_int, quantize_nvfp4  # noqa: E402
from ninfer_run.kernels import cuda_ops, gated_delta, int_linear, kv_read, nvfp4_linear  # noqa: E402
from ninfer_run.kernels.paged_attention import (  # noqa: E402
    TARGET_PROGRAMS,
    _partitions,
    _tokens_per_program,
    dense_prefill,
    paged_attention,
)
from ninfer_run.kernels.paged_attention import reference as attention_reference  # noqa: E402
from ninfer_run.kernels.prefill_modes import MODES as PREFILL_ATTENTION_MODES  # noqa: E402
from ninfer_run.kv.pool import BlockPool, KVLayout  # noqa: E402

from bench_common import gpu_tag, write_results  # noqa: E402

# (name, N, K) of every quantized linear of a qwen3.8-27b layer, and how many layers have it
LINEARS = [("gdn.in_proj_qkv", 10240, 5120, 48), ("gdn.in_proj_z", 6144, 5120, 48), ("gdn.out_proj", 5120, 6144, 48),
           ("attn.q_proj", 12288, 5120, 16), ("attn.k_proj", 1024, 5120, 16), ("attn.v_proj", 1024, 5120, 16),
           ("attn.o_proj", 5120, 6144, 16), ("mlp.gate_proj", 17408, 5120, 64), ("mlp.up_proj", 17408, 5120, 64),
           ("mlp.down_proj", 5120, 17408, 64)]
SMOKE_LINEARS = [("tiny", 64, 256, 1)]
L2_BYTES = 60 << 20


def _bench(fn) -> float:
    """Median milliseconds."""
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def ceilings() -> dict:
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    copy_ms = _bench(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_ms = _bench(lambda: a @ b)
    return {"copy_GB_s": 2 * n / copy_ms / 1e6, "bf16_TFLOP_s": 2 * 8192**3 / mm_ms / 1e9}


def _copies(make, nbytes: int) -> list:
    return [make() for _ in range(max(1, -(-3 * L2_BYTES // max(nbytes, 1))))]


def _rotating(fn_of, items):
    state = {"i": 0}

    def run():
        fn_of(items[state["i"] % len(items)])
        state["i"] += 1

    return run


def _nvfp4_weight(n, k, device):
    q, s8, s2 = quantize_nvfp4(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.05)
    return q, s8, s2


def _int4_weight(n, k, device):
    p = quantize_int(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.05, 4, 128, True, "w")
    return p["qweight"], p["scale"]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@functools.cache
def _read_floor():
    """tools/csrc/gemv_read_floor.cu built (the GEMV's loads without its arithmetic) -> its function."""
    from torch.utils.cpp_extension import load_inline

    source = (Path(__file__).resolve().parent / "csrc" / "gemv_read_floor.cu").read_text()
    module = load_inline("ninfer_gemv_read_floor", cpp_sources="void read_floor(torch::Tensor q, torch::Tensor s, "
                         "torch::Tensor out, int64_t n, int64_t k, std::string mode, int64_t warps, int64_t depth, "
                         "int64_t grid);",
                         cuda_sources=source, functions=["read_floor"],
                         extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])
    return module.read_floor


def linears(device: str, dtype, shapes, ceil: dict, time_it: bool) -> list[dict]:
    rows = []
    for name, n, k, _layers in shapes:
        q, s8, s2 = _nvfp4_weight(n, k, device)
        qi, si = _int4_weight(n, k, device)
        for m in ((1, 4, 8, 16) if time_it else (1, 16)):
            x = torch.randn(m, k, device=device).to(dtype)
            cuda = cuda_ops.gemv_fits(x, n)
            checks = {"nvfp4": _rel(nvfp4_linear.gemv(x, q, s8, s2), nvfp4_linear.reference(x, q, s8, s2)),
                      "int4": _rel(int_linear.gemv(x, qi, si, None, 4, 128), int_linear.reference(x, qi, si, None, 4, 128))}
            if cuda:
                checks["nvfp4_cuda"] = _rel(cuda_ops.nvfp4_gemv(x, *cuda_ops.tile_nvfp4(q, s8), s2, tiled_n=n),
                                            nvfp4_linear.reference(x, q, s8, s2))
                checks["int4_cuda"] = _rel(cuda_ops.int4_gemv(x, qi, si, None), int_linear.reference(x, qi, si, None, 4, 128))
            row = {"linear": name, "N": n, "K": k, "M": m, "rel_err": checks}
            if time_it:
                nv_bytes = n * k // 2 + n * k // 16
                i4_bytes = n * k // 2 + n * (k // 128) * 2
                nv = _copies(lambda: _nvfp4_weight(n, k, device), nv_bytes)
                i4 = _copies(lambda: _int4_weight(n, k, device), i4_bytes)
                bf = _copies(lambda: torch.randn(k, n, device=device, dtype=torch.bfloat16), 2 * n * k)
                if cuda:  # the engine's: NVFP4 in the tiled layout (loader), each pipeline and shape, the default
                    tiled = [(*cuda_ops.tile_nvfp4(q, s), s2) for q, s, s2 in nv]
                    pipeline = cuda_ops.pipeline_for()
                    shape = cuda_ops.nvfp4_shape(pipeline, n, k, x.device)
                    row["default_shape"] = f"{pipeline} {shape[0]}x{shape[1]}"
                    row["nvfp4_shapes_us"] = {
                        f"{pipe} {w}x{d}": 1000 * _bench(_rotating(
                            lambda q, s=(w, d), p=pipe: cuda_ops.nvfp4_gemv(x, *q, shape=s, tiled_n=n, pipeline=p), tiled))
                        for pipe, shapes in (("ring", cuda_ops.GEMV_SHAPES), ("bulk", cuda_ops.BULK_SHAPES),
                                             ("bulk-block-columns", cuda_ops.BULK_SHAPES if m == 1 else ()))
                        for w, d in sorted(shapes) if w <= k // 128}
                    row["nvfp4_ms"] = _bench(_rotating(lambda w: cuda_ops.nvfp4_gemv(x, *w, tiled_n=n), tiled))
                    if m == 1:  # the same loads without the arithmetic, at the default shape
                        warps, depth = cuda_ops.gemv_shape(n, k, x.device)
                        sink = torch.empty(n // 16 * warps * 32, dtype=torch.int32, device=device)
                        floor = _read_floor()
                        row["read_floor_us"] = 1000 * _bench(_rotating(
                            lambda w: floor(w[0], w[1], sink, n, k, "split", warps, depth, 0), tiled))
                    row["nvfp4_row_major_ms"] = _bench(_rotating(lambda w: cuda_ops.nvfp4_gemv(x, *w), nv))
                    row["int4_ms"] = _bench(_rotating(lambda w: cuda_ops.int4_gemv(x, w[0], w[1], None), i4))
                    del tiled
                else:
                    row["nvfp4_ms"] = _bench(_rotating(lambda w: nvfp4_linear.gemv(x, *w), nv))
                    row["int4_ms"] = _bench(_rotating(lambda w: int_linear.gemv(x, w[0], w[1], None, 4, 128), i4))
                row["nvfp4_kernel"] = "cuda" if cuda else "triton"
                row["bf16_peer_ms"] = _bench(_rotating(lambda w: x @ w, bf))
                row["nvfp4_GB_s"] = nv_bytes / row["nvfp4_ms"] / 1e6
                row["int4_GB_s"] = i4_bytes / row["int4_ms"] / 1e6
                row["nvfp4_of_roofline"] = nv_bytes / (ceil["copy_GB_s"] * 1e6) / row["nvfp4_ms"]
                row["nvfp4_vs_peer"] = row["bf16_peer_ms"] / row["nvfp4_ms"]
                row["int4_vs_peer"] = row["bf16_peer_ms"] / row["int4_ms"]
            rows.append(row)
    return rows


def prefill(device: str, dtype, shapes, ceil: dict, time_it: bool, m: int) -> list[dict]:
    rows = []
    for name, n, k, _layers in shapes:
        q, s8, s2 = _nvfp4_weight(n, k, device)
        x = torch.randn(m, k, device=device).to(dtype)
        buf = torch.empty(n, k, device=device, dtype=dtype)
        w = nvfp4_linear.dequantize(q, s8, s2, out=buf, dtype=dtype)
        row = {"linear": name, "N": n, "K": k, "M": m,
               "dequant_exact": bool(torch.equal(w, nvfp4_linear.reference_dequantize(q, s8, s2, dtype)))}
        # the engine's layout on Hopper (cuda_ops.tile_nvfp4; on a CPU its torch form, checked the same way)
        tiled = cuda_ops.tile_nvfp4(q, s8) if n % 16 == 0 and k % 128 == 0 else None
        if tiled is not None:
            row["tiled_dequant_exact"] = bool(torch.equal(
                nvfp4_linear.dequantize(*tiled, s2, dtype=dtype, tiled_shape=(n, k)), w))
        if time_it:
            wb = torch.randn(k, n, device=device, dtype=torch.bfloat16)
            ours = _bench(lambda: x @ nvfp4_linear.dequantize(q, s8, s2, out=buf).T)
            peer = _bench(lambda: x @ wb)
            flops = 2 * m * n * k
            row.update({"ours_ms": ours, "bf16_peer_ms": peer, "TFLOP_s": flops / ours / 1e9,
                        "of_flop_ceiling": flops / ours / 1e9 / ceil["bf16_TFLOP_s"], "vs_peer": peer / ours,
                        "dequant_ms": _bench(lambda: nvfp4_linear.dequantize(q, s8, s2, out=buf))})
            if tiled is not None:
                row["tiled_dequant_ms"] = _bench(lambda: nvfp4_linear.dequantize(*tiled, s2, out=buf, tiled_shape=(n, k)))
        rows.append(row)
    return rows


def attention(device: str, dtype, heads, contexts, batches, ceil: dict, time_it: bool) -> list[dict]:
    hq, hkv, dim = heads
    bs = 64
    rows = []
    for ctx in contexts:
        for batch in batches:
            blocks = -(-ctx // bs)
            pool = BlockPool(KVLayout(1, hkv, dim, bs, "int8"), blocks * batch, device=device)
            for t in (pool.k, pool.v):
                t.copy_(torch.randint(-127, 128, t.shape, device=device, dtype=torch.int8))
            for t in (pool.k_scale, pool.v_scale):
                t.copy_(torch.rand(t.shape, device=device, dtype=torch.float16) * 0.02)
            tables = torch.arange(blocks * batch, dtype=torch.int32, device=device).view(batch, blocks)
            lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
            q = torch.randn(batch, 1, hq, dim, device=device).to(dtype)
            got = paged_attention(q, pool, 0, tables, lens)
            if not time_it:
                want = attention_reference(q.float(), pool, 0, tables.tolist(), [ctx] * batch)
                rows.append({"context": ctx, "batch": batch, "rel_err": _rel(got, want)})
                continue
            kv_bytes = 2 * batch * ctx * hkv * dim * (1 + 2 / 64)
            ms = _bench(lambda: paged_attention(q, pool, 0, tables, lens))
            kd = torch.randn(batch, hq, ctx, dim, device=device, dtype=torch.bfloat16)
            qd = q.transpose(1, 2).to(torch.bfloat16)
            peer = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, kd))
            rows.append({"context": ctx, "batch": batch, "ms": ms, "KV_GB_s": kv_bytes / ms / 1e6,
                         "of_roofline": kv_bytes / (ceil["copy_GB_s"] * 1e6) / ms, "bf16_sdpa_peer_ms": peer,
                         "vs_peer": peer / ms})
    return rows


def _filled_pool(ctx: int, hkv: int, dim: int, device: str) -> tuple[BlockPool, list[int]]:
    """A one-layer INT8 pool of 64-token blocks holding `ctx` random tokens -> (pool, its block table)."""
    blocks = list(range(-(-ctx // 64)))
    pool = BlockPool(KVLayout(1, hkv, dim, 64, "int8"), len(blocks), device=device)
    kv = torch.randn(ctx, hkv, dim, device=device)
    pool.write(0, blocks, 0, kv, kv.flip(0))
    return pool, blocks


def prefill_attention(device: str, dtype, heads, cases, ceil: dict, time_it: bool) -> list[dict]:
    """A prefill chunk of T queries at the end of an L-token context (causal), FLOPs vs the ceiling;
    the peer is SDPA (flash) over the same context in bf16, square causal (T = L) cases only."""
    hq, hkv, dim = heads
    rows = []
    for t, ctx in cases:
        pool, blocks = _filled_pool(ctx, hkv, dim, device)
        table = torch.tensor(blocks, dtype=torch.int32, device=device)[None]
        lens = torch.tensor([ctx], dtype=torch.int32, device=device)
        q = torch.randn(1, t, hq, dim, device=device).to(dtype)
        got = paged_attention(q, pool, 0, table, lens)
        row = {"tokens": t, "context": ctx}
        if t * ctx <= 8192 * 8192:
            want = attention_reference(q.float(), pool, 0, table.tolist(), [ctx])
            row["rel_err"] = _rel(got, want)
        if time_it:
            pairs = t * (ctx - t) + t * (t + 1) / 2
            flops = 4 * hq * dim * pairs
            row["ms"] = _bench(lambda: paged_attention(q, pool, 0, table, lens))
            row["TFLOP_s"] = flops / row["ms"] / 1e9
            row["of_flop_ceiling"] = row["TFLOP_s"] / ceil["bf16_TFLOP_s"]
            # what the engine runs for chunks > 64 rows: decode KV once + flash
            row["dense_ms"] = _bench(lambda: dense_prefill(q[0], pool, 0, blocks, ctx))
            # its K/V decode alone, one head: kv_read's kernel (stop 31) and the pool's torch form before it
            row["read_head_ms"] = _bench(lambda: kv_read.read_head(pool, 0, table[0], ctx, 0, dtype))
            row["read_head_torch_ms"] = _bench(lambda: pool.read_head(0, blocks, ctx, 0, dtype))
            row["read_head_GB_s"] = ctx * dim * 2 * (1 + 2 / 64 + 2) / row["read_head_ms"] / 1e6
            row["dense_TFLOP_s"] = flops / row["dense_ms"] / 1e9
            if t == ctx:
                kd = torch.randn(1, hq, ctx, dim, device=device, dtype=torch.bfloat16)
                qd = q.transpose(1, 2).to(torch.bfloat16)
                row["sdpa_peer_ms"] = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qd, kd, kd, is_causal=True))
                row["vs_peer"] = row["sdpa_peer_ms"] / row["ms"]
        rows.append(row)
    return rows


def prefill_attention_ab(device: str, dtype, heads=(24, 4, 256),
                         cases=((8192, 16384), (8192, 49152), (8192, 100_000), (2049, 102_049))) -> list[dict]:
    """dense_prefill in each PREFILL_ATTENTION_MODES mode: a chunk of t queries at the end of a ctx-token
    context for each (t, ctx) of `cases` (one layer, the 27B's heads; the last an agent's next turn), ms and
    TFLOP/s, each mode's error against "masked", and the shape's first call (first_call_ms: what a new
    chunk or turn pays on top, cuDNN's plan build included; masked's first call is the reference's, before)."""
    hq, hkv, dim = heads
    rows = []
    for t, ctx in cases:
        pool, blocks = _filled_pool(ctx, hkv, dim, device)
        q = torch.randn(t, hq, dim, device=device).to(dtype)
        flops = 4 * hq * dim * (t * (ctx - t) + t * (t + 1) / 2)
        want = dense_prefill(q, pool, 0, blocks, ctx, "masked")
        for mode in [m for m in PREFILL_ATTENTION_MODES if m != "auto"]:
            row = {"tokens": t, "context": ctx, "mode": mode}
            try:
                start = time.perf_counter()  # this shape's first call: what a new chunk or turn pays (cuDNN plans)
                got = dense_prefill(q, pool, 0, blocks, ctx, mode)
                if device == "cuda":
                    torch.cuda.synchronize()
                row["first_call_ms"] = (time.perf_counter() - start) * 1000
                row["rel_err_vs_masked"] = _rel(got, want)
                if device == "cuda":
                    row["ms"] = _bench(lambda: dense_prefill(q, pool, 0, blocks, ctx, mode))
                    row["TFLOP_s"] = flops / row["ms"] / 1e9
            except RuntimeError as err:  # a backend this GPU or torch lacks: say so in its row
                row["error"] = str(err)[:200]
            rows.append(row)
    return rows


def gdn(device: str, ceil: dict, time_it: bool) -> list[dict]:
    """One qwen3.8-27b GDN layer (16 key heads, 48 value heads, 128 x 128)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    hk, hv, d = 16, 48, 128
    rows = []
    for t in ((1, 8192, 32768) if time_it else (1, 40)):
        q, k = (torch.randn(t, hk, d, device=device, dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(t, hv, d, device=device, dtype=torch.bfloat16)
        g = -torch.nn.functional.softplus(torch.randn(t, hv, device=device)) * 0.5
        beta = torch.rand(t, hv, device=device)
        state = torch.randn(hv, d, d, device=device) * 0.1
        out, _, _ = gated_delta.gated_delta_rule(q, k, v, g, beta, state)
        row = {"tokens": t, "fla": gated_delta.available(torch.device(device))}
        if t <= 8192:
            row["rel_err"] = _rel(out, gated_delta.reference(q, k, v, g, beta, state)[0])
        if t == 1:
            in_place, row["in_place_rel_err"] = _gdn_in_place(hk, hv, d, g, beta, state, device, time_it)
        if time_it:
            row["ms"] = _bench(lambda: gated_delta.gated_delta_rule(q, k, v, g, beta, state))
            if t == 1:
                state_bytes = 2 * state.numel() * 4  # read and written once per token
                row["of_roofline"] = state_bytes / (ceil["copy_GB_s"] * 1e6) / row["ms"]
                row["in_place_ms"] = _bench(in_place)
                row["in_place_of_roofline"] = state_bytes / (ceil["copy_GB_s"] * 1e6) / row["in_place_ms"]
            else:
                r = hv // hk
                args = [x[None] for x in (q.repeat_interleave(r, 1), k.repeat_interleave(r, 1), v, g, beta)]
                row["torch_chunk_peer_ms"] = _bench(lambda: torch_chunk_gated_delta_rule(
                    *args, initial_state=state[None], output_final_state=True, use_qk_l2norm_in_kernel=True))
                row["vs_peer"] = row["torch_chunk_peer_ms"] / row["ms"]
                row["tok_s"] = t / row["ms"] * 1000
        if t > 1:
            row |= _gdn_conv(t, 2 * hk * d + hv * d, device, time_it, ceil)
        rows.append(row)
    return rows


def _gdn_conv(t: int, channels: int, device: str, time_it: bool, ceil: dict) -> dict:
    """The chunk's causal conv + SiLU (kernels/gdn_conv.py on a GPU) against the model's torch form
    (gated_delta.conv_silu_reference): its error, and on a GPU both times and the kernel's share of copy
    (x read, the output written once)."""
    if device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return {}
    from ninfer_run.kernels import gdn_conv

    # float32 on a CPU: its half conv1d is slow
    x = torch.randn(t, channels, device=device).to(torch.bfloat16 if device == "cuda" else torch.float32)
    history = torch.randn(3, channels, device=device).to(x.dtype)
    weight = (torch.randn(channels, 1, 4, device=device) * 0.5).to(x.dtype)
    row = {"conv_rel_err": _rel(gdn_conv.causal_conv_silu(x, history, weight),
                                gated_delta.conv_silu_reference(x, history, weight))}
    if time_it:
        row["conv_ms"] = _bench(lambda: gdn_conv.causal_conv_silu(x, history, weight))
        row["conv_torch_ms"] = _bench(lambda: gated_delta.conv_silu_reference(x, history, weight))
        row["conv_of_roofline"] = 2 * x.numel() * x.element_size() / (ceil["copy_GB_s"] * 1e6) / row["conv_ms"]
    return row


def _patched(module, name: str, value, call):
    """call() with module.name set to value for its duration (a module knob read at each launch)."""
    with mock.patch.object(module, name, value):
        return call()


def prefill_small_ops(device: str, dtype, t: int, ceil: dict, time_it: bool) -> list[dict]:
    """What a prefill chunk of t tokens runs besides the GEMMs, attention and GDN, at the 27B's widths (the
    32K profile of stop 36: dequantization 4.7%, norms 4.3%, SiLU-mul 3.4% of the GPU time): each kernel's
    error against its torch reference and, on a GPU, its time and bytes against copy. The GDN output norm
    (48 heads of 128 a token) both ways: many rows a program (the default for a chunk) and one; SiLU-mul and
    the dequantization at their default work a program (listed first) and others."""
    from ninfer_run import layers
    from ninfer_run.kernels import activations, norms

    hidden, inter, heads, dv = (5120, 17408, 48, 128) if time_it else (256, 384, 4, 128)
    x, h = (torch.randn(t, hidden, device=device).to(dtype) for _ in range(2))
    w = (torch.randn(hidden, device=device) * 0.1).to(dtype)
    o, gate = (torch.randn(t * heads, dv, device=device).to(dtype) for _ in range(2))
    w_o = (torch.randn(dv, device=device) * 0.1 + 1).to(dtype)
    g, u = (torch.randn(t, inter, device=device).to(dtype) for _ in range(2))
    q, s8, s2 = _nvfp4_weight(2 * inter if time_it else 64, hidden, device)
    tiled = cuda_ops.tile_nvfp4(q, s8)
    n, k = q.shape[0], hidden
    gated_norm = functools.partial(norms.gated_rms_norm, o, gate, w_o, 1e-6)
    # a CPU check: the chunk's few rows take the narrow kernel too
    with mock.patch.object(norms, "NARROW_MIN_ROWS", norms.NARROW_MIN_ROWS if time_it else 1):
        cases = [  # name, call, its torch reference, bytes it must move
            ("add_rms_norm", lambda: norms.add_rms_norm(x, h, w, 1e-6, 1.0)[1],
             lambda: layers.rms_norm_reference(x + h, w, 1e-6, 1.0), 4 * x.numel() * 2),
            ("gated_rms_norm, rows a program", gated_norm,
             lambda: layers.gated_rms_norm_reference(o, gate, w_o, 1e-6), 3 * o.numel() * 2),
            ("gated_rms_norm, one row a program", functools.partial(_patched, norms, "NARROW_MIN_ROWS", 1 << 62,
                                                                    gated_norm),
             lambda: layers.gated_rms_norm_reference(o, gate, w_o, 1e-6), 3 * o.numel() * 2),
        ]
        # SiLU-mul by elements a program, the dequantization by (rows, columns) a program: the defaults first
        cases += [(f"silu_mul, {block} a program",
                   functools.partial(_patched, activations, "BLOCK", block, functools.partial(activations.silu_mul, g, u)),
                   lambda: layers.silu_mul_reference(g, u), 3 * g.numel() * 2)
                  for block in (activations.BLOCK, 2048, 4096)]
        cases += [(f"nvfp4 dequantize (tiled), {bn}x{bk}, {warps} warps",
                   functools.partial(nvfp4_linear.dequantize, *tiled, s2, block_n=bn, block_k=bk, tiled_shape=(n, k),
                                     num_warps=warps),
                   lambda: nvfp4_linear.reference_dequantize(q, s8, s2), n * k // 2 + n * k // 16 + n * k * 2)
                  for bn, bk, warps in ((64, 256, 4), (64, 256, 8), (32, 256, 4), (64, 128, 4), (128, 128, 8),
                                        (32, 512, 8))]
        rows = []
        for name, call, reference, nbytes in cases:
            row = {"op": name, "tokens": t, "rel_err": _rel(call(), reference())}
            if time_it:
                row["ms"] = _bench(call)
                row["GB_s"] = nbytes / row["ms"] / 1e6
            rows.append(row)
        return rows


def _gdn_in_place(hk, hv, d, g, beta, state, device, on_gpu: bool):
    """The engine's decode step (kernels/gdn_decode.py: conv window + recurrence in place in a one-slot
    slab) -> (a function running it, its output's error vs the torch step on the same conv rows)."""
    from ninfer_run.kernels import gdn_decode

    dtype = torch.bfloat16 if on_gpu else torch.float16  # the interpreter's casts (tests/kernels/conftest.py)
    c = 2 * hk * d + hv * d
    x = torch.randn(1, c, device=device).to(dtype)
    windows = torch.randn(1, 3, c, device=device).to(dtype)
    weight = (torch.randn(c, 1, 4, device=device) * 0.5).to(dtype)
    slab, slots = state[None].clone(), torch.zeros(1, dtype=torch.long, device=device)
    conv = gdn_decode.conv_step(x, windows, weight, slots)
    split = conv.split([hk * d, hk * d, hv * d], dim=-1)
    want, _ = gated_delta.step_reference(*(t.unflatten(-1, (-1, d)) for t in split), g, beta, slab.clone())
    err = _rel(gdn_decode.recurrent_step(conv, g, beta, slab, slots, hk), want)
    return (lambda: gdn_decode.recurrent_step(gdn_decode.conv_step(x, windows, weight, slots), g, beta, slab, slots,
                                              hk)), err


GDN_SWEEP = [(bv, warps) for bv in (16, 32, 64, 128) for warps in (1, 2, 4, 8)]


def gdn_sweep(device: str, batches=(1, 2, 4, 8), sweep=GDN_SWEEP) -> list[dict]:
    """The GDN recurrence as a decode step runs it: the 27B's 48 GDN layers' recurrent_step in one CUDA
    graph (a slab of fp32 states per layer, 3.1 MB a sequence: 48 of them are 20x the L2), per (value
    block, warps): Dv columns a program and Triton warps. Each is checked against the default launch on
    copies of the same states. The state is read and written once a token: its bytes against the copy rate
    say what is left (stop 30's profile: 4.5 us a layer at C = 1, ~1.4 TB/s)."""
    from ninfer_run.kernels import gdn_decode

    hk, hv, d, layers = 16, 48, 128, 48
    on_gpu = device == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float16
    rows = []
    for batch in batches:
        conv = torch.randn(batch, 2 * hk * d + hv * d, device=device).to(dtype)
        g = -torch.nn.functional.softplus(torch.randn(batch, hv, device=device)) * 0.1
        beta = torch.rand(batch, hv, device=device)
        slabs = [torch.randn(batch, hv, d, d, device=device) * 0.1 for _ in range(layers if on_gpu else 1)]
        slots = torch.arange(batch, device=device)
        start = slabs[0].clone()  # the timed graphs advance slabs[0] in place: each check starts from here
        want_state = start.clone()
        want = gdn_decode.recurrent_step(conv, g, beta, want_state, slots, hk)
        for bv, warps in sweep:
            options = {"value_block": bv, "launch_options": {"num_warps": warps}}
            row = {"batch": batch, "value_block": bv, "warps": warps, "programs": batch * hv * (d // bv)}
            rows.append(row)
            state = start.clone()
            try:  # a shape Triton cannot build (or builds wrong) is reported, not the end of the sweep
                got = gdn_decode.recurrent_step(conv, g, beta, state, slots, hk, **options)
            except Exception as e:  # noqa: BLE001 - the sweep's job is to say which shapes fail and why
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            row["out_rel_err"], row["state_rel_err"] = _rel(got, want), _rel(state, want_state)
            if row["out_rel_err"] > 1e-2 or row["state_rel_err"] > 1e-5:
                row["error"] = "differs from the default launch"
                continue
            if not on_gpu:
                continue
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    for slab in slabs:
                        gdn_decode.recurrent_step(conv, g, beta, slab, slots, hk, **options)
            graph.replay()
            torch.cuda.synchronize()
            us = 1000 * _bench(graph.replay) / layers
            row.update(us_per_layer=us, GB_s=2 * batch * hv * d * d * 4 / us / 1e3)
    return rows


FLOOR_SWEEP = ([("flat", 1, d, b) for d in (2, 4, 8) for b in (2, 4, 8)]
               + [("split", w, d, 0) for w, d in ((4, 2), (8, 2), (8, 4), (8, 8), (16, 4))]
               + [("persist", w, d, b) for w, d in ((4, 8), (8, 4), (8, 8)) for b in (1, 2, 4)])
# --floor-l2: the layouts the engine's GEMVs take (split at the GEMV's 4 blocks a SM; persist, the
# block-columns grid) and flat, each without and with the L2::256B prefetch-size hint ("+l2")
FLOOR_L2_SWEEP = [(mode + hint, w, d, b) for mode, w, d, b in (("flat", 1, 4, 4), ("split:4", 8, 2, 0),
                                                                ("split", 8, 2, 0), ("persist", 8, 2, 4))
                  for hint in ("", "+l2")]
FLOOR_LINEARS = ("mlp.gate_proj", "mlp.down_proj", "attn.q_proj", "gdn.in_proj_z", "attn.k_proj")


def floor_sweep(device: str, sweep=FLOOR_SWEEP, linears=FLOOR_LINEARS) -> list[dict]:
    """The GEMV's loads alone in each work layout of tools/csrc/gemv_read_floor.cu (flat: a plain read of
    the same bytes), on the largest and smallest linears: which layout a memory-bound GEMV should take."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    floor = _read_floor()
    rows = []
    for name, n, k, _layers in [s for s in LINEARS if s[0] in linears]:
        nbytes = n * k // 2 + n * k // 16
        tiled = [cuda_ops.tile_nvfp4(q, s) for q, s, _ in _copies(lambda: _nvfp4_weight(n, k, device), nbytes)]
        sink = torch.empty(max(n // 16, 8 * sms) * 16 * 32, dtype=torch.int32, device=device)
        for mode, warps, depth, per_sm in sweep:
            grid = per_sm * sms
            us = 1000 * _bench(_rotating(lambda w: floor(w[0], w[1], sink, n, k, mode, warps, depth, grid), tiled))
            rows.append({"linear": name, "N": n, "K": k, "mode": mode, "warps": warps, "depth": depth,
                         "blocks_per_sm": per_sm, "us": us, "GB_s": nbytes / us / 1e3})
        del tiled
    return rows


# The partial kernel's launch options tried at the default target ({}: 4 warps, Triton's 3 stages; two
# programs an SM). Stop 31 (H100): 8 warps 1.7-2x slower from 8K tokens on (one program an SM), stages 2
# up to 16% slower and 4 the same. Stop 30 (8 warps, 128 programs): 16 warps slower still.
ATTENTION_LAUNCHES = ({}, {"num_stages": 2}, {"num_stages": 4}, {"num_warps": 8})


def attention_sweep(device: str, targets=(TARGET_PROGRAMS, 512, 128), contexts=(600, 8192, 32768, 100_000), batches=(1, 8),
                    pool_blocks: int = 4096, launches=ATTENTION_LAUNCHES, q_len: int = 1) -> list[dict]:
    """Decode attention as the engine's graphs run it: the 27B's 16 attention layers in one CUDA graph,
    each sequence's block table as wide as the pool (a captured step's spans it), and the partitions
    _partitions gives for each target program count (paged_attention.TARGET_PROGRAMS: 1,024 before stop
    30, 128 in stop 30, 256 since stop 31's 4 warps): how many programs each context and batch should get.
    At the default target, also the partial kernel under other Triton launch options (`launches`; {}:
    today's, 4 warps and Triton's stages). q_len: query rows a sequence (1: decode; up to 64: a short
    prefill chunk, the longest the paged kernel takes, state.DENSE_PREFILL_ROWS)."""
    hq, hkv, dim, bs, layers = 24, 4, 256, 64, 16
    pool = BlockPool(KVLayout(layers, hkv, dim, bs, "int8"), pool_blocks, device=device)
    for t in (pool.k, pool.v):
        t.copy_(torch.randint(-127, 128, t.shape, device=device, dtype=torch.int8))
    for t in (pool.k_scale, pool.v_scale):
        t.copy_(torch.rand(t.shape, device=device, dtype=torch.float16) * 0.02)
    rows = []
    for ctx in contexts:
        for batch in batches:
            blocks = -(-ctx // bs)
            if blocks * batch > pool_blocks:
                continue
            tables = torch.zeros(batch, pool_blocks, dtype=torch.int32, device=device)
            tables[:, :blocks] = torch.arange(blocks * batch, dtype=torch.int32, device=device).view(batch, blocks)
            lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
            q = torch.randn(batch, q_len, hq, dim, device=device, dtype=torch.bfloat16)
            gate = torch.randn(batch * q_len, hq, dim, device=device, dtype=torch.bfloat16)
            q_blocks = -(-q_len // _tokens_per_program(q_len, hq // hkv))
            want = paged_attention(q, pool, 0, tables, lens, gate=gate)
            cells = [(target, {}) for target in targets]
            cells += [(TARGET_PROGRAMS, launch) for launch in launches if launch]
            for target, launch in cells:
                parts = _partitions(batch * q_blocks * hkv, pool_blocks, target)
                run = functools.partial(paged_attention, q, pool, block_tables=tables, seq_lens=lens, parts=parts, gate=gate,
                                        partial_options=launch)
                got = run(layer=0)
                assert torch.equal(got, want) or _rel(got, want) < 1e-2, (ctx, batch, target, launch)
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        for layer in range(layers):
                            run(layer=layer)
                graph.replay()
                torch.cuda.synchronize()
                us = 1000 * _bench(graph.replay) / layers
                kv_bytes = 2 * batch * ctx * hkv * dim * (1 + 2 / 64)
                rows.append({"context": ctx, "batch": batch, "q_len": q_len, "target_programs": target, "parts": parts,
                             "launch": launch, "us_per_layer": us, "GB_s": kv_bytes / us / 1e3})
    return rows


def _attention_rows(device: str, cell: list[int] | None) -> list[dict]:
    """--attention-sweep's rows: one (context, C) decode cell at the default target (--attention-cells), or
    the sweep and then a 64-row prefill chunk over long contexts at stop 30's first target and today's
    (36 partitions, then 4 at stop 30's 128 programs, 9 at stop 31's 256)."""
    if cell is not None:
        return attention_sweep(device, contexts=(cell[0],), batches=(cell[1],), targets=(TARGET_PROGRAMS,), launches=())
    return attention_sweep(device) + attention_sweep(device, targets=(1024, TARGET_PROGRAMS), contexts=(32768, 100_000),
                                                     batches=(1,), launches=(), q_len=64)


CHAIN_LAYERS = 16  # distinct weights: 2.4 GB, 40x the L2


def mlp_chain(device: str, only: list[str] | None = None, rows: int = 1) -> list[dict]:
    """The 27B's MLP block (RMSNorm, gate and up, SiLU-mul, down) over CHAIN_LAYERS layers of distinct
    weights in one CUDA graph, as the engine's decode graphs replay it (M = 1), launched each way: the
    three GEMVs apart, gate and up as one launch (grouped), and grouped as programmatic dependent launches
    (pdl), without the norm and SiLU-mul kernels between (GEMVs alone), with x staged in shared memory
    (ring-staged-x), with each NVFP4 block an MMA column (ring-block-columns, M = 1; bulk-block-columns: the
    same arithmetic over the bulk pipeline's slots), and the bulk pipeline in each of its shapes and with gate, up and
    SiLU-mul as one launch (glu); beside it a flat read of the
    same weight bytes, one launch per weight (tools/csrc/gemv_read_floor.cu), in the same graph form:
    what a chain of memory-bound launches can reach; and the GEMV's own loads alone (its blocks, warps and
    ring, no arithmetic): what its layout costs. `only`: the variants whose names hold one of these.
    `rows`: the tokens a step decodes (C); past one row the variants that serve one row only (a staged norm,
    block columns) are left out, and "engine block, norm apart" is the engine's more-rows MLP block."""
    from ninfer_run.kernels import norms
    from ninfer_run.layers import silu_mul

    assert cuda_ops.available(), "the CUDA GEMVs did not build"  # (loads torch.ops.ninfer)
    hidden, inter = 5120, 17408
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    shapes = {"up": (inter, hidden), "down": (hidden, inter)}
    base = {name: cuda_ops.tile_nvfp4(*_nvfp4_weight(n, k, device)[:2]) for name, (n, k) in shapes.items()}
    s2 = torch.ones(1, device=device)
    layers = [{name: tuple(t.clone() for t in base[b]) for name, b in (("gate", "up"), ("up", "up"), ("down", "down"))}
              for _ in range(CHAIN_LAYERS)]
    norm_w = torch.rand(hidden, device=device, dtype=torch.bfloat16)
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
    layer_bytes = sum(n * k // 2 + n * k // 16 for n, k in (shapes["up"], shapes["up"], shapes["down"]))
    floor = _read_floor()
    sink = torch.empty(8 * sms * 16 * 32, dtype=torch.int32, device=device)
    act = torch.randn(rows, inter, device=device, dtype=torch.bfloat16)  # the down projection's x, GEMVs alone
    residual = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)

    def block(w, grouped: bool, pdl: bool, shape=None, small_ops: bool | str = True, pipeline: str = "ring",
              glu: bool = False):
        """small_ops: True (the norm and SiLU-mul, Triton), False (none: the GEMVs alone), "copy" (a torch
        copy of x in their places: any kernel between, one that does not let the GEMV launch early)."""
        gemv = functools.partial(cuda_ops.nvfp4_gemv_group, shape=shape, tiled=True, pdl=pdl, pipeline=pipeline)
        h = x.clone() if small_ops == "copy" else norms.rms_norm(x, norm_w, 1e-6, 1.0) if small_ops else x
        if glu:  # gate, up and SiLU-mul in one launch
            gemv(gemv(h, [(*w["gate"], s2), (*w["up"], s2)], glu=True)[0], [(*w["down"], s2)])
            return
        if grouped:
            g, u = gemv(h, [(*w["gate"], s2), (*w["up"], s2)])
        else:
            g, u = (gemv(h, [(*w[name], s2)])[0] for name in ("gate", "up"))
        gemv(act.clone() if small_ops == "copy" else silu_mul(g, u) if small_ops else act, [(*w["down"], s2)])

    def engine_block(w, staged: bool, pipeline: str = "ring-block-columns", glu: bool = False):
        """The engine's one-row MLP block (PDL): x + residual and its norm, gate and up, SiLU-mul, down; the
        norm in a kernel of its own or staged by gate and up's launch (cuda_ops.FUSED_NORM), and with `glu`
        the SiLU-mul written by that launch (cuda_ops.FUSED_GLU): two GEMVs back to back."""
        gate_up = [(*w["gate"], s2), (*w["up"], s2)]
        if staged:
            _, _, ys = cuda_ops.nvfp4_norm_gemv_group(x, residual, norm_w, 1e-6, 1.0, gate_up, pipeline=pipeline, glu=glu)
        else:
            _, h = norms.add_rms_norm(x, residual, norm_w, 1e-6, 1.0)
            ys = cuda_ops.nvfp4_gemv_group(h, gate_up, tiled=True, pdl=True, pipeline=pipeline, glu=glu)
        act = ys[0] if glu else silu_mul(*ys)
        cuda_ops.nvfp4_gemv_group(act, [(*w["down"], s2)], tiled=True, pdl=True, pipeline=pipeline)

    def reads(w, mode="flat", names=("gate", "up", "down")):
        for name in names:
            n, k = shapes["down" if name == "down" else "up"]
            if mode == "flat":
                floor(w[name][0], w[name][1], sink, n, k, "flat", 1, 4, 4 * sms)
            else:  # the GEMV's blocks, warps and ring (8 x 2), its loads only ("split:B": B blocks a SM at most)
                floor(w[name][0], w[name][1], sink, n, k, mode, 8, 2, 0)

    variants = {"separate": lambda w: block(w, False, False), "grouped": lambda w: block(w, True, False),
                "grouped+pdl": lambda w: block(w, True, True),
                "GEMVs alone": lambda w: block(w, True, True, small_ops=False), "flat read": reads,
                "read in the GEMV's layout": lambda w: reads(w, "split"),
                # at the GEMV's occupancy (its 64 registers: 4 blocks of 8 warps a SM), and below it
                **{f"read in the GEMV's layout, {b} blocks a SM": lambda w, b=b: reads(w, f"split:{b}") for b in (4, 3, 2)},
                "grouped+pdl staged x": lambda w: block(w, True, True, pipeline="ring-staged-x"),
                "grouped+pdl block columns": lambda w: block(w, True, True, pipeline="ring-block-columns"),
                "block columns GEMVs alone": lambda w: block(w, True, True, small_ops=False, pipeline="ring-block-columns"),
                **{f"block columns {a}x{b}": lambda w, s=(a, b): block(w, True, True, s, pipeline="ring-block-columns")
                   for a, b in ((16, 2), (8, 4), (4, 2))},
                "engine block, norm apart": lambda w: engine_block(w, False),
                "engine block, norm staged": lambda w: engine_block(w, True),
                "bulk block columns GEMVs alone": lambda w: block(w, True, True, small_ops=False,
                                                                  pipeline="bulk-block-columns"),
                "grouped+pdl bulk block columns": lambda w: block(w, True, True, pipeline="bulk-block-columns"),
                "bulk block columns glu GEMVs alone": lambda w: block(w, True, True, small_ops=False,
                                                                      pipeline="bulk-block-columns", glu=True),
                "engine block bulk block columns, norm staged": lambda w: engine_block(w, True, "bulk-block-columns"),
                "engine block bulk block columns, norm apart, glu": lambda w: engine_block(w, False, "bulk-block-columns",
                                                                                           glu=True),
                "engine block bulk block columns, norm staged, glu": lambda w: engine_block(w, True, "bulk-block-columns",
                                                                                            glu=True),
                **{f"bulk block columns {a}x{b}": lambda w, s=(a, b): block(w, True, True, s, pipeline="bulk-block-columns")
                   for a, b in ((8, 2), (8, 8))},
                "bulk grouped": lambda w: block(w, True, False, pipeline="bulk"),
                "bulk GEMVs alone": lambda w: block(w, True, True, small_ops=False, pipeline="bulk"),
                "bulk glu+pdl": lambda w: block(w, True, True, pipeline="bulk", glu=True),
                # is it the small kernels' kind (Triton, early trigger) or any kernel between? torch copies
                "grouped+pdl, copies between": lambda w: block(w, True, True, small_ops="copy"),
                "bulk grouped+pdl, copies between": lambda w: block(w, True, True, small_ops="copy", pipeline="bulk")}
    # Each weight on its own against its flat read: a launch walks whole 16-row strips over its persistent
    # blocks, down_proj's 320 over 132 SMs (the busiest 3, 81% balance), gate+up's 1,088 (92%); an SM's share
    # of DRAM is 1.4x larger on the H200, so an imbalance could show there and hide on the H100 (stop 41).
    bulk = functools.partial(cuda_ops.nvfp4_gemv_group, tiled=True, pdl=True, pipeline="bulk-block-columns")
    one_weight = {"down": (lambda w: bulk(act, [(*w["down"], s2)]), ("down",)),
                  "gate+up glu": (lambda w: bulk(x, [(*w["gate"], s2), (*w["up"], s2)], glu=True), ("gate", "up"))}
    weight_bytes = {}
    for label, (body, names) in one_weight.items():
        variants[f"bulk block columns {label} only"] = body
        variants[f"flat read {label} only"] = lambda w, names=names: reads(w, names=names)
        weight_bytes[f"bulk block columns {label} only"] = weight_bytes[f"flat read {label} only"] = sum(
            n * k // 2 + n * k // 16 for n, k in (shapes["down" if name == "down" else "up"] for name in names))
    for shape in sorted(cuda_ops.BULK_SHAPES):  # bulk_shape's (8, 4) here
        variants[f"bulk grouped+pdl {shape[0]}x{shape[1]}"] = lambda w, s=shape: block(w, True, True, s, pipeline="bulk")
    results = []
    for name, body in variants.items():
        if only and not any(part in name for part in only):
            continue
        if rows > 1 and ("norm staged" in name or "block columns" in name and "engine block" not in name):
            continue  # one row's only (the engine blocks' pipelines run more rows as ring-staged-x and bulk)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            body(layers[0])  # compile / warm up outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for w in layers:
                    body(w)
        graph.replay()
        torch.cuda.synchronize()
        ms = _bench(graph.replay)
        us, nbytes = 1000 * ms / CHAIN_LAYERS, weight_bytes.get(name, layer_bytes)
        results.append({"variant": name, "rows": rows, "us_per_layer": us, "GB_s": nbytes / us / 1e3,
                        "layer_bytes": nbytes})
    return results


def table(results: dict) -> str:
    lines = []
    c = results.get("ceilings")
    if c:
        lines.append(f"ceilings: copy {c['copy_GB_s']:.0f} GB/s, bf16 matmul {c['bf16_TFLOP_s']:.0f} TFLOP/s")
    for r in results.get("decode_gemv", []):
        if "nvfp4_ms" in r:
            shapes = " ".join(f"{s}:{v:.0f}" for s, v in r.get("nvfp4_shapes_us", {}).items())
            row_major = f"row-major {r['nvfp4_row_major_ms'] * 1000:.0f} us; " if "nvfp4_row_major_ms" in r else ""
            row_major += f"read floor {r['read_floor_us']:.0f} us; " if "read_floor_us" in r else ""
            lines.append(f"gemv {r['linear']:<16} M={r['M']:<2} nvfp4 {r['nvfp4_GB_s']:6.0f} GB/s "
                         f"({r['nvfp4_of_roofline']:.0%} roofline, {r['nvfp4_vs_peer']:.2f}x bf16, {r['nvfp4_kernel']}; "
                         f"{row_major}warps x depth {shapes} us, default {r.get('default_shape')})  "
                         f"int4 {r['int4_GB_s']:6.0f} GB/s ({r['int4_vs_peer']:.2f}x bf16)")
        else:
            lines.append(f"gemv {r['linear']} M={r['M']} rel err {r['rel_err']}")
    for r in results.get("prefill", []):
        extra = (f" {r['TFLOP_s']:.0f} TFLOP/s = {r['of_flop_ceiling']:.0%} of ceiling, {r['vs_peer']:.2f}x bf16; "
                 f"dequant {r['dequant_ms'] * 1000:.0f} us" if "ours_ms" in r else "")
        extra += f", tiled {r['tiled_dequant_ms'] * 1000:.0f} us" if "tiled_dequant_ms" in r else ""
        tiled = f" tiled exact={r['tiled_dequant_exact']}" if "tiled_dequant_exact" in r else ""
        lines.append(f"prefill {r['linear']:<16} M={r['M']} dequant exact={r['dequant_exact']}{tiled}{extra}")
    for r in results.get("attention", []):
        extra = (f" {r['KV_GB_s']:.0f} GB/s = {r['of_roofline']:.0%} roofline, {r['vs_peer']:.2f}x bf16 SDPA"
                 if "ms" in r else f" rel err {r['rel_err']:.1e}")
        lines.append(f"attention ctx={r['context']:<6} C={r['batch']}{extra}")
    for r in results.get("prefill_attention", []):
        err = f" rel err {r['rel_err']:.1e}" if "rel_err" in r else ""
        if "ms" in r:
            err += f" paged kernel {r['ms']:.1f} ms, {r['TFLOP_s']:.0f} TFLOP/s = {r['of_flop_ceiling']:.0%} of ceiling"
            err += f"; dense (KV decode + flash) {r['dense_ms']:.1f} ms, {r['dense_TFLOP_s']:.0f} TFLOP/s"
            err += (f"; a head's KV decode {r['read_head_ms']:.2f} ms ({r['read_head_GB_s']:.0f} GB/s; torch "
                    f"{r['read_head_torch_ms']:.2f})")
            err += f", {r['vs_peer']:.2f}x SDPA" if "vs_peer" in r else ""
        lines.append(f"prefill attention T={r['tokens']} at ctx={r['context']}{err}")
    for r in results.get("gdn", []):
        err = f" rel err {r['rel_err']:.1e}" if "rel_err" in r else ""
        if "in_place_rel_err" in r:
            err += f", in-place step rel err {r['in_place_rel_err']:.1e}"
        if "of_roofline" in r:
            err += (f" fla step {r['ms'] * 1000:.0f} us/layer = {r['of_roofline']:.0%} state roofline; in-place step "
                    f"{r['in_place_ms'] * 1000:.1f} us = {r['in_place_of_roofline']:.0%}")
        elif "ms" in r:
            err += f" {r['ms']:.2f} ms/layer, {r['tok_s']:.0f} tok/s, {r['vs_peer']:.1f}x torch chunked"
        if "conv_ms" in r:
            err += (f"; conv + SiLU {r['conv_ms'] * 1000:.0f} us = {r['conv_of_roofline']:.0%} roofline (torch "
                    f"{r['conv_torch_ms'] * 1000:.0f} us, rel err {r['conv_rel_err']:.1e})")
        elif "conv_rel_err" in r:
            err += f"; conv + SiLU rel err {r['conv_rel_err']:.1e}"
        lines.append(f"gdn T={r['tokens']:<6} fla={r['fla']}{err}")
    if "decode_linear_projection" in results:
        p = results["decode_linear_projection"]
        lines.append(f"decode C=1, all linears of a forward (NVFP4 GEMV): {p['ms']:.2f} ms -> "
                     f"<= {p['tok_s']:.0f} tok/s from linears alone; weight roofline {p['roofline_tok_s']:.0f} tok/s")
    return "\n".join(lines)


def _report(out: Path, name: str, key: str, rows: list[dict], ceil: dict, describe) -> None:
    """A sweep's rows as JSON, then one line each: describe(row), its GB/s and their share of copy."""
    write_results(out, name, {"ceilings": ceil, key: rows})
    for r in rows:
        if "error" in r:  # a shape the sweep could not build or that computed something else
            print(f"{describe(r)} FAILED: {r['error']}")
        elif "GB_s" in r:
            print(f"{describe(r)} {r['GB_s']:6.0f} GB/s ({r['GB_s'] / ceil['copy_GB_s']:.0%} of copy)")
        else:  # compute-bound rows say their own figures; untimed ones (a CPU run) were only checked
            print(describe(r) + ("" if "ms" in r else " checked"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, checks only (works on a CPU)")
    parser.add_argument("--gemv-only", action="store_true", help="only the decode GEMVs (a quick kernel iteration)")
    parser.add_argument("--floor-sweep", action="store_true", help="only the GEMV's loads in each work layout")
    parser.add_argument("--floor-l2", action="store_true",
                        help="only the GEMV's loads in the engine's layouts, without and with the L2::256B hint")
    parser.add_argument("--chain", action="store_true", help="only the MLP block in a CUDA graph, each launch way")
    parser.add_argument("--chain-only", nargs="+", metavar="PART",
                        help="with --chain: only the variants whose names hold one of these")
    parser.add_argument("--chain-rows", type=int, default=1, metavar="M",
                        help="with --chain: the rows (tokens) a step decodes, as at concurrency M")
    parser.add_argument("--attention-sweep", action="store_true",
                        help="only decode attention in a CUDA graph, pool-wide tables, each partition target")
    parser.add_argument("--gdn-only", action="store_true",
                        help="only the GDN layer rows: fla's chunked form, the in-place decode step, the prefill conv")
    parser.add_argument("--gdn-sweep", action="store_true",
                        help="only the GDN recurrence of a decode step (48 layers in a CUDA graph), per Dv block "
                             "and warps")
    parser.add_argument("--prefill-attention-ab", action="store_true",
                        help="only a long prefill chunk's attention in each NINFER_PREFILL_ATTENTION mode")
    parser.add_argument("--prefill-small-ops", action="store_true",
                        help="only a prefill chunk's norms, SiLU-mul and NVFP4 dequantization (8,192 tokens)")
    parser.add_argument("--attention-cells", nargs=2, type=int, metavar=("CONTEXT", "C"),
                        help="with --attention-sweep: this one context and batch at the default target "
                             "(e.g. under ncu: tools/gpu_check.sh ncu)")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.smoke
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    shapes = LINEARS if gpu else SMOKE_LINEARS
    results: dict = {}
    ceil = ceilings() if gpu else {}
    if ceil:
        results["ceilings"] = ceil
    if args.floor_sweep or args.floor_l2:
        rows = floor_sweep(device, FLOOR_L2_SWEEP, FLOOR_LINEARS[:2]) if args.floor_l2 else floor_sweep(device)
        return _report(args.out, f"bench_gemv_floor_{gpu_tag()}", "floor_sweep", rows, ceil,
                       lambda r: f"floor {r['linear']:<14} {r['mode']:<8} {r['warps']:>2}x{r['depth']} "
                                 f"{r['blocks_per_sm']}/SM {r['us']:6.1f} us")
    if args.attention_sweep:
        return _report(args.out, f"bench_attention_sweep_{gpu_tag()}", "attention_sweep", _attention_rows(device, args.attention_cells), ceil,
                       lambda r: f"attention ctx={r['context']:<6} C={r['batch']} q={r['q_len']:<2} target {r['target_programs']:>4} "
                                 f"parts {r['parts']:>3} {str(r['launch'] or ''):<17} {r['us_per_layer']:6.1f} us/layer")
    if args.prefill_attention_ab:
        rows = prefill_attention_ab(device, dtype) if gpu else prefill_attention_ab(device, dtype, (12, 2, 64),
                                                                                   ((40, 100), (17, 117)))
        return _report(args.out, f"bench_prefill_attention_{gpu_tag()}", "prefill_attention_ab", rows, ceil,
                       lambda r: f"prefill attention T={r['tokens']} ctx={r['context']:<6} {r['mode']:<11}"
                                 + (f" {r['ms']:8.2f} ms {r['TFLOP_s']:6.1f} TFLOP/s" if "ms" in r else "")
                                 + (f" first call {r['first_call_ms']:7.1f} ms" if "first_call_ms" in r else "")
                                 + (f" err {r['rel_err_vs_masked']:.1e}" if "rel_err_vs_masked" in r else ""))
    if args.prefill_small_ops:
        return _report(args.out, f"bench_prefill_small_ops_{gpu_tag()}", "prefill_small_ops",
                       prefill_small_ops(device, dtype, 8192 if gpu else 64, ceil, gpu), ceil,
                       lambda r: f"prefill op {r['op']:<44} T={r['tokens']} err {r['rel_err']:.1e}"
                                 + (f" {r['ms'] * 1000:8.1f} us" if "ms" in r else ""))
    if args.gdn_sweep:
        return _report(args.out, f"bench_gdn_sweep_{gpu_tag()}", "gdn_sweep", gdn_sweep(device), ceil,
                       lambda r: f"gdn C={r['batch']} Dv block {r['value_block']:>3} x {r['warps']} warps "
                                 f"({r['programs']:>4} programs) {r.get('us_per_layer', float('nan')):6.2f} us/layer"
                                 f" err out {r.get('out_rel_err', float('nan')):.1e} state "
                                 f"{r.get('state_rel_err', float('nan')):.1e}")
    if args.chain:
        name = f"bench_chain_{gpu_tag()}" + (f"_m{args.chain_rows}" if args.chain_rows > 1 else "")
        return _report(args.out, name, "mlp_chain", mlp_chain(device, args.chain_only, args.chain_rows), ceil,
                       lambda r: f"chain {r['variant']:<20} {r['us_per_layer']:6.1f} us/layer")
    if args.gdn_only:
        results["gdn"] = gdn(device, ceil, gpu)
        if gpu:
            write_results(args.out, f"bench_gdn_{gpu_tag()}", results)
        print(table(results))
        return
    results["decode_gemv"] = linears(device, dtype, shapes, ceil, gpu)
    if args.gemv_only:
        print(table({"ceilings": ceil, "decode_gemv": results["decode_gemv"]}))
        return
    results["prefill"] = prefill(device, dtype, shapes, ceil, gpu, 8192 if gpu else 32)
    results["attention"] = attention(device, dtype, (24, 4, 256) if gpu else (12, 2, 64),
                                     (8192, 32768, 100_000) if gpu else (100,), (1, 8) if gpu else (2,), ceil, gpu)
    results["prefill_attention"] = prefill_attention(
        device, dtype, (24, 4, 256) if gpu else (12, 2, 64), ((8192, 8192), (8192, 32768), (8192, 100_000)) if gpu
        else ((40, 40), (24, 100)), ceil, gpu)
    results["gdn"] = gdn(device, ceil, gpu)
    if gpu:
        m1 = [r for r in results["decode_gemv"] if r["M"] == 1]
        ms = sum(r["nvfp4_ms"] * layers for r, (_, _, _, layers) in zip(m1, shapes))
        weight_bytes = sum((n * k // 2 + n * k // 16) * layers for _, n, k, layers in shapes)
        results["decode_linear_projection"] = {"ms": ms, "tok_s": 1000 / ms,
                                               "roofline_tok_s": ceil["copy_GB_s"] * 1e9 / weight_bytes}
        write_results(args.out, f"bench_kernels_{gpu_tag()}", results)
    print(table(results))


if __name__ == "__main__":
    main()
