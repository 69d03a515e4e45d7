"""The memory plan: what a configuration holds on the device, so start-up can refuse what does not fit.

KV is the pool alone (--max-context tokens, full-attention layers only, plus the MTP layer when
speculative decoding is on); Gated DeltaNet layers keep per-sequence recurrent (fp32) and conv state
instead, counted per running sequence, per speculative rollback slot and per prefix-cache frontier.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kv.pool import KVLayout


@dataclass(frozen=True)
class MemoryPlan:
    weights: int
    kv_pool: int
    sequence_state: int  # one sequence's GDN state
    running_states: int
    rollback_states: int
    frontier_states: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.running_states + self.rollback_states + self.frontier_states


def gdn_state_bytes(cfg) -> int:
    """Recurrent state (fp32 [Hv, Dk, Dv]) + conv history (bf16 [K-1, conv channels]) over all GDN layers."""
    layers = sum(1 for t in getattr(cfg, "layer_types", ()) if t == "linear_attention")
    channels = 2 * cfg.k_heads * cfg.k_dim + cfg.v_heads * cfg.v_dim if layers else 0
    per_layer = (cfg.v_heads * cfg.k_dim * cfg.v_dim * 4 + (cfg.conv_kernel - 1) * channels * 2) if layers else 0
    return layers * per_layer


def plan(cfg, weights_bytes: int, max_context: int, max_concurrency: int, kv_dtype: str = "int8",
         draft_tokens: int = 0, frontiers: int = 0, block_size: int = 64) -> MemoryPlan:
    attention_layers = sum(1 for t in getattr(cfg, "layer_types", ("full_attention",) * cfg.num_layers)
                           if t == "full_attention") + (1 if draft_tokens else 0)
    layout = KVLayout(attention_layers, cfg.num_kv_heads, cfg.head_dim, block_size, kv_dtype)
    blocks = -(-max_context // block_size)
    state = gdn_state_bytes(cfg)
    return MemoryPlan(
        weights=weights_bytes,
        kv_pool=blocks * block_size * layout.bytes_per_token,
        sequence_state=state,
        running_states=state * max_concurrency,
        rollback_states=state * (draft_tokens + 1) * max_concurrency if draft_tokens else 0,
        frontier_states=state * frontiers,
    )
