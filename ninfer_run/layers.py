"""Pure-torch reference layers shared by the model families (the oracle is transformers' own code).

Every function computes in float32 internally where transformers does, and casts back the way it
does, so logits match within float tolerance. Kernels will replace these; these stay as the
references the kernels are tested against.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

HALF = (torch.bfloat16, torch.float16)  # activation dtypes the fused CUDA kernels take


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """RMSNorm with weight (offset + w): offset 1 for Qwen3.5's zero-centred norms, 0 for plain ones.
    On CUDA in bf16/fp16 one fused kernel (kernels/norms.py), elsewhere `rms_norm_reference`."""
    if x.is_cuda and x.dtype in HALF:
        from .kernels import norms

        return norms.rms_norm(x, weight, eps, offset)
    return rms_norm_reference(x, weight, eps, offset)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """Qwen3.5 (`(1 + w)`): the product is taken in float32, then cast. Qwen3 (plain `w`): the
    normalized value is cast to the input dtype first, then scaled (transformers' order)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (normed * (offset + weight.float())).to(x.dtype)
    return weight.to(x.dtype) * normed.to(x.dtype)


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float,
                 offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, rms_norm(x + h)): a layer's residual add and the norm after it, one fused kernel on CUDA."""
    if x.is_cuda and x.dtype in HALF:
        from .kernels import norms

        return norms.add_rms_norm(x, h, weight, eps, offset)
    s = x + h
    return s, rms_norm_reference(s, weight, eps, offset)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated DeltaNet output norm; one fused kernel on CUDA (kernels/norms.py), else the reference."""
    if x.is_cuda and x.dtype in HALF:
        from .kernels import norms

        return norms.gated_rms_norm(x, gate, weight, eps)
    return gated_rms_norm_reference(x, gate, weight, eps)


def gated_rms_norm_reference(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-weight RMSNorm of x, times silu(gate) (computed in float32)."""
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return ((weight * normed) * F.silu(gate.float())).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype,
                 mrope_section: tuple[int, ...] | None = None):
    """cos/sin [T, rotary_dim] for NeoX-style (rotate_half) RoPE over the first rotary_dim dims.

    `positions` [T], or [3, T] (t, h, w) for interleaved M-RoPE: frequency j takes its position from
    axis 1 if j % 3 == 1 and j < 3 * section[1], axis 2 if j % 3 == 2 and j < 3 * section[2], else axis 0
    (transformers' Qwen3.5 `recomposition_frequencies`). Equal axes give plain RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=positions.device).float()
                                / rotary_dim))
    if positions.ndim == 1:
        freqs = positions.float()[:, None] * inv_freq[None, :]
    else:
        j = torch.arange(inv_freq.shape[0], device=positions.device)
        axis = torch.zeros_like(j)
        axis[(j % 3 == 1) & (j < 3 * mrope_section[1])] = 1
        axis[(j % 3 == 2) & (j < 3 * mrope_section[2])] = 2
        freqs = positions.float()[axis].T * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_once(positions, rotary_dim: int, theta: float, like: torch.Tensor, mrope_section: tuple[int, ...] | None = None):
    """-> a function giving rope_cos_sin(positions()) on `like`'s device and dtype, computed at its first
    call: every attention layer of a forward shares one."""
    return functools.cache(lambda: rope_cos_sin(positions().to(like.device), rotary_dim, theta, like.dtype,
                                                mrope_section))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; rotates the first cos.shape[-1] dims, passes the rest through (partial RoPE)."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    out = rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out, rest), dim=-1)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, cos: torch.Tensor,
                  sin: torch.Tensor) -> torch.Tensor:
    """An attention layer's q or k [T, H, D]: rms_norm, then apply_rope; one fused kernel on CUDA in
    bf16/fp16 (kernels/norms.py), where the two took ~14 small kernels."""
    if x.is_cuda and x.dtype in HALF:
        from .kernels import norms

        return norms.rms_norm_rope(x, weight, eps, offset, cos, sin)
    return apply_rope(rms_norm_reference(x, weight, eps, offset), cos, sin)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 offset: float, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An attention layer's rms_norm_rope of q [T, Hq, D] and of k [T, Hk, D]; one kernel for both on CUDA in
    bf16/fp16 (kernels/norms.py)."""
    if q.is_cuda and q.dtype in HALF and k.dtype == q.dtype:
        from .kernels import norms

        return norms.qk_norm_rope(q, k, q_weight, k_weight, eps, offset, cos, sin)
    return rms_norm_rope(q, q_weight, eps, offset, cos, sin), rms_norm_rope(k, k_weight, eps, offset, cos, sin)


class QKNorm(NamedTuple):
    """An attention layer's q/k RMSNorm and partial RoPE: qk_norm_rope's arguments after q and k (state.attend
    applies it; a captured step in the KV write's launch)."""
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    offset: float
    cos: torch.Tensor
    sin: torch.Tensor


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] (GQA); query i sits at absolute position q_offset + i."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * q.shape[-1] ** -0.5
    tq, tk = q.shape[0], k.shape[0]
    mask = torch.arange(tk, device=q.device)[None, :] > (torch.arange(tq, device=q.device)[:, None] + q_offset)
    scores = scores.masked_fill(mask[None], float("-inf"))
    probs = scores.softmax(-1).to(q.dtype)
    return torch.einsum("hqk,khd->qhd", probs, v)


def output_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Qwen3.5's gated attention: the attention output times sigmoid(gate), both in the activation dtype."""
    return o * torch.sigmoid(gate)


def linear(x: torch.Tensor, weight) -> torch.Tensor:
    """x @ W^T for a plain weight tensor; a quantized weight (kernels/linear.py) applies itself."""
    return F.linear(x, weight) if isinstance(weight, torch.Tensor) else weight(x)


def _quantized(weight, method: str):
    """A quantized weight's (kernels/linear.py QuantizedLinear) `method`, None for a plain tensor."""
    return None if isinstance(weight, torch.Tensor) else getattr(weight, method, None)


def _one_launch(x: torch.Tensor, weights: list, glu: bool = False) -> list[torch.Tensor] | None:
    """Quantized weights' shared launch (kernels/linear.py QuantizedLinear.group), None where they have none."""
    group = _quantized(weights[0], "group")
    return group(x, weights, glu=glu) if group is not None else None


def linear_group(x: torch.Tensor, weights: list) -> list[torch.Tensor]:
    """[linear(x, w) for w in weights] for weights that read the same x; quantized ones whose GEMVs can
    share one launch (kernels/linear.py: decode rows on the CUDA kernels) do."""
    out = _one_launch(x, weights)
    return out if out is not None else [linear(x, w) for w in weights]


def swiglu_mlp(x: torch.Tensor, gate, up, down) -> torch.Tensor:
    """down(SiLU(gate(x)) * up(x)); where a bulk GEMV takes the rows (NVFP4, or int4 in cuda_ops.INT4_BULK),
    gate, up and the activation are one launch (kernels/linear.py, glu), else silu_mul of the two."""
    fused = _one_launch(x, [gate, up], glu=True)
    return linear(fused[0] if fused is not None else silu_mul(*linear_group(x, [gate, up])), down)


def _norm_launch(x: torch.Tensor, h: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float,
                 weights: list, normed: bool, glu: bool = False) -> tuple | None:
    """Quantized weights' launch that stages the norm itself (kernels/linear.py group_after_norm; `glu`:
    and writes SiLU(gate) * up), None where they have none."""
    launch = _quantized(weights[0], "group_after_norm")
    return launch(x, h, weight, eps, offset, weights, normed, glu) if launch is not None else None


def add_rms_norm_linear_group(x: torch.Tensor, h: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float,
                              weights: list, normed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, list]:
    """A layer's residual add, its norm and the projections that read it: (s = x + h (x with h None),
    RMSNorm(s), [linear(RMSNorm(s), w) for w in weights]). Where the one-row NVFP4 GEMV stages the norm
    itself (kernels/linear.py group_after_norm) this is one launch, and the norm comes back only if
    `normed` (else None); otherwise add_rms_norm (or rms_norm), then linear_group."""
    fused = _norm_launch(x, h, weight, eps, offset, weights, normed)
    if fused is not None:
        return fused
    s, y = add_rms_norm(x, h, weight, eps, offset) if h is not None else (x, rms_norm(x, weight, eps, offset))
    return s, y, linear_group(y, weights)


def add_rms_norm_swiglu_mlp(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
                            gate, up, down) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, swiglu_mlp(RMSNorm(x + h))): the norm staged by gate and up's launch where it can be
    (add_rms_norm_linear_group; with the SiLU-mul too where that launch writes it: two GEMVs back to back),
    else add_rms_norm, then swiglu_mlp (whose own launch may take the SiLU-mul)."""
    done = _norm_launch(x, h, weight, eps, offset, [gate, up], normed=False, glu=True)
    if done is not None:
        s, _, (activated,) = done
        return s, linear(activated, down)
    done = _norm_launch(x, h, weight, eps, offset, [gate, up], normed=False)
    if done is None:
        s, y = add_rms_norm(x, h, weight, eps, offset)
        return s, swiglu_mlp(y, gate, up, down)
    s, _, (g, u) = done
    return s, linear(silu_mul(g, u), down)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up; one fused kernel on CUDA (kernels/activations.py), else the reference."""
    if gate.is_cuda and gate.dtype in HALF:
        from .kernels.activations import silu_mul as fused

        return fused(gate, up)
    return silu_mul_reference(gate, up)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up
