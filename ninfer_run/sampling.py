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


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from, for a logits row or each row of [n, V]: softmax(logits / T)
    restricted to top-k / top-p, where the logits are (a GPU sorts a 248K vocabulary in ~0.1 ms, a CPU core
    in ~15 ms) and without a host wait."""
    if params.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    p = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_k:
        kth = torch.topk(p, min(params.top_k, p.shape[-1]), dim=-1).values[..., -1:]
        p = torch.where(p >= kth, p, torch.zeros_like(p))
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        keep = torch.cumsum(sorted_p, -1) - sorted_p < params.top_p * sorted_p.sum(-1, keepdim=True)
        p = torch.where(torch.zeros_like(keep).scatter_(-1, order, keep), p, torch.zeros_like(p))
    return p / p.sum(-1, keepdim=True)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """probs on the host: speculative acceptance reads single probabilities there."""
    return probs(logits.cpu(), params)


def _to(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A few host values on `device`; to a GPU from pinned memory, so the host does not wait for the stream
    (as kv.pool.BlockPool.device_table does for block tables)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def draw(p: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One index from each row of distributions p [n, V] (on any device; [n] there) by the inverse CDF of one
    uniform from that row's host generator: a seed draws the same way wherever p is, and nothing waits for
    the GPU (the uniforms travel from pinned memory)."""
    u = _to(p.device, [float(torch.rand((), generator=g)) for g in generators], torch.float64)
    cdf = torch.cumsum(p, -1, dtype=torch.float64)
    return torch.searchsorted(cdf, cdf[:, -1:] * u[:, None], right=True).squeeze(1).clamp_(max=p.shape[-1] - 1)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(draw(p[None], [generator])[0])


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from a logits row, computed where the logits are (on a GPU only the index crosses to
    the host, not a vocabulary-sized row)."""
    if params.greedy:
        return int(logits.argmax())
    return sample(probs(logits, params), generator)


def next_token_ids(logits: torch.Tensor, params: list[SamplingParams],
                   generators: list[torch.Generator | None]) -> torch.Tensor:
    """next_token of each row of logits [B, V], left where the logits are ([B]), so an overlapped step can
    feed them to the next: the greedy rows' argmaxes in one launch, the sampled rows of each sampling
    setting drawn together (a batch of one client's agents shares one)."""
    ids = logits.argmax(-1)
    for setting in dict.fromkeys(p for p in params if not p.greedy):
        rows = [b for b, p in enumerate(params) if p == setting]
        index = _to(logits.device, rows, torch.long)
        ids.index_copy_(0, index, draw(probs(logits.index_select(0, index), setting), [generators[b] for b in rows]))
    return ids


def next_tokens(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None]) -> list[int]:
    """next_token_ids on the host: one device-to-host read for the batch (a read per row cost a step of 8
    eight waits for the GPU)."""
    return next_token_ids(logits, params, generators).tolist()


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
