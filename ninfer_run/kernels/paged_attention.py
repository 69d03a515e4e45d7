"""Attention over the paged INT8 group-64 KV pool (Triton), for decode, MTP verification and chunked prefill.

Each sequence brings `q_len` new query tokens (already written to the pool) at the end of its
`seq_len` tokens; query token j sees keys 0 .. seq_len - q_len + j (causal). A program takes one
sequence, one KV head, a block of query tokens (all the heads of that KV head's GQA group, as rows of
one tensor-core tile) and one partition of the sequence's KV blocks; K and V are dequantized per
64-value group in registers, to fp16 by integer bit arithmetic (`_dequant`), and q joins them in fp16:
exact for bf16 q inside fp16's range (q and k are RMS-normed, v a projection's output, all far below
65,504). Partitions (flash-decoding) give long contexts enough programs; a second kernel merges their
partial softmaxes. `reference` decodes the pool with kv/ (pure torch) and runs layers.causal_attention.
"""

from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from ..kv.pool import BlockPool
from ..layers import causal_attention
from . import kv_read
from . import prefill_modes as modes
from .common import launch_dependents, programmatic, wait_for_inputs
from .norms import _round

log = logging.getLogger("ninfer.attention")
_NEG = tl.constexpr(-1.0e30)  # a global a jitted function reads must be constexpr


def reference(q: torch.Tensor, pool: BlockPool, layer: int, tables: list[list[int]], seq_lens: list[int]) -> torch.Tensor:
    """q [B, q_len, Hq, D] -> [B, q_len, Hq, D] float32."""
    out = []
    for b, (table, length) in enumerate(zip(tables, seq_lens)):
        k, v = pool.read(layer, table, length)
        q_len = q.shape[1]
        out.append(causal_attention(q[b].float(), k, v, q_offset=length - q_len))
    return torch.stack(out)


def dense_prefill(q: torch.Tensor, pool: BlockPool, layer: int, blocks: list[int], length: int,
                  mode: str | None = None) -> torch.Tensor:
    """A long prefill chunk q [T, Hq, D] at the end of a `length`-token sequence -> [T, Hq, D] in q's dtype.

    Compute-bound, so each KV head's keys and values are decoded to q's dtype once (kv_read's kernel on
    an INT8 pool) and fused attention runs on them, for that head's group of query heads, query i at
    length - T + i (`mode`: one of prefill_modes.MODES; None: NINFER_PREFILL_ATTENTION's). One head at a
    time bounds the transient memory to one head's K/V (268 MB at 262K tokens for the 27B; memory.py plans
    it). The paged kernel's per-block dequantization made the same work ~20 TFLOP/s on the H200
    (tools/bench_kernels.py); decode and verify (few rows) keep the kernel."""
    mode = modes.prefill_attention_mode(mode or modes.PREFILL_ATTENTION, torch.cuda.get_device_capability(q.device)
                                        if q.is_cuda else None)
    t, hq, dim = q.shape
    hkv = pool.layout.kv_heads
    group = hq // hkv
    out = torch.empty_like(q)
    if pool.layout.dtype == "int8":
        table = pool.device_table(blocks, torch.int32)
        read_head = functools.partial(kv_read.read_head, pool, layer, table, length)
    else:
        read_head = functools.partial(pool.read_head, layer, blocks, length)
    for h in range(hkv):
        k, v = read_head(h, q.dtype)
        heads = slice(h * group, (h + 1) * group)
        qh = q[:, heads]  # [T, G, D]
        if mode != "masked":
            try:
                _split(qh, k, v, "cudnn" if mode == "split-cudnn" else "flash", out[:, heads])
                continue
            except RuntimeError as err:  # cuDNN without a kernel for this GPU or shape: masked, here and from now on
                if mode != "split-cudnn":
                    raise
                log.warning("cuDNN attention failed (%s): long prefill chunks take the masked flash path", err)
                modes.cudnn_refused.append(str(err))
                mode = "masked"
        out[:, heads] = _masked(qh, k, v)
    return out


def _masked(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One KV head's queries [T, G, D] over its keys/values [L, D], bottom-right causal -> [T, G, D]."""
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(qh.shape[0], k.shape[0])
    o = torch.nn.functional.scaled_dot_product_attention(qh.transpose(0, 1)[None], k[None, None], v[None, None],
                                                         attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1)


def _split(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str, out: torch.Tensor) -> None:
    """_masked's result, into `out` [T, G, D], from two attentions merged: the queries over the earlier keys
    (no mask: the G heads' rows folded into one head's, one long attention) and over the chunk's own T keys
    (square causal). Queries past modes.SPLIT_ROWS go in pieces, each over the keys before it."""
    t, g, dim = qh.shape
    if t > modes.SPLIT_ROWS:
        for start in range(0, t, modes.SPLIT_ROWS):
            end = min(t, start + modes.SPLIT_ROWS)
            last_key = k.shape[0] - t + end
            _split(qh[start:end], k[:last_key], v[:last_key], backend, out[start:end])
        return
    prev = k.shape[0] - t
    own_k, own_v = (x[prev:][None, None].expand(1, g, t, dim).contiguous() for x in (k, v))
    own, own_lse = attention_lse(qh.transpose(0, 1)[None], own_k, own_v, True, "flash")  # [1, G, T, D], [1, G, T]
    del own_k, own_v  # (transients: memory.py's workspace counts what is alive at once)
    if prev == 0:
        out.copy_(own[0].transpose(0, 1))
        return
    earlier, earlier_lse = attention_lse(qh.reshape(1, 1, t * g, dim), k[None, None, :prev], v[None, None, :prev],
                                         False, backend)
    merge_lse(earlier.view(t, g, dim), earlier_lse.view(t, g), own[0].transpose(0, 1), own_lse[0].transpose(0, 1),
              out)


def merge_lse(a: torch.Tensor, lse_a: torch.Tensor, b: torch.Tensor, lse_b: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Two softmax attentions of the same queries over disjoint keys, a and b [T, G, D] (any strides but the
    last) with their rows' log-sum-exps [T, G], as the one attention over all the keys -> out [T, G, D] in
    a's dtype (given: written in place, e.g. a slice of the chunk's output), from float32 sums rounded once,
    in one Triton kernel: the float32 temporaries of the torch form (merge_lse_reference) are ~4 of a's size."""
    t, g, dim = a.shape
    out = torch.empty(t, g, dim, dtype=a.dtype, device=a.device) if out is None else out
    _merge_lse_kernel[(t * g,)](a, b, lse_a, lse_b, out, g, *a.stride()[:2], *b.stride()[:2], *lse_a.stride(),
                                *lse_b.stride(), *out.stride()[:2], D=dim)
    return out


def merge_lse_reference(a, lse_a, b, lse_b) -> torch.Tensor:
    lse_a, lse_b = lse_a.float(), lse_b.float()
    lse = torch.logaddexp(lse_a, lse_b)
    merged = a.float() * torch.exp(lse_a - lse)[..., None] + b.float() * torch.exp(lse_b - lse)[..., None]
    return merged.to(a.dtype)


@triton.jit(do_not_specialize=["a_t", "a_g", "b_t", "b_g", "la_t", "la_g", "lb_t", "lb_g", "o_t", "o_g"])
def _merge_lse_kernel(a_ptr, b_ptr, la_ptr, lb_ptr, out_ptr, G, a_t, a_g, b_t, b_g, la_t, la_g, lb_t, lb_g, o_t, o_g,
                      D: tl.constexpr):
    row = tl.program_id(0)  # (token t, head g) of the [T, G] rows
    t, g = row // G, row % G
    d = tl.arange(0, D)
    la = tl.load(la_ptr + t * la_t + g * la_g).to(tl.float32)
    lb = tl.load(lb_ptr + t * lb_t + g * lb_g).to(tl.float32)
    m = tl.maximum(la, lb)
    wa, wb = tl.exp(la - m), tl.exp(lb - m)
    a = tl.load(a_ptr + t.to(tl.int64) * a_t + g * a_g + d).to(tl.float32)
    b = tl.load(b_ptr + t.to(tl.int64) * b_t + g * b_g + d).to(tl.float32)
    merged = (a * wa + b * wb) / (wa + wb)
    tl.store(out_ptr + t.to(tl.int64) * o_t + g * o_g + d, merged.to(out_ptr.dtype.element_ty,
                                                                        fp_downcast_rounding="rtne"))


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q [1, H, T, D], k/v [1, H, S, D] -> (softmax(q k^T / sqrt(D)) v [1, H, T, D] in q's dtype, each row's
    log-sum-exp of its scaled scores [1, H, T] float32); `causal`: square, query i sees keys 0..i. On CUDA
    by flash-attention 2 or cuDNN (`backend`: "flash" | "cudnn", torch's fused kernels, which return the
    log-sum-exp), elsewhere in float32 torch (the reference the GPU tests compare with)."""
    if q.is_cuda:
        if backend == "cudnn":
            out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)[:2]
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
        return out, lse.reshape(q.shape[:3]).float()
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return (torch.exp(scores - lse[..., None]) @ v.float()).to(q.dtype), lse


@triton.jit
def _dequant(x_ptr, s_ptr, slot, live, BS: tl.constexpr, D: tl.constexpr):
    """[BS, D] int8 values times their fp16 group scales, in fp16 with no int->float conversion instruction:
    byte u = x + 128 under the exponent of 1024 is the fp16 1024 + u, exactly; minus 1152 it is x. The
    int8 -> fp32 -> bf16 conversions this replaced (I2F and F2FP, 16 a clock an SM) held the kernel at
    ~1.1 TB/s; this is integer and packed-fp16 arithmetic (LOP3, PRMT, HADD2, HMUL2 in its SASS)."""
    d = tl.arange(0, D)
    raw = tl.load(x_ptr + slot[:, None] * D + d[None, :], mask=live[:, None], other=0).to(tl.uint8, bitcast=True)
    x = (raw.to(tl.uint16) ^ 0x6480).to(tl.float16, bitcast=True) - 1152.0
    groups = tl.load(s_ptr + slot[:, None] * (D // 64) + tl.arange(0, D // 64)[None, :], mask=live[:, None], other=0)
    return x * tl.reshape(tl.broadcast_to(groups[:, :, None], (BS, D // 64, 64)), (BS, D))


# (lengths and the layer vary from call to call: Triton would otherwise compile a kernel for each of their
# divisibilities, ~1 s each inside some request's first token)
@triton.jit(do_not_specialize=["layer", "max_blocks", "q_len"])
def _partial_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, table_ptr, lens_ptr, o_ptr, m_ptr, l_ptr,
                    layer, num_blocks, max_blocks, q_len, sm_scale,
                    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                    TOKENS: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(PDL)
    wait_for_inputs(PDL)
    pid_bq, h, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_blocks = tl.cdiv(q_len, TOKENS)
    b, qb = pid_bq // q_blocks, pid_bq % q_blocks
    G = HQ // HKV
    rows = tl.arange(0, ROWS)
    tok = qb * TOKENS + rows // G
    head = h * G + rows % G
    row_ok = (rows < TOKENS * G) & (tok < q_len)
    d = tl.arange(0, D)
    seq_len = tl.load(lens_ptr + b)
    q = tl.load(q_ptr + ((b * q_len + tok) * HQ + head)[:, None] * D + d[None, :], mask=row_ok[:, None],
                other=0).to(tl.float16)
    pos_q = seq_len - q_len + tok
    m = tl.full((ROWS,), _NEG, tl.float32)
    lsum = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D), tl.float32)
    t = tl.arange(0, BS)
    # this partition's share of the sequence's own blocks (not of the table's width: a captured step's
    # table spans the pool), up to the last block a query of this program can see (causal skip)
    last_q = seq_len - q_len + tl.minimum(qb * TOKENS + TOKENS, q_len) - 1
    per_part = tl.cdiv(tl.cdiv(seq_len, BS), tl.num_programs(2))
    first = part * per_part
    for index in range(first, tl.minimum(first + per_part, last_q // BS + 1)):
        pos_k = index * BS + t
        live = pos_k < seq_len
        block = tl.load(table_ptr + b * max_blocks + index, mask=index < max_blocks, other=0)
        slot = kv_read.pool_row(layer, num_blocks, block, t, h, HKV, BS)
        k = _dequant(k_ptr, ks_ptr, slot, live, BS, D)
        v = _dequant(v_ptr, vs_ptr, slot, live, BS, D)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        visible = (pos_k[None, :] <= pos_q[:, None]) & live[None, :] & row_ok[:, None]
        s = tl.where(visible, s, _NEG)
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.where(visible, tl.exp(s - m_new[:, None]), 0.0)
        alpha = tl.exp(m - m_new)
        lsum = lsum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m = m_new
    parts = tl.num_programs(2)
    out_row = (b * q_len + tok) * HQ + head
    # a partition past the sequence's blocks found nothing (lsum 0): the merge skips it, unread
    tl.store(o_ptr + (out_row * parts + part)[:, None] * D + d[None, :], acc, mask=(row_ok & (lsum > 0))[:, None])
    tl.store(m_ptr + out_row * parts + part, m, mask=row_ok)
    tl.store(l_ptr + out_row * parts + part, lsum, mask=row_ok)


@triton.jit(do_not_specialize=["parts"])  # compiled per power of two (P2), not per partition count
def _merge_kernel(o_ptr, m_ptr, l_ptr, out_ptr, gate_ptr, gate_t, gate_h, HQ, parts,
                  P2: tl.constexpr, D: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr):
    launch_dependents(PDL)  # the output projection's GEMV streams its weights meanwhile
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    p = tl.arange(0, P2)
    ok = p < parts
    m = tl.load(m_ptr + row * parts + p, mask=ok, other=_NEG)
    lsum = tl.load(l_ptr + row * parts + p, mask=ok, other=0.0)
    weight = tl.where(lsum > 0, tl.exp(m - tl.max(m, 0)), 0.0)
    d = tl.arange(0, D)
    acc = tl.load(o_ptr + (row * parts + p)[:, None] * D + d[None, :], mask=(ok & (lsum > 0))[:, None], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(lsum * weight, 0)
    if GATED:  # layers.output_gate on the output cast to the activation dtype, rounded where torch rounds
        dtype = out_ptr.dtype.element_ty
        g = tl.load(gate_ptr + (row // HQ) * gate_t + (row % HQ) * gate_h + d).to(tl.float32)
        out = _round(out, dtype) * _round(tl.sigmoid(g), dtype)
    tl.store(out_ptr + row * D + d, out.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"))


# Programs a launch aims at when it splits sequences over partitions, and the partial kernel's warps.
# 256 programs of 4 warps (one partition per 8 KV heads at C = 1: 64): two programs share an SM, so one's
# loads overlap the other's arithmetic. At 8 warps the kernel takes ~200 registers a thread, one program an
# SM, and Triton's cp.async pipeline waits for each block before computing on it (DEPBAR 0 at the loop's top
# in its SASS): a lone program alternates loading and computing. H100, stop 31, bench_kernels' attention
# sweep (the 27B's 16 layers in a CUDA graph, tables as wide as a 4,096-block pool), us a layer, C = 1 at
# 100K tokens: 187.4 at 128 programs of 8 warps with the old fp32 dequantization, 123.9 at 256 of 4, 96.1
# with _dequant as well (2.2 TB/s, 73% of copy); at 32K 68.2 -> 39.7, C = 8 at 32K 458.0 -> 218.3; at 600
# tokens 9.0 -> 10.1 (~18 us a token). 384 and 512 programs and 8 warps were slower, Triton's stages 2 and
# 4 no faster; a next-block register prefetch at 128 x 8 warps (54.5 at 32K) lost to the two programs. Stop
# 30: 1,024 programs were 3x slower than 128 at 600 tokens (each partition writes a [16, D] fp32 partial
# that the merge reads back).
TARGET_PROGRAMS = 256


def _partitions(programs: int, max_blocks: int, target_programs: int = TARGET_PROGRAMS) -> int:
    """Split each sequence's blocks over partitions (flash-decoding) only while there are too few
    programs to fill the GPU: decode (one query block) gets several, a long prefill chunk one, so its
    partial results stay the size of its output. At most one partition per block of the table."""
    return max(1, min(max_blocks, target_programs // programs))


def _tokens_per_program(q_len: int, group: int) -> int:
    """Query tokens a program takes: as many as fill 64 rows with their GQA group's heads."""
    return max(1, min(q_len, 64 // group))


def paged_attention(q: torch.Tensor, pool: BlockPool, layer: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    tokens_per_program: int | None = None, parts: int | None = None,
                    gate: torch.Tensor | None = None, partial_options: dict | None = None,
                    one_shape: bool = False) -> torch.Tensor:
    """q [B, q_len, Hq, D] (bf16/fp16) over an INT8 pool -> [B, q_len, Hq, D] float32.
    `block_tables` int32 [B, max_blocks] (padding entries any valid block), `seq_lens` int32 [B].
    `gate` [B * q_len, Hq, D] (any strides but the last): the output then is layers.output_gate of it,
    in q's dtype (the merge does it: at decode three small kernels fewer per layer).
    `partial_options`: Triton launch options (num_warps, num_stages) for the partial kernel in place of
    the defaults (tools/bench_kernels.py --attention-sweep compares them).
    `one_shape`: the same compiled kernels whatever q_len and the table's width (64 rows of queries a
    program, TARGET_PROGRAMS / kv heads partitions, empty ones skipped) - for eager short chunks, whose
    lengths vary from request to request: each new shape would be a Triton compile inside some request's
    first token. Captured steps keep the shape that fits them best (they are compiled at capture)."""
    if pool.layout.dtype != "int8":
        raise ValueError("the Triton path reads the INT8 group-64 pool")
    bsz, q_len, hq, dim = q.shape
    hkv, bs = pool.layout.kv_heads, pool.layout.block_size
    group = hq // hkv
    if one_shape:
        tokens_per_program, parts = max(1, 64 // group), max(1, TARGET_PROGRAMS // hkv)
    tokens = tokens_per_program or _tokens_per_program(q_len, group)
    rows = max(16, triton.next_power_of_2(tokens * group))
    max_blocks = block_tables.shape[1]
    q_blocks = triton.cdiv(q_len, tokens)
    parts = parts or _partitions(bsz * q_blocks * hkv, max_blocks)
    o = torch.empty(bsz * q_len * hq * parts, dim, dtype=torch.float32, device=q.device)
    m = torch.empty(bsz * q_len * hq * parts, dtype=torch.float32, device=q.device)
    lsum = torch.empty_like(m)
    _partial_kernel[(bsz * q_blocks, hkv, parts)](
        q.contiguous(), pool.k, pool.v, pool.k_scale, pool.v_scale, block_tables, seq_lens, o, m, lsum,
        layer, pool.num_blocks, max_blocks, q_len, dim ** -0.5, HQ=hq, HKV=hkv, D=dim, BS=bs,
        TOKENS=tokens, ROWS=rows, **({"num_warps": 4} | (partial_options or {})), **programmatic(q.device))
    out = torch.empty(bsz * q_len * hq, dim, dtype=torch.float32 if gate is None else q.dtype, device=q.device)
    if gate is not None:
        assert gate.shape == (bsz * q_len, hq, dim) and gate.stride(-1) == 1
    g = gate if gate is not None else out
    _merge_kernel[(bsz * q_len * hq,)](o, m, lsum, out, g, g.stride(0), g.stride(1) if gate is not None else 0, hq,
                                       parts, P2=triton.next_power_of_2(parts), D=dim, GATED=gate is not None,
                                       **programmatic(q.device))
    return out.view(bsz, q_len, hq, dim)
