"""The CUDA allocator setting: expandable segments by default, the user's PYTORCH_CUDA_ALLOC_CONF kept."""

import os
import subprocess
import sys

from ninfer_run import allocator


def test_expandable_segments_by_default(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert allocator.configure() and os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_the_users_setting_wins(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert not allocator.configure() and os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def test_importing_ninfer_run_sets_it_before_any_allocation():
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", "import ninfer_run, os; print(os.environ['PYTORCH_CUDA_ALLOC_CONF'])"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "expandable_segments:True"
