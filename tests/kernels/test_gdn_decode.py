"""The in-place GDN decode step (kernels/gdn_decode.py) against the torch step the model runs elsewhere
(gather the slots' windows and states, depthwise conv1d + SiLU, gated_delta.step_reference, scatter):
outputs within bf16/fp16 rounding, the slab rows of the batch updated the same way, every other row
untouched. On a CPU in Triton's interpreter (fp16, small heads); on a GPU the 27B's heads in bf16."""

import pytest
import torch
import torch.nn.functional as F

from ninfer_run.kernels import gated_delta

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import gdn_decode  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
HK, HV, D = (16, 48, 128) if DEVICE == "cuda" else (2, 4, 32)
KERNEL = 4


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _torch_step(x, windows, weight, states, slots, g, beta):
    """What StaticBatch.gdn + Qwen3_5._gdn_step do without the kernels (float32 conv on a CPU)."""
    padded = torch.cat((windows[slots], x[:, None]), dim=1)
    conv = F.silu(F.conv1d(padded.transpose(1, 2).float(), weight.float(), groups=weight.shape[0])[..., 0]).to(x.dtype)
    q, k, v = conv.split([HK * D, HK * D, HV * D], dim=-1)
    out, new = gated_delta.step_reference(q.unflatten(-1, (HK, D)), k.unflatten(-1, (HK, D)), v.unflatten(-1, (HV, D)),
                                          g, beta, states[slots])
    return conv, out, padded[:, 1:], new


@pytest.mark.parametrize("slots,value_block,warps", [([2], None, None), ([4, 0, 2], None, None), ([2], 32, 4),
                                                     ([4, 0, 2], 16, 1), ([2], 128, 8)])
def test_step_in_place_matches_torch(slots, value_block, warps):
    """value_block, warps: a program's Dv columns and Triton warps (None: the batch's defaults, 16 x 1
    for one sequence and 32 x 4 for three; bench_kernels --gdn-sweep tries the others)."""
    gen = torch.Generator().manual_seed(len(slots))
    c, n = 2 * HK * D + HV * D, 6
    x = torch.randn(len(slots), c, generator=gen).to(DEVICE, DTYPE)
    windows = torch.randn(n, KERNEL - 1, c, generator=gen).to(DEVICE, DTYPE)
    weight = (torch.randn(c, 1, KERNEL, generator=gen) * 0.5).to(DEVICE, DTYPE)
    states = (torch.randn(n, HV, D, D, generator=gen) * 0.1).to(DEVICE)
    g = (-F.softplus(torch.randn(len(slots), HV, generator=gen)) * 0.5).to(DEVICE)
    beta = torch.randn(len(slots), HV, generator=gen).sigmoid().to(DEVICE)
    index = torch.tensor(slots, device=DEVICE)
    conv_want, out_want, windows_want, states_want = _torch_step(x, windows, weight, states, index, g, beta)
    windows_before, states_before = windows.clone(), states.clone()

    conv = gdn_decode.conv_step(x, windows, weight, index)
    out = gdn_decode.recurrent_step(conv, g, beta, states, index, HK, value_block=value_block,
                                    launch_options=None if warps is None else {"num_warps": warps})

    assert _rel(conv, conv_want) < 4e-3  # one rounding of a float32 sum (order may differ)
    assert torch.equal(windows[index], windows_want)  # a shift by one row: exact
    assert out.shape == (len(slots), HV, D) and out.dtype == DTYPE
    assert _rel(out, out_want) < 1e-2  # METHOD.md: bf16 paths within 1e-2
    assert _rel(states[index], states_want) < 1e-2  # float32 state from conv rows that may differ by a bf16 ulp
    # the recurrence alone, from the kernel's own conv rows: float32 throughout
    q, k, v = conv.split([HK * D, HK * D, HV * D], dim=-1)
    _, exact = gated_delta.step_reference(q.unflatten(-1, (HK, D)), k.unflatten(-1, (HK, D)), v.unflatten(-1, (HV, D)),
                                          g, beta, states_before[index])
    assert _rel(states[index], exact) < 1e-5
    others = [s for s in range(n) if s not in slots]
    assert torch.equal(windows[others], windows_before[others]) and torch.equal(states[others], states_before[others])


@pytest.mark.parametrize("tokens", [2, 4])
def test_verify_steps_in_place_keep_every_state(tokens):
    """A verify's T tokens per sequence (rows sequence-major) vs the torch step run token by token, as
    StaticBatch.gdn does without the kernels: outputs, the final window and state, and the window and
    state after each token (what a rollback restores)."""
    slots, steps = [3, 1], 4
    gen = torch.Generator().manual_seed(10 + tokens)
    c, n, b = 2 * HK * D + HV * D, 5, len(slots)
    x = torch.randn(b * tokens, c, generator=gen).to(DEVICE, DTYPE)
    windows = torch.randn(n, KERNEL - 1, c, generator=gen).to(DEVICE, DTYPE)
    weight = (torch.randn(c, 1, KERNEL, generator=gen) * 0.5).to(DEVICE, DTYPE)
    states = (torch.randn(n, HV, D, D, generator=gen) * 0.1).to(DEVICE)
    g = (-F.softplus(torch.randn(b * tokens, HV, generator=gen)) * 0.5).to(DEVICE)
    beta = torch.randn(b * tokens, HV, generator=gen).sigmoid().to(DEVICE)
    index = torch.tensor(slots, device=DEVICE)
    keep_windows = torch.zeros(n, steps, KERNEL - 1, c, dtype=DTYPE, device=DEVICE)
    keep_states = torch.zeros(n, steps, HV, D, D, device=DEVICE)
    want_windows, want_states = windows.clone(), states.clone()

    conv = gdn_decode.conv_step(x, windows, weight, index, tokens, keep_windows)
    out = gdn_decode.recurrent_step(conv, g, beta, states, index, HK, tokens, keep_states)

    rows = x.view(b, tokens, c)
    for j in range(tokens):
        r = torch.arange(b) * tokens + j
        conv_want, out_want, window_j, state_j = _torch_step(rows[:, j], want_windows, weight, want_states, index,
                                                            g[r], beta[r])
        want_windows[index], want_states[index] = window_j, state_j
        assert _rel(conv[r], conv_want) < 4e-3 and _rel(out[r], out_want) < 1e-2, j
        assert torch.equal(keep_windows[index, j], window_j), j
        assert _rel(keep_states[index, j], state_j) < 1e-2, j
    assert torch.equal(windows, want_windows)  # the window after the last token, other slots untouched
    assert _rel(states[index], want_states[index]) < 1e-2
    others = [s for s in range(n) if s not in slots]
    assert torch.equal(states[others], want_states[others])
    assert not keep_windows[others].any() and not keep_states[:, tokens:].any()


@pytest.mark.parametrize("slots,tokens", [([2], 1), ([4, 0, 2], 1), ([3, 1], 3)])
def test_conv_gates_step_is_conv_step_and_projected_gates(slots, tokens):
    """The two kernels' programs in one launch give what the two launches give, bit for bit: the conv rows,
    the advanced windows, the windows kept after each token, and the gates (same code, same warps)."""
    from ninfer_run.kernels.gdn_gates import projected_gates

    gen = torch.Generator().manual_seed(20 + len(slots) + tokens)
    c, n, rows, k = 2 * HK * D + HV * D, 6, len(slots) * tokens, 320
    x = torch.randn(rows, c, generator=gen).to(DEVICE, DTYPE)
    windows = torch.randn(n, KERNEL - 1, c, generator=gen).to(DEVICE, DTYPE)
    weight = (torch.randn(c, 1, KERNEL, generator=gen) * 0.5).to(DEVICE, DTYPE)
    h = torch.randn(rows, k, generator=gen).to(DEVICE, DTYPE)
    w_ab = (torch.randn(2 * HV, k, generator=gen) * 2.4 / k**0.5).to(DEVICE, DTYPE)
    a_log = (torch.rand(HV, generator=gen) * 2.7).to(DEVICE, DTYPE)
    dt_bias = (torch.randn(HV, generator=gen) + 18).to(DEVICE, DTYPE)
    index = torch.tensor(slots, device=DEVICE)
    keep = torch.zeros(n, tokens, KERNEL - 1, c, dtype=DTYPE, device=DEVICE) if tokens > 1 else None
    windows_apart, keep_apart = windows.clone(), keep.clone() if keep is not None else None

    conv, g, beta = gdn_decode.conv_gates_step(x, windows, weight, index, h, w_ab, a_log, dt_bias, tokens, keep)
    conv_want = gdn_decode.conv_step(x, windows_apart, weight, index, tokens, keep_apart)
    g_want, beta_want = projected_gates(h, w_ab, a_log, dt_bias)

    assert torch.equal(conv, conv_want) and torch.equal(windows, windows_apart)
    assert keep is None or torch.equal(keep, keep_apart)
    assert g.shape == beta.shape == (rows, HV) and torch.equal(g, g_want) and torch.equal(beta, beta_want)
    with pytest.raises(ValueError, match="at most 16 rows"):
        gdn_decode.conv_gates_step(x.repeat(17, 1), windows, weight, index.repeat(17), h.repeat(17, 1), w_ab, a_log,
                                   dt_bias, tokens)
