"""Gated DeltaNet through fla-core's kernels against the per-token torch reference, on fresh random
inputs of the 27B's head layout (16 key heads, 48 value heads, 128 x 128): chunked prefill from a
non-zero state at lengths that are not multiples of the chunk, the decode step, and the per-token
states a speculative verify keeps."""

import pytest
import torch

from ninfer_run.kernels import gated_delta

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or gated_delta._fla() is None,
                                                 reason="fla-core's kernels need CUDA and fla-core")]

HK, HV, D = 16, 48, 128


def _inputs(t: int, seed: int, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device="cuda")

    q, k, v = rand(t, HK, D).to(dtype), rand(t, HK, D).to(dtype), rand(t, HV, D).to(dtype)
    decay = -torch.nn.functional.softplus(rand(t, HV)) * 0.5  # log decay <= 0, as -exp(A) softplus(a + dt)
    beta = rand(t, HV).sigmoid()
    state = rand(HV, D, D) * 0.1
    return q, k, v, decay, beta, state


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("t", [1, 63, 200, 1000])
def test_matches_reference(t):
    args = _inputs(t, seed=t)
    out, final, _ = gated_delta.gated_delta_rule(*args)
    ref_out, ref_final, _ = gated_delta.reference(*args)
    assert out.shape == ref_out.shape and final.shape == ref_final.shape
    # bf16 inputs, fp32 state: the chunked form reorders the sums (METHOD.md: bf16 paths within 1e-2)
    assert _rel(out, ref_out) < 1e-2, _rel(out, ref_out)
    assert _rel(final, ref_final) < 1e-2, _rel(final, ref_final)


def test_verify_keeps_every_state():
    args = _inputs(4, seed=7)
    _, final, steps = gated_delta.gated_delta_rule(*args, keep_steps=True)
    _, _, ref_steps = gated_delta.reference(*args, keep_steps=True)
    assert len(steps) == 4
    for s, r in zip(steps, ref_steps):
        assert _rel(s, r) < 1e-2
    assert torch.equal(final, steps[-1])


def test_batched_step_matches_reference():
    """One token of each of 8 sequences through fla-core's recurrent kernel vs the batched torch step."""
    seqs = [_inputs(1, seed=100 + b) for b in range(8)]
    q, k, v, decay, beta, state = (torch.cat([s[j] for s in seqs]) if j < 5 else torch.stack([s[j] for s in seqs])
                                   for j in range(6))
    out, new = gated_delta.gated_delta_step(q, k, v, decay, beta, state)
    ref_out, ref_new = gated_delta.step_reference(q, k, v, decay, beta, state)
    assert _rel(out, ref_out) < 1e-2 and _rel(new, ref_new) < 1e-2
