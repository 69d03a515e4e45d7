"""MTP speculative decoding (greedy): output identical to plain greedy decoding, whatever the drafts."""

import pytest
import torch

from ninfer_run.spec import MTPDrafter, generate_greedy, generate_speculative


@pytest.fixture(scope="module")
def models(tiny_model):
    return {model_id: tiny_model(model_id, "nvfp4") for model_id in ("tiny-qwen3.5", "tiny-qwen3")}


@pytest.mark.parametrize("draft_tokens", [1, 2, 3])
def test_mtp_greedy_equals_plain_greedy(models, draft_tokens):
    model = models["tiny-qwen3.5"]
    prompt = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(draft_tokens))
    plain = generate_greedy(model, prompt, 40)
    spec, stats = generate_speculative(model, prompt, 40, draft_tokens)
    assert spec == plain
    assert stats.drafted > 0 and 1.0 <= stats.tokens_per_step <= draft_tokens + 1


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
@pytest.mark.parametrize("draft_tokens", [1, 3])
def test_forced_acceptance_and_rejection_paths(models, model_id, draft_tokens):
    """A drafter that knows the answer (accept all), or is wrong every other token (partial accepts)."""
    model = models[model_id]
    prompt = torch.randint(0, 512, (7,), generator=torch.Generator().manual_seed(draft_tokens + 10))
    plain = generate_greedy(model, prompt, 30)

    def oracle(n, out):
        return plain[len(out) : len(out) + n]

    calls = []

    def half_wrong(n, out):  # every other step's last draft is wrong
        calls.append(n)
        drafts = oracle(n, out)
        return drafts[:-1] + [(drafts[-1] + 1) % 512] if len(calls) % 2 else drafts

    spec, stats = generate_speculative(model, prompt, 30, draft_tokens, drafter=oracle)
    assert spec == plain and stats.acceptance_rate == 1.0
    assert stats.steps <= -(-29 // (draft_tokens + 1)) + 1
    spec, stats = generate_speculative(model, prompt, 30, draft_tokens, drafter=half_wrong)
    assert spec == plain
    assert 0.0 < stats.acceptance_rate < 1.0


def test_no_mtp_head_is_a_clear_error(models):
    with pytest.raises(ValueError, match="no MTP head"):
        MTPDrafter(models["tiny-qwen3"])
