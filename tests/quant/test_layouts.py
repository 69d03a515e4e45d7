"""Target layouts: the 128x4 scale swizzle equals torchao/cuBLAS `to_blocked`, and every layout inverts exactly."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_format.layouts import apply_layout, blocked_offset, blocked_shape, from_blocked, to_blocked, undo_layout
from ninfer_format.quants import part_specs
from ninfer_pack.quant import quantize_tensor

SCHEMES = {
    "nvfp4": {"kind": "nvfp4", "group_size": 16, "global_scale": "decode"},
    "int4": {"kind": "int", "bits": 4, "group_size": 128, "symmetric": False},
    "bf16": {"kind": "plain", "dtype": "bf16"},
}


def _scales(rows, cols):
    return torch.randint(0, 255, (rows, cols), dtype=torch.uint8).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("rows,cols", [(1, 1), (128, 4), (256, 32), (300, 7), (5120, 1088), (1024, 320)])
def test_to_blocked_matches_torchao(rows, cols):
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.utils import to_blocked as ao_to_blocked

    s = _scales(rows, cols)
    ours = to_blocked(s)
    assert ours.shape == blocked_shape(rows, cols)
    assert torch.equal(ours.reshape(-1).view(torch.uint8), ao_to_blocked(s.view(torch.uint8)).reshape(-1))


@pytest.mark.parametrize("rows,cols", [(130, 9), (256, 8)])
def test_offset_formula_indexes_every_element(rows, cols):
    s = _scales(rows, cols)
    flat = to_blocked(s).reshape(-1).view(torch.uint8)
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    offsets = torch.tensor([blocked_offset(int(i), int(j), cols) for i, j in zip(r.flatten(), c.flatten())])
    assert torch.equal(flat[offsets], s.view(torch.uint8).flatten())
    assert len(set(offsets.tolist())) == rows * cols


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 700), cols=st.integers(1, 70))
def test_blocked_roundtrip(rows, cols):
    s = _scales(rows, cols)
    assert torch.equal(from_blocked(to_blocked(s), rows, cols).view(torch.uint8), s.view(torch.uint8))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), kb=st.integers(1, 4), scheme=st.sampled_from(sorted(SCHEMES)),
       target=st.sampled_from(["sm_120a", "sm_90a", "linear"]))
def test_every_target_layout_inverts(n, kb, scheme, target):
    k = 128 * kb
    w = (torch.randn(n, k) * 0.1).to(torch.bfloat16)
    sch = SCHEMES[scheme]
    logical = quantize_tensor(sch, w, "w")
    specs = {s.role: s for s in part_specs(sch, (n, k), "bf16", target)}
    linear = {s.role: s for s in part_specs(sch, (n, k), "bf16", "linear")}
    for role, part in logical.items():
        stored = apply_layout(target, sch["kind"], role, part)
        assert tuple(stored.shape) == specs[role].shape
        back = undo_layout(specs[role].layout, stored, linear[role].shape)
        assert back.dtype == part.dtype and torch.equal(back.reshape(-1).view(torch.uint8), part.reshape(-1).view(torch.uint8))
