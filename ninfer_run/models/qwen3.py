"""Dense Qwen3 (every layer full attention, plain-weight q/k RMSNorm, full RoPE), pure-torch reference.

Oracle: transformers' `modeling_qwen3.py`. Shares layers and the per-sequence state with the hybrid.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers import QKNorm, add_rms_norm, add_rms_norm_linear_group, add_rms_norm_swiglu_mlp, linear, rope_once
from ..state import Segments, advance, attend, rope_positions
from .base import CausalLM


@dataclass(frozen=True)
class DenseConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    eps: float
    vocab_size: int

    @classmethod
    def from_config(cls, c: dict) -> DenseConfig:
        return cls(hidden_size=c["hidden_size"], num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                   num_kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
                   rope_theta=float(c["rope_parameters"]["rope_theta"]), eps=c["rms_norm_eps"], vocab_size=c["vocab_size"])


class Model(CausalLM):
    def __init__(self, config: dict, entry: dict, weights: dict[str, torch.Tensor]):
        self.cfg = DenseConfig.from_config(config)
        self.w = weights

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding table's)."""
        return self.w["model.embed_tokens.weight"].dtype

    @property
    def device(self) -> torch.device:
        return self.w["model.embed_tokens.weight"].device

    def _attention(self, p: str, project, i: int, segments: Segments, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """`project(weights)`: the layer's input add, norm and projections (layers.add_rms_norm_linear_group)
        -> (the residual stream, the attention's output); `rope()` gives the rows' (cos, sin), shared by the
        forward's layers."""
        c, w = self.cfg, self.w
        cos, sin = rope()
        x, _, (q, k, v) = project([w[p + f"{name}_proj.weight"] for name in "qkv"])
        t = q.shape[0]
        norm = QKNorm(w[p + "q_norm.weight"], w[p + "k_norm.weight"], c.eps, 0.0, cos, sin)
        q, (k, v) = q.view(t, c.num_heads, c.head_dim), (y.view(t, c.num_kv_heads, c.head_dim) for y in (k, v))
        return x, linear(attend(segments, i, q, k, v, qk_norm=norm).reshape(t, -1), w[p + "o_proj.weight"])

    has_mtp = False

    def kv_layers(self) -> list[int]:
        return list(range(self.cfg.num_layers))

    def _run(self, tokens: torch.Tensor, segments: Segments) -> torch.Tensor:
        """Every layer over the rows of `segments` -> final-norm hidden [rows, H]; advances the states."""
        c, w = self.cfg, self.w
        x = F.embedding(tokens.to(w["model.embed_tokens.weight"].device), w["model.embed_tokens.weight"])
        rope = rope_once(lambda: rope_positions(segments), c.head_dim, c.rope_theta, x)
        pending = None  # the previous layer's MLP output: the next norm adds it to x
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            project = functools.partial(add_rms_norm_linear_group, x, pending, w[p + "input_layernorm.weight"], c.eps, 0.0)
            x, out = self._attention(p + "self_attn.", project, i, segments, rope)
            x, pending = add_rms_norm_swiglu_mlp(x, out, w[p + "post_attention_layernorm.weight"], c.eps, 0.0,
                                                 w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                                                 w[p + "mlp.down_proj.weight"])
        advance(segments)
        return add_rms_norm(x, pending, w["model.norm.weight"], c.eps, 0.0)[1]

    @property
    def lm_head(self) -> torch.Tensor:
        return self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

