"""Greedy decoding with and without MTP speculative decoding (reference path, one sequence).

One speculative step: the drafter proposes N tokens; the target model verifies [last, d1..dN] in
one forward; the longest prefix of drafts that equals the target's own argmax is accepted, plus the
target's next token (the bonus), so every step yields 1..N+1 tokens and the output is exactly what
plain greedy decoding produces. The target's GDN state is rolled back to the accepted prefix from
the per-token states the verify forward kept; the MTP head re-reads the verified hidden states.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .sampling import SamplingParams, accept_or_resample, sample, sampled_probs, target_probs
from .state import SequenceState

GREEDY = SamplingParams()


@dataclass
class SpecStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


def _generator(params: SamplingParams) -> torch.Generator | None:
    return None if params.seed is None else torch.Generator().manual_seed(params.seed)


def generate(model, prompt: torch.Tensor, max_new: int, params: SamplingParams = GREEDY) -> list[int]:
    """Plain decoding, one target forward per token."""
    gen = _generator(params)
    state = SequenceState()
    _, logits = model.forward(prompt, state)
    out: list[int] = []
    while len(out) < max_new:
        out.append(sample(target_probs(logits[-1], params), gen))
        _, logits = model.forward(torch.tensor(out[-1:]), state)
    return out


def generate_greedy(model, prompt: torch.Tensor, max_new: int) -> list[int]:
    return generate(model, prompt, max_new, GREEDY)


class MTPDrafter:
    """Proposes tokens with the artifact's MTP head; keeps the head's KV in step with the target."""

    def __init__(self, model, kv=None, position_offset: int = 0):
        """`kv`: where the head keeps its KV (the engine's pool; a dense store by default).
        `position_offset`: the first position it will see (after a reused prefix it has no KV for)."""
        if not model.has_mtp:
            raise ValueError("this artifact has no MTP head (packed with --no-mtp, or the model has none)")
        self.model = model
        self.state = SequenceState(position_offset=position_offset, **({"kv": kv} if kv is not None else {}))
        self.hidden = self.logits = None

    def observe(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Feed verified target hidden states h_t with their successor tokens x_{t+1}."""
        d, logits = self.model.mtp_forward(hidden, next_tokens, self.state)
        self.hidden, self.logits = d[-1:], logits[-1]  # what the next proposal starts from

    def propose(self, n: int) -> list[int]:
        drafts, hidden, logits = [], self.hidden, self.logits
        start = self.state.length
        for _ in range(n):
            drafts.append(int(logits.argmax()))
            if len(drafts) == n:
                break
            hidden, lg = self.model.mtp_forward(hidden, torch.tensor(drafts[-1:]), self.state)
            logits = lg[-1]
        self.state.length = start  # speculative MTP positions are rewritten by the next observe()
        return drafts


def generate_speculative(model, prompt: torch.Tensor, max_new: int, draft_tokens: int,
                         drafter: Callable | None = None, params: SamplingParams = GREEDY) -> tuple[list[int], SpecStats]:
    """Same output distribution as `generate` (identical tokens when greedy), in fewer target
    forwards when drafts are accepted. `drafter(n, out) -> list[int]` overrides the MTP head."""
    gen = _generator(params)
    state = SequenceState()
    hidden, logits = model.forward(prompt, state)
    out = [sample(target_probs(logits[-1], params), gen)]
    mtp = None
    if drafter is None:
        mtp = MTPDrafter(model)
        mtp.observe(hidden, torch.cat((prompt[1:], torch.tensor(out))))
        drafter = lambda n, _out: mtp.propose(n)  # noqa: E731
    stats = SpecStats()
    while len(out) < max_new:
        drafts = drafter(min(draft_tokens, max_new - len(out)), out)
        new = verify_step(model.forward, state, out[-1], drafts, params, gen, stats)
        if mtp is not None:
            mtp.observe(state.verified_hidden, torch.tensor(new))
        out += new
    return out[:max_new], stats


def verify_step(forward, state: SequenceState, last: int, drafts: list[int], params: SamplingParams,
                gen: torch.Generator | None, stats: SpecStats) -> list[int]:
    """One target forward over [last, *drafts]: the accepted drafts plus one more token (1..N+1).
    Rolls `state` back to the accepted prefix and leaves its hidden states in state.verified_hidden.
    `forward(tokens, state) -> (hidden, logits)`: the model's, or a captured graph's (graphs.py)."""
    with keeping_steps([state]):
        hidden, logits = forward(torch.tensor([last, *drafts]), state)
    return accept(state, drafts, hidden, logits, params, gen, stats)


@contextmanager
def keeping_steps(states: list[SequenceState]):
    """The verify forward(s) inside keep each token's GDN state for the rollback; only they do: a
    prefill or a plain step keeps none (a prompt would otherwise keep one state per token)."""
    for state in states:
        state.keep_steps = True
    try:
        yield
    finally:
        for state in states:
            state.keep_steps = False


def accept(state: SequenceState, drafts: list[int] | torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor,
           params: SamplingParams, gen: torch.Generator | None, stats: SpecStats) -> list[int]:
    """The verify forward's rows (hidden, logits of [last, *drafts]) -> the accepted drafts and one
    more token; rolls `state` back to them (its per-token GDN states) and keeps their hidden states.
    `drafts` may still be on the device (graphed drafting): read here, with the argmaxes."""
    new: list[int] = []
    n = len(drafts)
    argmax = dist = tokens = None
    if params.greedy:  # the drafts and every row's argmax in one device-to-host read, not one per draft
        both = torch.cat([torch.as_tensor(drafts, device=logits.device), logits[: n + 1].argmax(-1)]).tolist()
        drafts, argmax = both[:n], both[n:]
    else:  # every row's distribution where the logits are, in one batch: only scalars cross to the host
        tokens, dist = sampled_probs(logits[: n + 1], params)  # (top-k: the candidates, tokens their ids)
        if isinstance(drafts, torch.Tensor):
            drafts = drafts.tolist()
    for j, d in enumerate(drafts):
        if argmax is not None:  # no randomness at all: accept iff the draft is the argmax
            token = argmax[j]
            ok = token == d
        else:
            ok, token = accept_or_resample(dist[j], d, gen, None if tokens is None else tokens[j])
        new.append(token)
        if not ok:
            break
    else:
        j = len(drafts)
        if argmax is not None:
            bonus = argmax[j]
        else:
            bonus = sample(dist[j], gen)
            bonus = bonus if tokens is None else int(tokens[j, bonus])
        new.append(bonus)
    accepted = len(new) - 1
    state.rollback(accepted + 1)
    state.verified_hidden = hidden[: accepted + 1]
    stats.steps += 1
    stats.drafted += len(drafts)
    stats.accepted += accepted
    return new
