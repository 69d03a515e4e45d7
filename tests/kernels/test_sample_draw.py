"""The one-kernel sampled draw (kernels/sample_draw.py) against sampling's torch path, its reference."""

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere

from ninfer_run import sampling  # noqa: E402
from ninfer_run.kernels import sample_draw  # noqa: E402
from ninfer_run.sampling import SamplingParams  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 248_320 if DEVICE == "cuda" else 4096
SETTINGS = [SamplingParams(0.6, 0.95, 20), SamplingParams(1.0, 1.0, 40), SamplingParams(0.8, 0.5, 5),
            SamplingParams(1.3, 0.9, 1), SamplingParams(0.7, 0.99, 192)]


def _reference(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path's token for each row and uniform, and how far (in mass) u * total lies from the
    nearest CDF boundary of its row (where float32 sums may legitimately pick the neighbour)."""
    tokens, p = sampling.top_k_candidates(logits, params)
    picked = sampling._inverse_cdf(p, u.double())
    cdf = torch.cumsum(p, -1, dtype=torch.float64)
    margin = (cdf - cdf[:, -1:] * u.double()[:, None]).abs().min(-1).values
    return tokens.gather(-1, picked[:, None]).squeeze(1), margin


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_kernel_draws_the_torch_paths_token(params, tied):
    """Fresh logits, 64 uniforms a row: the kernel's token is the torch path's wherever u is not within
    float32 rounding of a boundary. `tied`: logits on a coarse grid, so top-k's k-th value and top-p's
    order meet ties (kept with the k-th; in token order)."""
    g = torch.Generator().manual_seed(len(str(params)) + tied)
    rows = torch.randn(4, VOCAB, generator=g) * 3
    if tied:
        rows = (rows * 2).round() / 2
    logits = rows.repeat_interleave(64, 0).to(DEVICE)
    u = torch.rand(logits.shape[0], generator=g, dtype=torch.float64).to(DEVICE)
    candidates = params.top_k + sampling.TOP_K_TIES
    values, index = torch.topk(logits, candidates, dim=-1)
    got = sample_draw.draw(values.float(), index, u, params.temperature, params.top_k, params.top_p)
    want, margin = _reference(logits, params, u)
    differ = got != want
    assert (margin[differ] < 1e-5).all(), (got[differ], want[differ], margin[differ])
    assert differ.float().mean() < 0.01
    assert len(set(got.tolist())) > 1 or params.top_k == 1  # (a draw, not one token)


def test_kernel_refuses_more_candidates_than_it_holds():
    values, index = torch.zeros(1, sample_draw.MAX_CANDIDATES + 1), torch.zeros(1, sample_draw.MAX_CANDIDATES + 1,
                                                                                   dtype=torch.long)
    with pytest.raises(ValueError, match="candidates"):
        sample_draw.draw(values, index, torch.zeros(1, dtype=torch.float64), 1.0, 20, 1.0)
    with pytest.raises(ValueError, match="candidates"):
        sample_draw.draw(values[:, :10], index[:, :10], torch.zeros(1, dtype=torch.float64), 1.0, 20, 1.0)
