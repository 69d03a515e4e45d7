"""The CUDA allocator setting: expandable segments by default, the user's PYTORCH_CUDA_ALLOC_CONF kept."""

import torch

from ninfer_run import allocator


def _record(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", calls.append)
    return calls


def test_expandable_segments_by_default(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    calls = _record(monkeypatch)
    assert allocator.configure() and calls == ["expandable_segments:True"]


def test_the_users_setting_wins(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    calls = _record(monkeypatch)
    assert not allocator.configure() and calls == []
