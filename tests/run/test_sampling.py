"""Sampling and speculative rejection sampling keep the target distribution (statistical tests)."""

import dataclasses

import pytest
import torch
from scipy.stats import chisquare

from ninfer_run import sampling
from ninfer_run.sampling import SamplingParams, accept_or_resample, next_token, next_tokens, target_probs
from ninfer_run.spec import generate, generate_greedy, generate_speculative
from ninfer_run.state import SequenceState


def test_top_k_top_p_temperature():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    assert target_probs(logits, SamplingParams()).tolist() == [1, 0, 0, 0, 0]
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (p[2:] == 0).all() and abs(float(p.sum()) - 1) < 1e-6
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert int((p > 0).sum()) == 1
    hot = target_probs(logits, SamplingParams(temperature=10.0))
    assert float(hot.max() - hot.min()) < 0.2


def test_next_tokens_of_a_batch_are_each_rows_next_token():
    """A batched step's rows: greedy ones (one argmax launch for all) and sampled ones (drawn together where
    they share a setting), each as next_token."""
    logits = torch.randn(7, 50, generator=torch.Generator().manual_seed(0))
    logits[3, 7] = logits[3, 9] = logits[3].max() + 1  # a tie: the first index, as next_token's
    top_k, top_p = SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=0.7, top_p=0.9)
    params = [SamplingParams(), top_k, SamplingParams(), SamplingParams(), top_p, top_k, top_p]
    batched = next_tokens(logits, params, [torch.Generator().manual_seed(b) for b in range(7)])
    rows = [next_token(logits[b], params[b], torch.Generator().manual_seed(b)) for b in range(7)]
    assert batched == rows and batched[3] == 7
    # every row one sampled setting (drawn straight from the logits): still each row's next_token
    same = [top_k] * 7
    assert next_tokens(logits, same, [torch.Generator().manual_seed(b) for b in range(7)]) == [
        next_token(logits[b], top_k, torch.Generator().manual_seed(b)) for b in range(7)]


def test_seeded_rows_of_one_setting_are_drawn_together(monkeypatch):
    """Rows that differ only in their seeds (each seeds its own generator) are one draw, not one a row (stop 42:
    a seeded C = 8 batch cost 1.8 ms a step more than greedy), and each row still gets its own seed's token;
    rows of another setting beside them are a second draw."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    setting = SamplingParams(temperature=0.8, top_p=0.9, top_k=10)
    other = SamplingParams(temperature=1.2)
    params = [dataclasses.replace(setting, seed=100 + b) for b in range(4)] + [other, other]
    draws, real = [], sampling.draw_sampled
    monkeypatch.setattr(sampling, "draw_sampled", lambda logits, params, gens: draws.append(params) or real(logits, params, gens))
    for batch, drawn in ((params[:4], [setting]), (params, [setting, other])):
        rows = [next_token(logits[b], p, torch.Generator().manual_seed(p.seed or 7)) for b, p in enumerate(batch)]
        draws.clear()
        gens = [torch.Generator().manual_seed(p.seed or 7) for p in batch]
        assert next_tokens(logits[: len(batch)], batch, gens) == rows
        assert draws == drawn


@pytest.mark.parametrize("params", [SamplingParams(0.6, 0.95, 20), SamplingParams(1.0, 1.0, 5), SamplingParams(0.7, 0.5, 50),
                                    SamplingParams(1.3, 0.9, 3000)])
def test_top_k_draws_are_the_full_distributions_draws(params):
    """draw_sampled (a top-k setting: its candidates only) gives each seed the token draw(probs(...)) gives over the whole
    vocabulary, rows with ties at the k-th logit (kept, as the full computation keeps them) included."""
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(params.top_k)) * 3
    kth = logits[1].topk(params.top_k).values[-1] if params.top_k < 3000 else logits[1].min()
    logits[1, torch.randperm(3000, generator=torch.Generator().manual_seed(1))[:12]] = kth  # ties at the k-th
    logits[2, :37] = logits[2].max() + 1  # ties at the top (37: no top-p cut falls on a tie exactly)
    for seed in range(150):
        fast = sampling.draw_sampled(logits, params, [torch.Generator().manual_seed(seed + 1000 * b) for b in range(4)])
        full = sampling.draw(sampling.probs(logits, params), [torch.Generator().manual_seed(seed + 1000 * b) for b in range(4)])
        assert fast.tolist() == full.tolist(), seed


def test_draws_follow_p_and_never_pick_a_zero_probability_token(monkeypatch):
    """The inverse-CDF draw: frequencies as p, and each uniform's token at the edges of its interval."""
    p = torch.tensor([0.0, 0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    g = torch.Generator().manual_seed(1)
    counts = torch.bincount(torch.tensor([sampling.sample(p, g) for _ in range(20000)]), minlength=7)
    assert counts[p == 0].sum() == 0 and chisquare(counts[p > 0].numpy(), (p[p > 0] * 20000).numpy()).pvalue > 1e-3
    for u, want in ((0.0, 2), (0.25, 4), (0.75, 5), (1 - 2**-24, 5)):
        monkeypatch.setattr(sampling.torch, "rand", lambda *a, u=u, **k: torch.tensor(u))
        assert sampling.sample(p, None) == want


@pytest.mark.parametrize("draft", [0, 3, 5])
def test_accept_or_resample_output_is_distributed_as_p(draft):
    p = torch.tensor([0.05, 0.3, 0.15, 0.2, 0.1, 0.2])
    g = torch.Generator().manual_seed(draft)
    counts = torch.zeros(6)
    for _ in range(20000):
        counts[accept_or_resample(p, draft, g)[1]] += 1
    assert chisquare(counts.numpy(), (p * 20000).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("draft", [2, 5, 9])  # a likely candidate, an unlikely one, one outside the candidates
def test_accept_or_resample_on_candidates_is_the_vocabularys(draft):
    """p given on some tokens only (top_k_candidates' form) accepts and resamples, seed for seed, as the same
    p over the whole vocabulary."""
    tokens = torch.tensor([1, 2, 4, 5, 7])
    p = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.3])
    whole = torch.zeros(12).index_copy_(0, tokens, p)
    for seed in range(300):
        got = accept_or_resample(p, draft, torch.Generator().manual_seed(seed), tokens)
        assert got == accept_or_resample(whole, draft, torch.Generator().manual_seed(seed)), seed


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("tiny-qwen3.5")


def _exact_joint(model, prompt, params, n) -> dict[tuple[int, ...], float]:
    """P(t1 .. tn) of plain sampling, every continuation enumerated (top-k keeps it small)."""
    _, logits = model.forward(prompt, SequenceState())
    joint = {(): 1.0}
    for _ in range(n):
        longer = {}
        for seq, p in joint.items():
            lg = logits if not seq else model.forward(torch.cat((prompt, torch.tensor(seq))), SequenceState())[1]
            step = target_probs(lg[-1], params)
            for t in step.nonzero().flatten().tolist():
                longer[(*seq, t)] = p * float(step[t])
        joint = longer
    return joint


@pytest.mark.parametrize("draft_tokens, n, runs, greedy_drafts", [(1, 2, 500, False), (2, 3, 800, True),
                                                                   (1, 3, 800, True)])
def test_speculative_sampling_keeps_the_joint_distribution(model, draft_tokens, n, runs, greedy_drafts):
    """P(t1 .. tn) under top-k 3 sampling, exact from the model vs speculative samples: the MTP head's drafts
    (random weights: rarely accepted), or the target's own greedy continuation (often accepted: t2 and t3
    from one verify's rows, or t3 the bonus token after an accepted draft)."""
    params = SamplingParams(temperature=1.0, top_k=3)
    prompt = torch.randint(0, 512, (6,), generator=torch.Generator().manual_seed(7))
    exact = _exact_joint(model, prompt, params, n)
    drafter = None if not greedy_drafts else (
        lambda k, out: generate_greedy(model, torch.cat((prompt, torch.tensor(out))), k))
    counts = dict.fromkeys(exact, 0)
    for seed in range(runs):
        out, _ = generate_speculative(model, prompt, n, draft_tokens, drafter=drafter,
                                      params=SamplingParams(1.0, 1.0, 3, seed))
        counts[tuple(out)] += 1
    keys = list(exact)
    total = sum(exact.values())  # 1 up to float32 rounding, which chisquare's sum check would trip on
    assert chisquare([counts[k] for k in keys], [exact[k] / total * runs for k in keys]).pvalue > 1e-3
    plain = generate(model, prompt, n, SamplingParams(1.0, 1.0, 3, 0))
    assert tuple(plain) in exact


def test_seeds_make_sampling_reproducible(model):
    prompt = torch.randint(0, 512, (5,), generator=torch.Generator().manual_seed(9))
    a = generate(model, prompt, 8, SamplingParams(0.8, 0.9, 20, 123))
    b = generate(model, prompt, 8, SamplingParams(0.8, 0.9, 20, 123))
    c = [generate(model, prompt, 8, SamplingParams(0.8, 0.9, 20, s)) for s in range(5)]
    assert a == b and any(x != a for x in c)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="device sampling on CUDA")
def test_device_sampling_waits_for_nothing_and_draws_as_the_host():
    """A 27B-vocabulary batch sampled on the GPU with no host synchronisation (an overlapped step feeds the
    tokens to the next one), each row's distribution as the host computes it and each seed's token the same."""
    from ninfer_run.sampling import next_token_ids, probs

    logits = torch.randn(4, 248_320, generator=torch.Generator().manual_seed(0)) * 3
    params = [SamplingParams(), SamplingParams(0.6, 0.95, 20), SamplingParams(0.6, 0.95, 20), SamplingParams(0.7, 0.8)]
    on_gpu = logits.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids = next_token_ids(on_gpu, params, [torch.Generator().manual_seed(b) for b in range(4)])
        one_setting = next_token_ids(on_gpu, params[1:3] * 2, [torch.Generator().manual_seed(b) for b in range(4)])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for b, p in enumerate(params):
        assert (probs(on_gpu[b], p).cpu() - probs(logits[b], p)).abs().max() < 1e-6
    assert ids.tolist() == next_token_ids(logits, params, [torch.Generator().manual_seed(b) for b in range(4)]).tolist()
    assert one_setting.tolist() == next_token_ids(logits, params[1:3] * 2,
                                                  [torch.Generator().manual_seed(b) for b in range(4)]).tolist()
