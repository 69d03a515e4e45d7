"""tools/bench.py --anatomy: each variant leaves out exactly its layer kind's small kernels, on every path a
decode step can take, and keeps the GEMVs (its figures are the step's time without those kernels)."""

import contextlib
from unittest import mock

import bench
import pytest
import torch

from ninfer_run.models import qwen3_5

CHAIN = {"gdn": [(qwen3_5, "projected_gates"), (qwen3_5.Model, "_gdn_sequence"), (qwen3_5.Model, "_gdn_decode_batch"),
                 (qwen3_5, "gated_rms_norm")],
         "attention": [(qwen3_5, "attend")]}  # (q/k norm and RoPE inside it)


@pytest.fixture(scope="module")
def model():
    return bench.build_model("tiny-qwen3.5", "nvfp4", "cpu", torch.float32)[0]


@pytest.mark.parametrize("label", ["full", *bench.ANATOMY])
def test_anatomy_leaves_out_its_chains_only(model, label):
    calls: dict[str, int] = {}

    def counted(owner, name):
        real = getattr(owner, name)

        def spy(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)
        return mock.patch.object(owner, name, spy)

    skipped = bench.ANATOMY.get(label, ())
    with contextlib.ExitStack() as stack:
        for owner, name in [*CHAIN["gdn"], *CHAIN["attention"], (qwen3_5, "linear")]:
            stack.enter_context(counted(owner, name))
        stack.enter_context(bench._skipping(model, skipped))  # over the spies: a left-out function is not reached
        row = bench.decode(model, 2, 2, 16)  # C = 2: the batched GDN step; its prompts: one sequence's
    assert row["tokens"] > 0 and calls.get("linear", 0) > 0  # the GEMVs (out_proj, o_proj, MLP) still run
    for chain, functions in CHAIN.items():
        ran = sum(calls.get(name, 0) for _, name in functions)
        assert (ran == 0) == (chain in skipped), (chain, calls)
