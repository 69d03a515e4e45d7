"""The prefill chunk's causal depthwise conv + SiLU (kernels/gdn_conv.py) against the torch form the
model runs elsewhere: cat(history, x), F.conv1d with groups = channels, SiLU. On a CPU in Triton's
interpreter (fp16, few channels, float32 reference); on a GPU the 27B's 10,240 channels in bf16."""

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import gdn_conv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
CHANNELS = 10240 if DEVICE == "cuda" else 160  # not a multiple of the program's 128 on a CPU
KERNEL = 4


def _reference(x, history, weight):
    padded = torch.cat((history, x)).float()
    return F.silu(F.conv1d(padded.T[None], weight.float(), groups=weight.shape[0])[0].T.to(x.dtype).float()).to(x.dtype)


@pytest.mark.parametrize("tokens", [1, 3, 64, 131] + ([8192] if DEVICE == "cuda" else []))
@pytest.mark.parametrize("strided", [False, True])
def test_causal_conv_silu_matches_torch(tokens, strided):
    """tokens: fewer than K-1 (taps reach across the whole history), a program's rows, a ragged last
    block; strided: x a column slice of a wider projection output (the fused qkv|z matmul)."""
    gen = torch.Generator().manual_seed(tokens)
    wide = torch.randn(tokens, CHANNELS + (96 if strided else 0), generator=gen).to(DEVICE, DTYPE)
    x = wide[:, :CHANNELS]
    history = torch.randn(KERNEL - 1, CHANNELS, generator=gen).to(DEVICE, DTYPE)
    weight = (torch.randn(CHANNELS, 1, KERNEL, generator=gen) * 0.5).to(DEVICE, DTYPE)

    got = gdn_conv.causal_conv_silu(x, history, weight)

    want = _reference(x, history, weight)
    assert got.shape == want.shape and got.dtype == DTYPE and got.is_contiguous()
    # one rounding of a float32 sum of K products (its order may differ from aten's), then SiLU's
    err = (got.float() - want.float()).abs()
    assert float(err.max()) <= 2 * float(torch.finfo(DTYPE).eps) * float(want.float().abs().max() + 1)
    assert float(err.norm() / want.float().norm()) < 4e-3


@pytest.mark.parametrize("tokens", [3, 131])
def test_sections_are_the_columns_apart(tokens):
    """With sections (a layer's q, k and v widths) each column range comes out contiguous, equal to the
    unsplit output's columns bit for bit."""
    gen = torch.Generator().manual_seed(tokens + 1)
    x = torch.randn(tokens, CHANNELS + 32, generator=gen).to(DEVICE, DTYPE)[:, :CHANNELS]
    history = torch.randn(KERNEL - 1, CHANNELS, generator=gen).to(DEVICE, DTYPE)
    weight = (torch.randn(CHANNELS, 1, KERNEL, generator=gen) * 0.5).to(DEVICE, DTYPE)
    a = CHANNELS // 5  # about the 27B's 2,048 / 2,048 / 6,144 of 10,240; unequal, so no width stands for another
    sections = (a - 8, a + 8, CHANNELS - 2 * a)
    whole = gdn_conv.causal_conv_silu(x, history, weight)
    parts = gdn_conv.causal_conv_silu(x, history, weight, sections)
    assert [p.shape for p in parts] == [(tokens, w) for w in sections] and all(p.is_contiguous() for p in parts)
    assert torch.equal(torch.cat(parts, dim=1), whole)


def test_causal_conv_silu_refuses_a_history_of_the_wrong_length():
    x = torch.zeros(5, 8, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match="history"):
        gdn_conv.causal_conv_silu(x, torch.zeros(KERNEL, 8, device=DEVICE, dtype=DTYPE),
                                  torch.zeros(8, 1, KERNEL, device=DEVICE, dtype=DTYPE))
