"""Qwen3.5-style hybrid (Gated DeltaNet + gated full attention + MTP), pure-torch reference.

Math as in shared/arch.md §4 and transformers' `modeling_qwen3_5.py` (the oracle): 3 GDN layers then
one gated attention layer, repeated; zero-centred (1 + w) RMSNorms; partial NeoX RoPE; the delta rule
through kernels/gated_delta.py (fla-core on CUDA, the per-token reference loop elsewhere).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import static_step
from ..kernels.gated_delta import (
    conv_silu,
    conv_silu_reference,
    gated_delta_rule,
    gated_delta_step,
    gates,
    projected_gates,
    projection_fits,
)
from ..layers import (
    QKNorm,
    add_rms_norm,
    add_rms_norm_linear_group,
    add_rms_norm_swiglu_mlp,
    gated_rms_norm,
    linear,
    linear_group,
    rms_norm,
    rope_once,
)
from ..state import Segments, SequenceState, advance, attend, per_sequence, rope_positions
from ..static_step import StaticBatch
from .base import CausalLM


@dataclass(frozen=True)
class HybridConfig:
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    eps: float
    vocab_size: int
    mtp_layers: int
    mrope_section: tuple[int, ...] | None = None  # interleaved M-RoPE (prompts with images)

    @classmethod
    def from_config(cls, config: dict, layer_pattern: list[str]) -> HybridConfig:
        t = config["text_config"]
        rope = t["rope_parameters"]
        n = t["num_hidden_layers"]
        return cls(
            hidden_size=t["hidden_size"], num_layers=n,
            layer_types=tuple(layer_pattern[i % len(layer_pattern)] for i in range(n)),
            num_heads=t["num_attention_heads"], num_kv_heads=t["num_key_value_heads"], head_dim=t["head_dim"],
            rotary_dim=int(t["head_dim"] * rope.get("partial_rotary_factor", 1.0)), rope_theta=float(rope["rope_theta"]),
            k_heads=t["linear_num_key_heads"], v_heads=t["linear_num_value_heads"], k_dim=t["linear_key_head_dim"],
            v_dim=t["linear_value_head_dim"], conv_kernel=t["linear_conv_kernel_dim"], eps=t["rms_norm_eps"],
            vocab_size=t["vocab_size"], mtp_layers=t.get("mtp_num_hidden_layers", 0),
            mrope_section=_mrope_section(rope),
        )


def _mrope_section(rope: dict) -> tuple[int, ...] | None:
    section = rope.get("mrope_section")
    if section is not None and not rope.get("mrope_interleaved", False):
        raise ValueError("only interleaved M-RoPE is supported (rope_parameters.mrope_interleaved = true)")
    return tuple(section) if section is not None else None


def _store(held: dict[int, torch.Tensor], layer: int, value: torch.Tensor) -> None:
    """A sequence's new GDN state, written into the tensor it already has (so one that lives in the
    decode graphs' slab, graphs.py, stays there), or kept as its first one."""
    if layer in held:
        held[layer].copy_(value)
    else:
        held[layer] = value.clone()


class GateInputs(NamedTuple):
    """A GDN layer's gates before they are computed: in_proj_a/b's input rows and stacked weights, A_log and
    dt_bias (projected_gates' arguments)."""

    h: torch.Tensor
    w_ab: torch.Tensor
    a_log: torch.Tensor
    dt_bias: torch.Tensor


def _conv_takes_gates(segments: Segments, inputs: GateInputs) -> bool:
    """Whether the step's in-place conv kernel computes the layer's gates in its own launch
    (gdn_decode.conv_gates_step, NINFER_GDN_CONV_GATES): a static step whose GDN layers run in place,
    decode rows, gate weights in the rows' dtype."""
    if not (isinstance(segments, StaticBatch) and static_step.runs_in_place(inputs.h)):
        return False
    from ..kernels import gdn_decode  # Triton: GPU installs (and the CPU tests' interpreter)

    return gdn_decode.CONV_GATES and projection_fits(inputs.h, inputs.w_ab)


class Model(CausalLM):
    """Weights are a name -> tensor dict (HF names); `forward` runs T new tokens of one sequence,
    `decode_batch` one new token of each of several."""

    prefix = "model.language_model."

    def __init__(self, config: dict, entry: dict, weights: dict[str, torch.Tensor]):
        self.cfg = HybridConfig.from_config(config, entry["layer_pattern"])
        self.w = dict(weights)  # our own name -> tensor map (_fuse_gate_inputs re-points entries)
        self.gate_inputs = self._fuse_gate_inputs()

    def _fuse_gate_inputs(self) -> dict[int, torch.Tensor]:
        """Each GDN layer's in_proj_a and in_proj_b (both read x; tiny, kept in bf16) as one weight: one
        matmul per layer and step instead of two (at decode each is a split-K GEMV plus its reduce).
        The HF names stay, as views of it (no second copy)."""
        fused = {}
        for i, kind in enumerate(self.cfg.layer_types):
            names = [f"{self.prefix}layers.{i}.linear_attn.in_proj_{x}.weight" for x in "ab"]
            a, b = (self.w.get(name) for name in names)
            if kind == "linear_attention" and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                fused[i] = torch.cat((a, b))
                self.w[names[0]], self.w[names[1]] = fused[i].split(a.shape[0])
        return fused

    def _p(self, name: str) -> torch.Tensor:
        return self.w[self.prefix + name]

    def _gdn(self, i: int, project, segments: Segments) -> tuple[torch.Tensor, torch.Tensor]:
        """Gated DeltaNet layer i; `project(weights, normed)`: the layer's input add, norm and projections
        (layers.add_rms_norm_linear_group) -> (the residual stream, the layer's output)."""
        c, p = self.cfg, f"layers.{i}.linear_attn."
        x, h, (qkv, z) = project([self._p(p + "in_proj_qkv.weight"), self._p(p + "in_proj_z.weight")], normed=True)
        t = h.shape[0]
        z = z.view(t, c.v_heads, c.v_dim)
        if i in self.gate_inputs:  # bf16: projection and gates in one kernel for decode rows on CUDA
            inputs = GateInputs(h, self.gate_inputs[i], self._p(p + "A_log"), self._p(p + "dt_bias"))
            g, beta = (inputs, None) if _conv_takes_gates(segments, inputs) else projected_gates(*inputs)
        else:  # quantized (a profile that quantizes them)
            a, b = linear_group(h, [self._p(p + "in_proj_a.weight"), self._p(p + "in_proj_b.weight")])
            g, beta = gates(a, b, self._p(p + "A_log"), self._p(p + "dt_bias"))
        if isinstance(segments, StaticBatch):
            out = segments.gdn(i, qkv, g, beta, self._gdn_step, self._gdn_step_in_place)
        elif len(segments) > 1 and all(n == 1 for _, n in segments):
            out = self._gdn_decode_batch(i, qkv, g, beta, [state for state, _ in segments])
        else:
            out = per_sequence(segments, lambda state, *rows: self._gdn_sequence(i, *rows, state), qkv, g, beta)
        o = gated_rms_norm(out.to(h.dtype), z, self._p(p + "norm.weight"), c.eps)
        return x, linear(o.reshape(t, -1), self._p(p + "out_proj.weight"))

    @property
    def _qkv_sections(self) -> tuple[int, int, int]:
        """The widths of q, k and v in a GDN layer's conv channels."""
        c = self.cfg
        return c.k_heads * c.k_dim, c.k_heads * c.k_dim, c.v_heads * c.v_dim

    def _split_heads(self, conv: torch.Tensor | tuple[torch.Tensor, ...]):
        """conv [T, C] (or its q, k, v column ranges already apart) -> q, k, v by heads."""
        c = self.cfg
        q, k, v = conv if isinstance(conv, tuple) else torch.split(conv, list(self._qkv_sections), dim=-1)
        return (q.unflatten(-1, (c.k_heads, c.k_dim)), k.unflatten(-1, (c.k_heads, c.k_dim)),
                v.unflatten(-1, (c.v_heads, c.v_dim)))

    def _conv_weight(self, i: int, dtype: torch.dtype) -> torch.Tensor:
        return self._p(f"layers.{i}.linear_attn.conv1d.weight").to(dtype)  # [C, 1, K], depthwise

    def _zero_state(self, device) -> torch.Tensor:
        c = self.cfg
        return torch.zeros(c.v_heads, c.k_dim, c.v_dim, device=device)

    def _gdn_sequence(self, i: int, qkv, g, beta, state: SequenceState) -> torch.Tensor:
        """T tokens of one sequence: causal depthwise conv over [previous K-1 inputs | new], SiLU, delta rule."""
        k = self.cfg.conv_kernel
        history = state.conv.get(i, torch.zeros(k - 1, qkv.shape[1], dtype=qkv.dtype, device=qkv.device))
        # a verify (a few rows) keeps the torch form and every window; a chunk keeps only its last window
        conv = (conv_silu_reference if state.keep_steps else conv_silu)(qkv, history, self._conv_weight(i, qkv.dtype),
                                                                        self._qkv_sections)
        padded = torch.cat((history, qkv if state.keep_steps else qkv[-(k - 1):]), dim=0)
        _store(state.conv, i, padded[-(k - 1):])
        s = state.recurrent.get(i, self._zero_state(qkv.device))
        out, final, states = gated_delta_rule(*self._split_heads(conv), g, beta, s, keep_steps=state.keep_steps)
        _store(state.recurrent, i, final)
        if state.keep_steps:
            state.steps[i] = [(padded[j + 1 : j + k].clone(), s_j) for j, s_j in enumerate(states)]
        else:
            state.steps.pop(i, None)  # an earlier verify's states: no rollback may use them now
        return out

    def _gdn_decode_batch(self, i: int, qkv, g, beta, states: list[SequenceState]) -> torch.Tensor:
        """One token of each of B sequences: their conv windows and recurrent states stacked, one step."""
        zeros = torch.zeros(self.cfg.conv_kernel - 1, qkv.shape[1], dtype=qkv.dtype, device=qkv.device)
        zero = self._zero_state(qkv.device)
        out, conv, recurrent = self._gdn_step(i, qkv, g, beta, torch.stack([st.conv.get(i, zeros) for st in states]),
                                              torch.stack([st.recurrent.get(i, zero) for st in states]))
        for b, st in enumerate(states):
            _store(st.conv, i, conv[b])
            _store(st.recurrent, i, recurrent[b])
        return out

    def _gdn_step(self, i: int, qkv, g, beta, windows: torch.Tensor, recurrent: torch.Tensor):
        """One token per row: conv windows [B, K-1, C] and states [B, Hv, Dk, Dv] -> (out, new windows, new states)."""
        padded = torch.cat((windows, qkv[:, None]), dim=1)  # [B, K, C]
        weight = self._conv_weight(i, padded.dtype)
        conv = F.silu(F.conv1d(padded.transpose(1, 2), weight, groups=weight.shape[0])[..., 0])
        out, new = gated_delta_step(*self._split_heads(conv), g, beta, recurrent)
        return out, padded[:, 1:], new

    def _gdn_step_in_place(self, i: int, qkv, g, beta, windows: torch.Tensor, states: torch.Tensor,
                           slots: torch.Tensor, tokens: int = 1, keep=None) -> torch.Tensor:
        """`_gdn_step` over `tokens` rows per sequence on rows `slots` of the slab's windows and states,
        updated in place (GPU kernels); keep: (step windows, step states) to hold each token's states."""
        from ..kernels import gdn_decode  # Triton: GPU installs only

        keep_windows, keep_states = keep if keep is not None else (None, None)
        weight = self._conv_weight(i, qkv.dtype)
        if isinstance(g, GateInputs):  # the gates not yet computed: in the conv's launch (_conv_takes_gates)
            conv, g, beta = gdn_decode.conv_gates_step(qkv, windows, weight, slots, *g, tokens=tokens, keep=keep_windows)
        else:
            conv = gdn_decode.conv_step(qkv, windows, weight, slots, tokens, keep_windows)
        return gdn_decode.recurrent_step(conv, g, beta, states, slots, self.cfg.k_heads, tokens, keep_states)

    def _rope(self, segments: Segments, like: torch.Tensor):
        """-> the rows' RoPE (cos, sin) as layers.rope_once."""
        c = self.cfg
        return rope_once(lambda: rope_positions(segments), c.rotary_dim, c.rope_theta, like, c.mrope_section)

    def _attention(self, w, project, key: int, segments: Segments, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Gated full attention; `w(name)` looks up this layer's tensors, `project` as _gdn's, `key` names its
        KV slot, `rope()` gives the rows' (cos, sin)."""
        c = self.cfg
        cos, sin = rope()
        x, _, (qg, k, v) = project([w(f"self_attn.{name}_proj.weight") for name in "qkv"])
        t = qg.shape[0]
        qg = qg.view(t, c.num_heads, 2 * c.head_dim)
        q, gate = qg[..., : c.head_dim], qg[..., c.head_dim :]
        norm = QKNorm(w("self_attn.q_norm.weight"), w("self_attn.k_norm.weight"), c.eps, 1.0, cos, sin)
        k, v = (y.view(t, c.num_kv_heads, c.head_dim) for y in (k, v))
        return x, linear(attend(segments, key, q, k, v, gate, norm).reshape(t, -1), w("self_attn.o_proj.weight"))

    def _layer(self, w, x: torch.Tensor, pending: torch.Tensor | None, mixer) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer on the residual stream x + pending (the previous layer's MLP output, which
        input norm adds) -> (the stream before this layer's MLP output, that output). `mixer(project)`: the
        attention or GDN part, which adds and normalizes its input by `project` as it projects it (one launch
        where the GEMV stages the norm: layers.add_rms_norm_linear_group) -> (the stream, its output)."""
        c = self.cfg
        x, out = mixer(functools.partial(add_rms_norm_linear_group, x, pending, w("input_layernorm.weight"), c.eps, 1.0))
        return add_rms_norm_swiglu_mlp(x, out, w("post_attention_layernorm.weight"), c.eps, 1.0, w("mlp.gate_proj.weight"),
                                       w("mlp.up_proj.weight"), w("mlp.down_proj.weight"))

    def _run(self, tokens: torch.Tensor, segments: Segments) -> torch.Tensor:
        """Every layer over the rows of `segments` -> final-norm hidden [rows, H]; advances the states."""
        c = self.cfg
        embed = self._p("embed_tokens.weight")
        x = F.embedding(tokens.to(embed.device), embed)
        if isinstance(segments, list) and len(segments) == 1:  # prompts with images: one sequence at a time
            images = segments[0][0].image_embeddings(tokens.shape[0])
            if images is not None:
                x[images[0].to(x.device)] = images[1].to(x.device, x.dtype)
        rope, pending = self._rope(segments, x), None
        for i, kind in enumerate(c.layer_types):
            w = (lambda name, i=i: self._p(f"layers.{i}.{name}"))
            if kind == "linear_attention":
                x, pending = self._layer(w, x, pending, lambda project, i=i: self._gdn(i, project, segments))
            else:
                x, pending = self._layer(w, x, pending,
                                         lambda project, i=i, w=w: self._attention(w, project, i, segments, rope))
        advance(segments)
        return add_rms_norm(x, pending, self._p("norm.weight"), c.eps, 1.0)[1]

    @property
    def has_mtp(self) -> bool:
        return self.cfg.mtp_layers > 0 and "mtp.fc.weight" in self.w

    def mtp_forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor, state: SequenceState):
        """The MTP draft head: pairs (final-norm hidden h_t, token x_{t+1}) -> (its hidden, logits for
        x_{t+2}); own KV in `state`, positions those of h_t (vLLM's convention). As in vLLM, repeated
        draft steps reuse MTP layer 0 and feed its normed output back as the next hidden."""
        segments = [(state, next_tokens.shape[0])]
        out = self.mtp_rows(hidden, next_tokens, segments)
        advance(segments)
        return out

    def mtp_rows(self, hidden: torch.Tensor, next_tokens: torch.Tensor, segments: Segments):
        """mtp_forward over row segments, or a StaticBatch of the head's pool (a captured draft step)."""
        c, w = self.cfg, self.w
        embed = self._p("embed_tokens.weight")
        e = rms_norm(F.embedding(next_tokens.to(embed.device), embed), w["mtp.pre_fc_norm_embedding.weight"], c.eps, 1.0)
        h = rms_norm(hidden, w["mtp.pre_fc_norm_hidden.weight"], c.eps, 1.0)
        u = linear(torch.cat((e, h), dim=-1), w["mtp.fc.weight"])
        layer = (lambda name: w[f"mtp.layers.0.{name}"])
        u, pending = self._layer(layer, u, None,
                                 lambda project: self._attention(layer, project, -1, segments, self._rope(segments, u)))
        d = add_rms_norm(u, pending, w["mtp.norm.weight"], c.eps, 1.0)[1]
        return d, linear(d, self.lm_head)

    def gdn_state_shapes(self, dtype: torch.dtype) -> dict[int, tuple[tuple[int, ...], torch.dtype, tuple[int, ...]]]:
        """Per GDN layer: (conv window shape, its dtype, recurrent state shape) of one sequence."""
        c = self.cfg
        channels = 2 * c.k_heads * c.k_dim + c.v_heads * c.v_dim
        return {i: ((c.conv_kernel - 1, channels), dtype, (c.v_heads, c.k_dim, c.v_dim))
                for i, kind in enumerate(c.layer_types) if kind == "linear_attention"}

    def kv_layers(self) -> list[int]:
        """Keys of the layers that keep KV (the full-attention layers)."""
        return [i for i, kind in enumerate(self.cfg.layer_types) if kind == "full_attention"]

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding table's)."""
        return self._p("embed_tokens.weight").dtype

    @property
    def device(self) -> torch.device:
        return self._p("embed_tokens.weight").device

    @property
    def lm_head(self) -> torch.Tensor:
        return self.w.get("lm_head.weight", self._p("embed_tokens.weight"))
