"""A step's GEMV launches chained for L2 prefetch (kernels/linear.py link_prefetches): a model's weight_stream
is the order a step really launches its weights in, and each launch is given the next one's first bytes."""

import pytest
import torch

from ninfer_run.kernels.linear import QuantizedLinear, link_prefetches
from ninfer_run.loader import load
from ninfer_run.state import SequenceState


@pytest.fixture(params=["tiny-qwen3.5", "tiny-qwen3"])
def quantized(request, packed):
    """A tiny model with its NVFP4 weights kept packed (QuantizedLinear), on the CPU."""
    return load(packed(request.param, "nvfp4"), kernels=True).model


def test_weight_stream_is_the_order_a_step_launches(quantized, monkeypatch):
    """Every projection launch of a one-row step, recorded where QuantizedLinear launches (its group), in
    order and with the weights it shares a launch with, is the model's weight_stream."""
    launches = []

    def record(x, weights, glu=False):
        if glu:  # (swiglu_mlp asks for the one-launch GLU first; refused, gate and up launch as a group)
            return None
        launches.append([id(w) for w in weights])
        return [torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype) for w in weights]

    monkeypatch.setattr(QuantizedLinear, "group", staticmethod(record))
    monkeypatch.setattr(QuantizedLinear, "group_after_norm", staticmethod(lambda *args: None))
    quantized._run(torch.tensor([5]), [(SequenceState(), 1)])
    assert launches and launches == [[id(w) for w in launch] for launch in quantized.weight_stream()]


def test_each_launch_prefetches_the_next_ones_first_bytes(quantized, monkeypatch):
    """With a budget some launches exceed: each launch's weights share one list of views, the next launch's
    codes and scales from their first byte, whole weights in order and the one the budget ends in cut at
    the same fraction of both (multiples of 16 bytes), within 64 bytes of the budget; the last launch
    prefetches nothing."""
    launches = quantized.weight_stream()
    for launch in launches:
        for w in launch:
            monkeypatch.setattr(w, "tiled", True)  # (row-major on the CPU: the links read only the bytes)
    sizes = [sum(t.numel() for w in launch for t in w.streamed_bytes()) for launch in launches]
    budget = sorted(sizes)[len(sizes) // 2] // 3 * 2
    assert budget < max(sizes)
    assert link_prefetches(launches, budget) == len(launches) - 1
    for launch, after, size in zip(launches, launches[1:], sizes[1:]):
        views = launch[0].prefetch
        assert all(w.prefetch is views for w in launch)
        parts = [t for w in after for t in w.streamed_bytes()]
        assert [v.data_ptr() for v in views] == [t.data_ptr() for t in parts[: len(views)]]
        assert all(v.numel() % 16 == 0 for v in views)
        whole = [v.numel() == t.numel() for v, t in zip(views, parts)]
        assert all(whole[: len(views) - 2]) and (size <= budget) == (len(views) == len(parts) and all(whole))
        assert min(size, budget) - 64 <= sum(v.numel() for v in views) <= min(size, budget)
    assert launches[-1][0].prefetch == []
    assert link_prefetches(launches, 0) == 0
