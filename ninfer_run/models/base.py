"""What every model family shares: the two ways the engine runs a forward, over the family's `_run`
(its layers over row segments, returning final-norm hidden states) and its `lm_head`."""

from __future__ import annotations

import torch

from ..layers import linear
from ..state import Segments, SequenceState
from ..static_step import StaticBatch


class CausalLM:
    def _run(self, tokens: torch.Tensor, segments: Segments) -> torch.Tensor:
        raise NotImplementedError

    lm_head: torch.Tensor

    def forward(self, tokens: torch.Tensor, state: SequenceState, last_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [T] (the next T tokens) -> (final-norm hidden [T, H], logits [T, V]); updates `state`.
        `last_logits`: logits of the last token only ([1, V]; a prefill chunk needs no more)."""
        hidden = self._run(tokens, [(state, tokens.shape[0])])
        return hidden, linear(hidden[-1:] if last_logits else hidden, self.lm_head)

    def decode_batch(self, tokens: torch.Tensor, states: list[SequenceState]) -> torch.Tensor:
        """The next token of each of B sequences in one forward (weights read once): tokens [B] -> logits [B, V].
        Not for speculative decoding: its per-token rollback states are kept by `forward` only."""
        return self.decode_batch_rows(tokens, states)[1]

    def decode_batch_rows(self, tokens: torch.Tensor, states: list[SequenceState]) -> tuple[torch.Tensor, torch.Tensor]:
        """decode_batch -> (final-norm hidden [B, H], logits [B, V]) (an MTP head observes the hidden)."""
        if any(state.keep_steps for state in states):
            raise ValueError("batched decode is for sequences without speculative decoding")
        hidden = self._run(tokens, [(state, 1) for state in states])
        return hidden, linear(hidden, self.lm_head)

    def forward_static(self, batch: StaticBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of `batch` (graphs.GraphedDecoder captures this) -> (final-norm hidden, logits)."""
        hidden = self._run(batch.tokens, batch)
        return hidden, linear(hidden, self.lm_head)

    def gdn_state_shapes(self, dtype: torch.dtype) -> dict:
        """GDN layers' per-sequence state shapes (see qwen3_5); none in a model without them."""
        return {}
