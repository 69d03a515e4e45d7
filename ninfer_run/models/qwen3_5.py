"""Qwen3.5-style hybrid (Gated DeltaNet + gated full attention + MTP), pure-torch reference.

Math as in shared/arch.md §4 and transformers' `modeling_qwen3_5.py` (the oracle): 3 GDN layers then
one gated attention layer, repeated; zero-centred (1 + w) RMSNorms; partial NeoX RoPE; the delta rule
through kernels/gated_delta.py (fla-core on CUDA, the per-token reference loop elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.gated_delta import gated_delta_rule
from ..layers import apply_rope, gated_rms_norm, linear, rms_norm, rope_cos_sin, swiglu_mlp
from ..state import SequenceState


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


class Model:
    """Weights are a name -> tensor dict (HF names); `forward` runs T new tokens of one sequence."""

    prefix = "model.language_model."

    def __init__(self, config: dict, entry: dict, weights: dict[str, torch.Tensor]):
        self.cfg = HybridConfig.from_config(config, entry["layer_pattern"])
        self.w = weights

    def _p(self, name: str) -> torch.Tensor:
        return self.w[self.prefix + name]

    def _gdn(self, i: int, x: torch.Tensor, state: SequenceState) -> torch.Tensor:
        c, p = self.cfg, f"layers.{i}.linear_attn."
        t = x.shape[0]
        qkv = linear(x, self._p(p + "in_proj_qkv.weight"))
        z = linear(x, self._p(p + "in_proj_z.weight")).view(t, c.v_heads, c.v_dim)
        b = linear(x, self._p(p + "in_proj_b.weight"))
        a = linear(x, self._p(p + "in_proj_a.weight"))
        # causal depthwise conv over [previous K-1 inputs | new inputs], then SiLU
        k = c.conv_kernel
        history = state.conv.get(i, torch.zeros(k - 1, qkv.shape[1], dtype=qkv.dtype, device=qkv.device))
        padded = torch.cat((history, qkv), dim=0)
        state.conv[i] = padded[-(k - 1):].clone()
        weight = self._p(p + "conv1d.weight")  # [C, 1, K], depthwise
        conv = F.silu(F.conv1d(padded.T[None], weight.to(padded.dtype), groups=weight.shape[0])[0].T)
        q, kk, v = torch.split(conv, [c.k_heads * c.k_dim, c.k_heads * c.k_dim, c.v_heads * c.v_dim], dim=-1)
        beta = b.sigmoid().float()
        g = -self._p(p + "A_log").float().exp() * F.softplus(a.float() + self._p(p + "dt_bias"))
        s = state.recurrent.get(i, torch.zeros(c.v_heads, c.k_dim, c.v_dim, device=x.device))
        out, state.recurrent[i], states = gated_delta_rule(
            q.view(t, c.k_heads, c.k_dim), kk.view(t, c.k_heads, c.k_dim), v.view(t, c.v_heads, c.v_dim), g, beta, s,
            keep_steps=state.keep_steps)
        if state.keep_steps:
            state.steps[i] = [(padded[j + 1 : j + k].clone(), s_j) for j, s_j in enumerate(states)]
        o = gated_rms_norm(out.to(x.dtype), z, self._p(p + "norm.weight"), c.eps)
        return linear(o.reshape(t, -1), self._p(p + "out_proj.weight"))

    def _attention(self, w, x: torch.Tensor, key: int, state: SequenceState) -> torch.Tensor:
        """Gated full attention; `w(name)` looks up this layer's tensors, `key` names its KV slot."""
        c = self.cfg
        t = x.shape[0]
        qg = linear(x, w("self_attn.q_proj.weight")).view(t, c.num_heads, 2 * c.head_dim)
        q, gate = qg[..., : c.head_dim], qg[..., c.head_dim :]
        q = rms_norm(q, w("self_attn.q_norm.weight"), c.eps, 1.0)
        k = rms_norm(linear(x, w("self_attn.k_proj.weight")).view(t, c.num_kv_heads, c.head_dim),
                     w("self_attn.k_norm.weight"), c.eps, 1.0)
        v = linear(x, w("self_attn.v_proj.weight")).view(t, c.num_kv_heads, c.head_dim)
        cos, sin = rope_cos_sin(state.rope_positions(t).to(x.device), c.rotary_dim, c.rope_theta, x.dtype,
                                c.mrope_section)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = state.kv.attend(key, state.length, q, k, v).reshape(t, -1)
        o = o * torch.sigmoid(gate.reshape(t, -1))
        return linear(o, w("self_attn.o_proj.weight"))

    def _layer(self, w, x: torch.Tensor, mixer) -> torch.Tensor:
        c = self.cfg
        x = x + mixer(rms_norm(x, w("input_layernorm.weight"), c.eps, 1.0))
        y = rms_norm(x, w("post_attention_layernorm.weight"), c.eps, 1.0)
        return x + swiglu_mlp(y, w("mlp.gate_proj.weight"), w("mlp.up_proj.weight"), w("mlp.down_proj.weight"))

    def forward(self, tokens: torch.Tensor, state: SequenceState, last_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [T] (the next T tokens) -> (final-norm hidden [T, H], logits [T, V]); updates `state`.
        `last_logits`: logits of the last token only ([1, V]; a prefill chunk needs no more)."""
        c = self.cfg
        embed = self._p("embed_tokens.weight")
        x = F.embedding(tokens.to(embed.device), embed)
        images = state.image_embeddings(tokens.shape[0])
        if images is not None:
            x[images[0].to(x.device)] = images[1].to(x.device, x.dtype)
        for i, kind in enumerate(c.layer_types):
            w = (lambda name, i=i: self._p(f"layers.{i}.{name}"))
            if kind == "linear_attention":
                x = self._layer(w, x, lambda h, i=i: self._gdn(i, h, state))
            else:
                x = self._layer(w, x, lambda h, i=i, w=w: self._attention(w, h, i, state))
        state.length += tokens.shape[0]
        state.last_forward = tokens.shape[0]
        hidden = rms_norm(x, self._p("norm.weight"), c.eps, 1.0)
        return hidden, linear(hidden[-1:] if last_logits else hidden, self.lm_head)

    @property
    def has_mtp(self) -> bool:
        return self.cfg.mtp_layers > 0 and "mtp.fc.weight" in self.w

    def mtp_forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor, state: SequenceState):
        """The MTP draft head: pairs (final-norm hidden h_t, token x_{t+1}) -> (its hidden, logits for
        x_{t+2}); own KV in `state`, positions those of h_t (vLLM's convention). As in vLLM, repeated
        draft steps reuse MTP layer 0 and feed its normed output back as the next hidden."""
        c, w = self.cfg, self.w
        embed = self._p("embed_tokens.weight")
        e = rms_norm(F.embedding(next_tokens.to(embed.device), embed), w["mtp.pre_fc_norm_embedding.weight"], c.eps, 1.0)
        h = rms_norm(hidden, w["mtp.pre_fc_norm_hidden.weight"], c.eps, 1.0)
        u = linear(torch.cat((e, h), dim=-1), w["mtp.fc.weight"])
        layer = (lambda name: w[f"mtp.layers.0.{name}"])
        u = self._layer(layer, u, lambda x: self._attention(layer, x, -1, state))
        state.length += next_tokens.shape[0]
        state.last_forward = next_tokens.shape[0]
        d = rms_norm(u, w["mtp.norm.weight"], c.eps, 1.0)
        return d, linear(d, self.lm_head)

    def kv_layers(self) -> list[int]:
        """Keys of the layers that keep KV (the full-attention layers)."""
        return [i for i, kind in enumerate(self.cfg.layer_types) if kind == "full_attention"]

    @property
    def device(self) -> torch.device:
        return self._p("embed_tokens.weight").device

    @property
    def lm_head(self) -> torch.Tensor:
        return self.w.get("lm_head.weight", self._p("embed_tokens.weight"))
