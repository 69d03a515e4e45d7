"""Token sampling (temperature, top-k, top-p, seeds) and the lossless acceptance rule for drafts.

MTP drafts are argmax tokens, i.e. a point-mass draft distribution q = 1{d}. Leviathan et al.'s
rule then reads: accept d with probability p(d); on rejection sample from the residual
max(p - q, 0), which is p with d removed, renormalized. The accepted-or-resampled token is
distributed exactly as p (tests/run/test_sampling.py checks it statistically). Greedy (temperature
0) accepts iff d is the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from: softmax(logits / T) restricted to top-k / top-p.
    On the host (one vocabulary row per token), where the seeded CPU generators draw."""
    logits = logits.cpu()
    if params.greedy:
        out = torch.zeros_like(logits, dtype=torch.float32)
        out[int(logits.argmax())] = 1.0
        return out
    p = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_k:
        kth = torch.topk(p, min(params.top_k, p.numel())).values[-1]
        p = torch.where(p >= kth, p, torch.zeros_like(p))
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(p, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p * sorted_p.sum()
        mask = torch.zeros_like(p, dtype=torch.bool)
        mask[order[keep]] = True
        p = torch.where(mask, p, torch.zeros_like(p))
    return p / p.sum()


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=generator))


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from a logits row. Greedy is the argmax taken where the logits are (on a GPU only the
    index crosses to the host, not a vocabulary-sized row); otherwise `sample(target_probs(...))`."""
    if params.greedy:
        return int(logits.argmax())
    return sample(target_probs(logits, params), generator)


def next_tokens(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None]) -> list[int]:
    """next_token of each row of logits [B, V]. The greedy rows' argmaxes come from one launch and one
    device-to-host read: per row, a batched step of 8 paid 8 launches and 8 waits for the GPU."""
    greedy = logits.argmax(-1).tolist() if any(p.greedy for p in params) else None
    return [greedy[b] if p.greedy else sample(target_probs(logits[b], p), g)
            for b, (p, g) in enumerate(zip(params, generators))]


def accept_or_resample(p: torch.Tensor, draft: int, generator: torch.Generator | None) -> tuple[bool, int]:
    """(True, draft) with probability p[draft]; else (False, a sample from p without draft)."""
    if float(torch.rand((), generator=generator)) < float(p[draft]):
        return True, draft
    residual = p.clone()
    residual[draft] = 0.0
    total = float(residual.sum())
    if total <= 0.0:  # p was a point mass on draft (cannot be rejected then), kept for safety
        return True, draft
    return False, sample(residual / total, generator)
