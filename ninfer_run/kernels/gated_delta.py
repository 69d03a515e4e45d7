"""Gated DeltaNet recurrence: fla-core's Triton kernels on CUDA, the per-token torch loop as reference.

Inputs as Qwen3.5's layer produces them after its causal conv: q/k [T, Hk, Dk] (raw: both are
L2-normalised here and q scaled by Dk^-0.5, as transformers does), v [T, Hv, Dv], log-decay g and beta
[T, Hv], state [Hv, Dk, Dv] float32. Value head h reads key head
h // (Hv / Hk) (transformers' repeat_interleave; fla-core's "grouped value attention").

fla-core (flash-linear-attention's kernels, what vLLM and SGLang run) gives the chunked prefill form
and the fused recurrent decode step; it is optional (`pip install ninfer[gpu]`) and only used on CUDA.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _normalized(q, k, value_heads: int):
    """q/k L2-normalised in float32 (q also scaled by Dk^-0.5), repeated onto the value heads."""
    r = value_heads // k.shape[-2]
    return (_l2norm(q.float()).repeat_interleave(r, -2) * q.shape[-1] ** -0.5,
            _l2norm(k.float()).repeat_interleave(r, -2))


def _delta_step(s, q, k, v, g, beta):
    """One token of the gated delta rule on normalised inputs (any leading dims): -> (out, new state)."""
    s = s * g.exp()[..., None, None]
    delta = (v - (s * k[..., None]).sum(-2)) * beta[..., None]
    s = s + k[..., None] * delta[..., None, :]
    return (s * q[..., None]).sum(-2), s


def reference(q, k, v, g, beta, state, keep_steps: bool = False):
    """-> (out [T, Hv, Dv] float32, final state, [state after each token] if keep_steps)."""
    q, k = _normalized(q, k, v.shape[1])
    v, g, beta = v.float(), g.float(), beta.float()
    s = state
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    steps = []
    for j in range(v.shape[0]):
        out[j], s = _delta_step(s, q[j], k[j], v[j], g[j], beta[j])
        if keep_steps:
            steps.append(s)
    return out, s, steps


@functools.cache
def _fla():
    """fla-core's two entry points, or None when it (or a CUDA device) is missing."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def available(device: torch.device) -> bool:
    return device.type == "cuda" and _fla() is not None


def gated_delta_rule(q, k, v, g, beta, state, keep_steps: bool = False):
    """Same contract as `reference`; fla-core's kernels when `available`, else the reference.

    Prefill (T > 1, no per-token states wanted) takes the chunked kernel; decode and speculative
    verify (keep_steps: a rollback needs the state after every token) take the recurrent one, a
    token at a time in the verify case (T is the draft count + 1, a handful). The chunked kernel's out
    stays in v's dtype (its float32 sum rounded once, as the caller rounds the reference's): a float32
    copy and the cast back were two passes over [T, Hv, Dv] per layer and chunk."""
    if not available(v.device):
        return reference(q, k, v, g, beta, state, keep_steps)
    if v.shape[0] > 1 and not keep_steps:
        chunk, _ = _fla()
        out, final = chunk(*(t[None].contiguous() for t in (q, k, v)), g[None].float().contiguous(),
                           beta[None].float().contiguous(), initial_state=state[None], scale=q.shape[-1] ** -0.5,
                           use_qk_l2norm_in_kernel=True, output_final_state=True)
        return out[0], final[0], []
    outs, steps, s = [], [], state[None]
    for j in range(v.shape[0]):
        o, s = gated_delta_step(*(t[j : j + 1] for t in (q, k, v, g, beta)), s)
        outs.append(o)
        steps.append(s[0])
    return torch.cat(outs), s[0], steps if keep_steps else []


def step_reference(q, k, v, g, beta, states):
    """One token for each of B sequences: q/k [B, Hk, Dk], v [B, Hv, Dv], g/beta [B, Hv], states
    [B, Hv, Dk, Dv] -> (out [B, Hv, Dv] float32, new states). The reference's step, batched."""
    q, k = _normalized(q, k, v.shape[1])
    return _delta_step(states, q, k, v.float(), g.float(), beta.float())


def gated_delta_step(q, k, v, g, beta, states):
    """`step_reference`'s contract; fla-core's recurrent kernel (B sequences, one token each) on CUDA,
    whose output comes in v's dtype (the kernel rounds it there; a float32 copy would only be cast
    back by the caller: two more kernels per layer and token)."""
    if not available(v.device):
        return step_reference(q, k, v, g, beta, states)
    _, recurrent = _fla()  # by keyword: it takes gk/gv between g and beta
    out, final = recurrent(q=q[:, None].contiguous(), k=k[:, None].contiguous(), v=v[:, None].contiguous(),
                           g=g[:, None].float().contiguous(), beta=beta[:, None].float().contiguous(),
                           initial_state=states.contiguous(), scale=q.shape[-1] ** -0.5,
                           use_qk_l2norm_in_kernel=True, output_final_state=True)
    return out[:, 0], final


def gates_reference(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """Per-token gates: a, b [T, Hv] -> (log-decay -exp(A_log) * softplus(a + dt_bias), sigmoid(b)), float32."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid().float()


def gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """`gates_reference`'s contract; one Triton kernel on CUDA in bf16/fp16 (kernels/gdn_gates.py)."""
    if not a.is_cuda or b.dtype not in (torch.bfloat16, torch.float16):
        return gates_reference(a, b, a_log, dt_bias)
    from .gdn_gates import gdn_gates

    return gdn_gates(a, b, a_log, dt_bias)


def conv_silu_reference(x: torch.Tensor, history: torch.Tensor, weight: torch.Tensor,
                        sections: tuple[int, int, int] | None = None):
    """The layer's causal depthwise conv and SiLU over T rows x [T, C] after the K-1 inputs before them,
    history [K-1, C]; weight [C, 1, K] -> [T, C] in x's dtype (`sections`: its q, k, v column ranges, split)."""
    padded = torch.cat((history, x), dim=0)
    out = F.silu(F.conv1d(padded.T[None], weight, groups=weight.shape[0])[0].T)
    return torch.split(out, list(sections), dim=-1) if sections else out


def conv_silu(x: torch.Tensor, history: torch.Tensor, weight: torch.Tensor,
              sections: tuple[int, int, int] | None = None):
    """`conv_silu_reference`'s contract; one Triton kernel on CUDA (kernels/gdn_conv.py: no cat, one pass;
    with `sections`, each range written contiguous)."""
    if not x.is_cuda:
        return conv_silu_reference(x, history, weight, sections)
    from .gdn_conv import causal_conv_silu

    return causal_conv_silu(x, history, weight, sections)


MAX_PROJECTED_ROWS = 16  # decode rows (C <= 8, MTP verification) take the fused kernel; more, cuBLAS


def projection_fits(x: torch.Tensor, w_ab: torch.Tensor) -> bool:
    """Whether the fused projected-gates kernels (gdn_gates.projected_gates, gdn_decode.conv_gates_step)
    take these rows: at most MAX_PROJECTED_ROWS of them, the stacked weights in their dtype."""
    return x.shape[0] <= MAX_PROJECTED_ROWS and w_ab.dtype == x.dtype


def projected_gates_reference(x: torch.Tensor, w_ab: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """The gates of a, b = x @ [W_a; W_b]^T (the stacked bf16 in_proj_a/b [2 Hv, K])."""
    a, b = F.linear(x, w_ab).split(w_ab.shape[0] // 2, dim=-1)
    return gates(a, b, a_log, dt_bias)


def projected_gates(x: torch.Tensor, w_ab: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor):
    """`projected_gates_reference`'s contract; decode rows on CUDA in bf16/fp16: projection and gates as one
    Triton kernel (kernels/gdn_gates.py)."""
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16) or not projection_fits(x, w_ab):
        return projected_gates_reference(x, w_ab, a_log, dt_bias)
    from .gdn_gates import projected_gates as fused

    return fused(x, w_ab, a_log, dt_bias)
