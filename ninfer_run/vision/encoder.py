"""The Qwen3.5 vision tower, pure torch (reference path; transformers' `Qwen3_5VisionModel` is the oracle).

Per image: a Conv3d patch embedding (here the equivalent matmul over flattened patches), a learned
square position table resampled bilinearly (align_corners) to the image's patch grid, `depth` ViT
blocks (LayerNorm, full bidirectional attention with 2-D axial RoPE over (row, col), GELU-tanh
MLP), then the merger: LayerNorm, each 2x2 block of patches concatenated, Linear-GELU-Linear into
the text model's hidden size. Patches arrive in spatial-merge-block order (preprocess.py), so a
merged token is 4 consecutive rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers import apply_rope

PREFIX = "model.visual."
ATTENTION_CHUNK = 1024  # queries per block of attention scores


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden: int
    heads: int
    patch: int
    temporal: int
    merge: int
    in_channels: int
    out_hidden: int
    position_side: int
    rope_theta: float

    @classmethod
    def from_config(cls, v: dict) -> VisionConfig:
        if v.get("deepstack_visual_indexes"):
            raise ValueError("deepstack vision features are not supported (the registered models have none)")
        return cls(depth=v["depth"], hidden=v["hidden_size"], heads=v["num_heads"], patch=v["patch_size"],
                   temporal=v["temporal_patch_size"], merge=v["spatial_merge_size"], in_channels=v["in_channels"],
                   out_hidden=v["out_hidden_size"], position_side=math.isqrt(v["num_position_embeddings"]),
                   rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)))


def merge_order_coords(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of each patch of an h x w grid, in spatial-merge-block order."""
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
    return rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1)


def _bilinear_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """align_corners bilinear: 2 source taps and weights per target index on one axis."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


class VisionTower:
    def __init__(self, cfg: VisionConfig, weights: dict[str, torch.Tensor]):
        self.cfg, self.w = cfg, weights

    @classmethod
    def from_config(cls, config: dict, weights: dict[str, torch.Tensor]) -> VisionTower:
        return cls(VisionConfig.from_config(config["vision_config"]), weights)

    def _p(self, name: str) -> torch.Tensor:
        return self.w[PREFIX + name]

    def _positions(self, h: int, w: int) -> torch.Tensor:
        side = self.cfg.position_side
        rows, cols = merge_order_coords(h, w, self.cfg.merge)
        rt, rw = _bilinear_taps(rows, h, side)
        ct, cw = _bilinear_taps(cols, w, side)
        table = self._p("pos_embed.weight")
        index = (rt[:, :, None] * side + ct[:, None, :]).reshape(-1, 4).to(table.device)
        weight = (rw[:, :, None] * cw[:, None, :]).reshape(-1, 4).to(table.device)
        return (F.embedding(index, table) * weight[..., None]).sum(1)

    def _rope(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = self.cfg.hidden // self.cfg.heads
        spatial = head_dim // 2
        inv_freq = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        rows, cols = merge_order_coords(h, w, self.cfg.merge)
        freqs = torch.cat((rows[:, None].float() * inv_freq, cols[:, None].float() * inv_freq), dim=-1)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, heads = x.shape[0], self.cfg.heads
        p = f"blocks.{i}.attn."
        q, k, v = F.linear(x, self._p(p + "qkv.weight"), self._p(p + "qkv.bias")).view(n, 3, heads, -1).unbind(1)

        q, k = (apply_rope(t.float(), cos, sin).to(t.dtype) for t in (q, k))  # full-width RoPE, in float32
        outs = []
        for start in range(0, n, ATTENTION_CHUNK):  # bounded scores memory for large images
            scores = torch.einsum("qhd,khd->hqk", q[start : start + ATTENTION_CHUNK].float(), k.float())
            probs = (scores * q.shape[-1] ** -0.5).softmax(-1).to(v.dtype)
            outs.append(torch.einsum("hqk,khd->qhd", probs, v))
        o = torch.cat(outs).reshape(n, -1)
        return F.linear(o, self._p(p + "proj.weight"), self._p(p + "proj.bias"))

    def _block(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        p = f"blocks.{i}."
        hidden = self.cfg.hidden
        y = F.layer_norm(x, (hidden,), self._p(p + "norm1.weight"), self._p(p + "norm1.bias"), 1e-6)
        x = x + self._attention(i, y, cos, sin)
        y = F.layer_norm(x, (hidden,), self._p(p + "norm2.weight"), self._p(p + "norm2.bias"), 1e-6)
        y = F.gelu(F.linear(y, self._p(p + "mlp.linear_fc1.weight"), self._p(p + "mlp.linear_fc1.bias")),
                   approximate="tanh")
        return x + F.linear(y, self._p(p + "mlp.linear_fc2.weight"), self._p(p + "mlp.linear_fc2.bias"))

    def forward(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One image: patches [t*h*w, C*T*p*p] -> embeddings [t*h*w / merge^2, out_hidden]."""
        c = self.cfg
        t, h, w = grid
        if t != 1:
            raise ValueError("still images only (t = 1)")
        weight = self._p("patch_embed.proj.weight")
        x = F.linear(pixels.to(weight.device, weight.dtype), weight.reshape(c.hidden, -1), self._p("patch_embed.proj.bias"))
        x = x + self._positions(h, w).to(x.dtype)
        cos, sin = (t.to(x.device) for t in self._rope(h, w))
        for i in range(c.depth):
            x = self._block(i, x, cos, sin)
        x = F.layer_norm(x, (c.hidden,), self._p("merger.norm.weight"), self._p("merger.norm.bias"), 1e-6)
        x = x.reshape(-1, c.hidden * c.merge * c.merge)
        x = F.gelu(F.linear(x, self._p("merger.linear_fc1.weight"), self._p("merger.linear_fc1.bias")))
        return F.linear(x, self._p("merger.linear_fc2.weight"), self._p("merger.linear_fc2.bias"))
