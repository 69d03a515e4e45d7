"""Token sampling (temperature, top-k, top-p, seeds) and the lossless acceptance rule for drafts.

MTP drafts are argmax tokens, i.e. a point-mass draft distribution q = 1{d}. Leviathan et al.'s
rule then reads: accept d with probability p(d); on rejection sample from the residual
max(p - q, 0), which is p with d removed, renormalized. The accepted-or-resampled token is
distributed exactly as p (tests/run/test_sampling.py checks it statistically). Greedy (temperature
0) accepts iff d is the argmax.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

# Whether a CUDA top-k draw runs as one kernel after the vocabulary's top-k (kernels/sample_draw.py) or as
# this module's torch ops. Read at each call (tools/bench.py --ab-fused-draw flips it).
FUSED_DRAW = os.environ.get("NINFER_FUSED_DRAW", "1") != "0"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def distribution(self) -> SamplingParams:
        """These params without their seed: what rows drawn together must share (the seed only seeds a row's
        own generator; grouping by the whole params drew a batch of seeded agents row by row, stop 43)."""
        return replace(self, seed=None)


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from, for a logits row or each row of [n, V]: softmax(logits / T)
    restricted to top-k / top-p, where the logits are (a GPU sorts a 248K vocabulary in ~0.1 ms, a CPU core
    in ~15 ms) and without a host wait."""
    if params.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return _restricted(torch.softmax(logits.float() / params.temperature, dim=-1), params)


def _restricted(p: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax probabilities p restricted to top-k (ties with the k-th kept) and top-p, renormalised."""
    if params.top_k:
        kth = torch.topk(p, min(params.top_k, p.shape[-1]), dim=-1).values[..., -1:]
        p = torch.where(p >= kth, p, torch.zeros_like(p))
    if params.top_p < 1.0:
        p = _top_p(p, params.top_p)
    return p / p.sum(-1, keepdim=True)


def _top_p(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """p without the tokens past the smallest most-probable set holding top_p of its mass (equal
    probabilities in token order: a stable sort, so which of a tie top-p keeps is defined)."""
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
    keep = torch.cumsum(sorted_p, -1) - sorted_p < top_p * sorted_p.sum(-1, keepdim=True)
    return torch.where(torch.zeros_like(keep).scatter_(-1, order, keep), p, torch.zeros_like(p))


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """probs on the host: speculative acceptance reads single probabilities there."""
    return probs(logits.cpu(), params)


def _to(device: torch.device, values: list, dtype: torch.dtype) -> torch.Tensor:
    """A few host values on `device`; to a GPU from pinned memory, so the host does not wait for the stream
    (as kv.pool.BlockPool.device_table does for block tables)."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _uniforms(device: torch.device, generators: list[torch.Generator | None]) -> torch.Tensor:
    return _to(device, [float(torch.rand((), generator=g)) for g in generators], torch.float64)


def _inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The index in each row of p [n, m] (in token order) whose CDF interval holds u * the row's total."""
    cdf = torch.cumsum(p, -1, dtype=torch.float64)
    return torch.searchsorted(cdf, cdf[:, -1:] * u[:, None], right=True).squeeze(1).clamp_(max=p.shape[-1] - 1)


def draw(p: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One index from each row of distributions p [n, V] (on any device; [n] there) by the inverse CDF of one
    uniform from that row's host generator: a seed draws the same way wherever p is, and nothing waits for
    the GPU (the uniforms travel from pinned memory)."""
    return _inverse_cdf(p, _uniforms(p.device, generators))


# Candidates a top-k row keeps beyond its k: logits tied with the k-th value are kept (as transformers'
# and vLLM's top-k do), up to this many more.
TOP_K_TIES = 64


def top_k_candidates(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """probs(logits, params) of rows [n, V] with top-k, on their k + TOP_K_TIES highest logits only: (their
    token ids in token order, their probabilities) [n, k + TOP_K_TIES]. One top-k pass over the vocabulary
    instead of a softmax, a sort, a scan and masks over all of it (a 248K vocabulary at T 0.6 / top-p 0.95 /
    top-k 20: a sampled C = 1 step took 0.37 ms more than a greedy one on an H100, stop 40, the graphs equal;
    a row on a CPU core 7.9 -> 1.3-2.2 ms; an H100, stop 41's probe: eight rows 1.25 -> 0.46-0.53 ms a call, one
    row 0.37-0.47 -> 0.51-0.53 ms, there bound by the host's launches in both paths; tools/bench_sampling.py). The same
    distribution as the full computation (softmax is monotone, so the k-th probability is the k-th logit's; the
    normalisation cancels in the top-p rule; ties in token order in both) - except where more than TOP_K_TIES
    logits tie with the k-th, whose excess ties are left out."""
    values, index = torch.topk(logits.float(), _candidates(params, logits.shape[-1]), dim=-1)
    index, order = torch.sort(index, dim=-1)  # token order, as over the whole vocabulary (ties, the CDF)
    return index, _restricted(torch.softmax(values.gather(-1, order) / params.temperature, dim=-1), params)


def _candidates(params: SamplingParams, vocab: int) -> int:
    """How many of a top-k row's highest logits it draws from: k and TOP_K_TIES more, at most the vocabulary."""
    return min(params.top_k + TOP_K_TIES, vocab)


def sampled_probs(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What rows [n, V] with one non-greedy setting draw from: (token ids, probabilities) of the top-k
    candidates where the setting has top-k (top_k_candidates), else (None, probs over the vocabulary: an
    entry's index is its token)."""
    return top_k_candidates(logits, params) if params.top_k else (None, probs(logits, params))


def draw_sampled(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> torch.Tensor:
    """draw(probs(logits, params), generators) for rows [n, V] with one non-greedy setting, from sampled_probs:
    for a seed the same token either way (the CDF runs in token order over the candidates, as over the
    vocabulary). On CUDA a top-k setting's draw after the vocabulary's top-k is one kernel
    (kernels/sample_draw.py; this torch path is its reference)."""
    if params.top_k and logits.is_cuda and FUSED_DRAW:
        from .kernels import sample_draw

        candidates = _candidates(params, logits.shape[-1])
        if sample_draw.fits(candidates):
            values, index = torch.topk(logits, candidates, dim=-1)
            return sample_draw.draw(values.float(), index, _uniforms(logits.device, generators), params.temperature,
                                    min(params.top_k, candidates), params.top_p)
    tokens, p = sampled_probs(logits, params)
    picked = draw(p, generators)
    return picked if tokens is None else tokens.gather(-1, picked[:, None]).squeeze(1)


def sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(draw(p[None], [generator])[0])


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from a logits row, computed where the logits are (on a GPU only the index crosses to
    the host, not a vocabulary-sized row)."""
    if params.greedy:
        return int(logits.argmax())
    return int(draw_sampled(logits[None], params, [generator])[0])


def next_token_ids(logits: torch.Tensor, params: list[SamplingParams],
                   generators: list[torch.Generator | None]) -> torch.Tensor:
    """next_token of each row of logits [B, V], left where the logits are ([B]), so an overlapped step can
    feed them to the next: the greedy rows' argmaxes in one launch, the sampled rows of each sampling
    setting drawn together, seeds apart (a batch of one client's agents shares one: then straight from the
    logits, with no argmax, row index, gather or scatter)."""
    settings = [p.distribution for p in params]
    if not settings[0].greedy and all(s == settings[0] for s in settings):
        return draw_sampled(logits, settings[0], generators)
    ids = logits.argmax(-1)
    for setting in dict.fromkeys(s for s in settings if not s.greedy):
        rows = [b for b, s in enumerate(settings) if s == setting]
        index = _to(logits.device, rows, torch.long)
        ids.index_copy_(0, index, draw_sampled(logits.index_select(0, index), setting, [generators[b] for b in rows]))
    return ids


def next_tokens(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None]) -> list[int]:
    """next_token_ids on the host: one device-to-host read for the batch (a read per row cost a step of 8
    eight waits for the GPU)."""
    return next_token_ids(logits, params, generators).tolist()


def accept_or_resample(p: torch.Tensor, draft: int, generator: torch.Generator | None,
                       tokens: torch.Tensor | None = None) -> tuple[bool, int]:
    """(True, draft) with probability p[draft]; else (False, a sample from p without draft). `tokens`: the
    token ids of p's entries where p covers only some (top_k_candidates), else p is over the vocabulary."""
    at = None if tokens is None else tokens == draft  # (masks: boolean indexing would wait for the GPU again)
    if float(torch.rand((), generator=generator)) < float(p[draft] if at is None else torch.where(at, p, 0.0).sum()):
        return True, draft
    if at is None:
        residual = p.clone()
        residual[draft] = 0.0
    else:
        residual = p.masked_fill(at, 0.0)
    total = float(residual.sum())
    if total <= 0.0:  # p was a point mass on draft (cannot be rejected then), kept for safety
        return True, draft
    picked = sample(residual / total, generator)
    return False, picked if tokens is None else int(tokens[picked])
