"""The vision tower against transformers' Qwen3_5VisionModel (same weights, fresh images and grids)."""

import pytest
import torch

from ninfer_run.loader import load

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def towers(tiny_checkpoints, packed):
    ours = load(packed("tiny-qwen3.5", "bf16"), vision=True).vision
    hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tiny_checkpoints["tiny-qwen3.5"],
                                                                      dtype=torch.float32).eval()
    return ours, hf.model.visual


@pytest.mark.parametrize("grid", [(1, 2, 2), (1, 4, 6), (1, 8, 2), (1, 10, 14)])
def test_embeddings_match_transformers(towers, grid):
    ours, theirs = towers
    g = torch.Generator().manual_seed(sum(grid))
    c = ours.cfg
    pixels = torch.randn(grid[1] * grid[2], c.in_channels * c.temporal * c.patch * c.patch, generator=g)
    got = ours.forward(pixels, grid)
    with torch.no_grad():
        ref = theirs(pixels, grid_thw=torch.tensor([grid])).pooler_output
    assert got.shape == ref.shape == (grid[1] * grid[2] // 4, c.out_hidden)
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_no_vision_tower_is_a_clear_error(packed):
    with pytest.raises(ValueError, match="no vision tower"):
        load(packed("tiny-qwen3", "bf16"), vision=True)
