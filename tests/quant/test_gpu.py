"""Quantizing on the GPU gives the same bytes as on the CPU (run with `pytest -m gpu` on a CUDA box)."""

import pytest
import torch

from ninfer_pack.quant import quantize_int, quantize_nvfp4

pytestmark = pytest.mark.gpu


def _fresh(shape):
    w = torch.randn(shape) * 0.02
    w[0, :16] = 0.0
    w[1, :5] = -0.0
    w[2] *= 100
    return w.to(torch.bfloat16)


@pytest.mark.parametrize("shape", [(1024, 4096), (257, 4112), (5120, 17408)])
def test_nvfp4_cuda_equals_cpu(shape):
    w = _fresh(shape)
    q, s8, s2 = quantize_nvfp4(w)
    qc, s8c, s2c = quantize_nvfp4(w.cuda())
    assert torch.equal(q, qc.cpu()) and torch.equal(s8.view(torch.uint8), s8c.cpu().view(torch.uint8))
    assert torch.equal(s2, s2c.cpu())
    assert s2c.device == qc.device  # beside the weight: a CPU s2 costs each GEMV a synchronous copy


@pytest.mark.parametrize("rows,k", [(1, 16), (7, 48), (300, 5120), (4096, 17408)])
@pytest.mark.parametrize("std", [0.02, 30.0])
def test_triton_slab_kernel_matches_torch_reference(rows, k, std):
    from ninfer_pack.quant.nvfp4 import global_scale_of, quantize_slab
    from ninfer_pack.quant.nvfp4_triton import triton_slab

    w = (torch.randn(rows, k, device="cuda") * std).to(torch.bfloat16)
    w[0, :16] = 0.0  # an all-zero block (and, at 1 x 16, an all-zero tensor: s2 = 1 as the packer sets it)
    s2 = global_scale_of([w]).cuda()
    ref_q, ref_s = quantize_slab(w, s2)
    poisoned = (torch.full_like(ref_q, 0xAA), torch.full_like(ref_s.view(torch.uint8), 0x7F).view(torch.float8_e4m3fn))
    got_q, got_s = triton_slab(w, s2, out=poisoned)  # every byte must be overwritten
    assert torch.equal(got_q, ref_q)
    assert torch.equal(got_s.view(torch.uint8), ref_s.view(torch.uint8))


@pytest.mark.parametrize("rows,k", [(8, 128), (13, 256), (1000, 2048), (4096, 5120)])
@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, True), (8, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16])  # float32 weights take the torch path (intgroup.py)
def test_triton_int_kernel_matches_torch_reference(rows, k, bits, symmetric, dtype):
    from ninfer_pack.quant.int_triton import triton_int_slab
    from ninfer_pack.quant.intgroup import int_slab

    w = (torch.randn(rows, k, device="cuda") * 0.02).to(dtype)
    w[0, :128] = 0.0
    if rows > 1:
        w[1, :128] = w[1, :128].abs()
    ref = int_slab(w, bits, 128, symmetric)
    got = triton_int_slab(w, bits, 128, symmetric)
    for name, a, b in zip(("qweight", "scale", "zero_point"), ref, got):
        assert (a is None) == (b is None), name
        if a is not None:
            a, b = (t.view(torch.uint8) if t.dtype == torch.bfloat16 else t for t in (a, b))
            bad = (a != b).nonzero()
            assert bad.numel() == 0, f"{name}: {bad.shape[0]} differ, first at {bad[0].tolist()}"


@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, True), (8, False)])
def test_int_cuda_equals_cpu(bits, symmetric):
    w = _fresh((1000, 2048))
    cpu = quantize_int(w, bits, 128, symmetric)
    gpu = quantize_int(w.cuda(), bits, 128, symmetric)
    for role in cpu:
        assert torch.equal(cpu[role], gpu[role].cpu()), role
