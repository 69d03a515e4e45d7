"""Dense Qwen3 (every layer full attention, plain-weight q/k RMSNorm, full RoPE), pure-torch reference.

Oracle: transformers' `modeling_qwen3.py`. Shares layers and the per-sequence state with the hybrid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers import add_rms_norm, linear, linear_group, rms_norm, rms_norm_rope, rope_once, swiglu_mlp
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

    def _attention(self, p: str, x: torch.Tensor, i: int, segments: Segments, rope) -> torch.Tensor:
        """`rope()` gives the rows' (cos, sin), shared by the forward's layers."""
        c, w = self.cfg, self.w
        t = x.shape[0]
        cos, sin = rope()
        q, k, v = linear_group(x, [w[p + f"{name}_proj.weight"] for name in "qkv"])
        q = rms_norm_rope(q.view(t, c.num_heads, c.head_dim), w[p + "q_norm.weight"], c.eps, 0.0, cos, sin)
        k = rms_norm_rope(k.view(t, c.num_kv_heads, c.head_dim), w[p + "k_norm.weight"], c.eps, 0.0, cos, sin)
        v = v.view(t, c.num_kv_heads, c.head_dim)
        return linear(attend(segments, i, q, k, v).reshape(t, -1), w[p + "o_proj.weight"])

    has_mtp = False

    def kv_layers(self) -> list[int]:
        return list(range(self.cfg.num_layers))

    def _run(self, tokens: torch.Tensor, segments: Segments) -> torch.Tensor:
        """Every layer over the rows of `segments` -> final-norm hidden [rows, H]; advances the states."""
        c, w = self.cfg, self.w
        x = F.embedding(tokens.to(w["model.embed_tokens.weight"].device), w["model.embed_tokens.weight"])
        rope = rope_once(lambda: rope_positions(segments), c.head_dim, c.rope_theta, x)
        pending = None  # the previous layer's MLP output: the next norm's fused kernel adds it to x
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            if pending is None:
                normed = rms_norm(x, w[p + "input_layernorm.weight"], c.eps, 0.0)
            else:
                x, normed = add_rms_norm(x, pending, w[p + "input_layernorm.weight"], c.eps, 0.0)
            x, y = add_rms_norm(x, self._attention(p + "self_attn.", normed, i, segments, rope),
                                w[p + "post_attention_layernorm.weight"], c.eps, 0.0)
            pending = swiglu_mlp(y, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
        advance(segments)
        return add_rms_norm(x, pending, w["model.norm.weight"], c.eps, 0.0)[1]

    @property
    def lm_head(self) -> torch.Tensor:
        return self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])

