"""Groupwise int4/int8 against compressed-tensors `pack-quantized`, bit for bit."""

import pytest
import torch

from ninfer_format.quants import dequantize_int, pack_int32, unpack_int32
from ninfer_pack.quant import NonFiniteWeight, quantize_int
from ninfer_pack.verify import error_bound

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402


def fresh(shape, std=0.02):
    w = torch.randn(shape) * std
    w[0, :128] = 0.0  # an all-zero group
    w[1, :128] = w[1, :128].abs()  # a group with no negative value (zero point at the bottom)
    w[2] *= 50
    return w.to(torch.bfloat16)


def _ct(w, bits, group, symmetric):
    args = QuantizationArgs(num_bits=bits, type="int", strategy="group", group_size=group, symmetric=symmetric)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    g = w.unflatten(-1, (w.shape[1] // group, group))
    scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
    sd = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    deq = PackedQuantizationCompressor.decompress(dict(sd), scheme)["weight"]
    return sd, deq


@pytest.mark.parametrize("shape", [(8, 128), (100, 256), (257, 384), (512, 1024)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("std", [0.02, 3.0])
def test_int4_bit_exact_vs_compressed_tensors(shape, symmetric, std):
    w = fresh(shape, std)
    sd, deq = _ct(w, 4, 128, symmetric)
    mine = quantize_int(w, 4, 128, symmetric)
    live = torch.ones(shape[0], shape[1] // 128, dtype=torch.bool)
    if not symmetric:
        live[0, 0] = False  # CT divides 0/0 in an all-zero group's zero point; ours is defined (-8)
    assert torch.equal(mine["scale"], sd["weight_scale"])
    q_ct = unpack_int32(sd["weight_packed"], 4, 1, shape[1]).view(shape[0], -1, 128)
    q_me = unpack_int32(mine["qweight"], 4, 1, shape[1]).view(shape[0], -1, 128)
    assert torch.equal(q_me[live], q_ct[live])
    if symmetric:
        assert torch.equal(mine["qweight"], sd["weight_packed"])
    else:
        z_ct = unpack_int32(sd["weight_zero_point"], 4, 0, shape[0])
        z_me = unpack_int32(mine["zero_point"], 4, 0, shape[0])
        assert torch.equal(z_me[live], z_ct[live])
    ours = dequantize_int(mine["qweight"], mine["scale"], mine.get("zero_point"), 4, 128, shape)
    live_el = live.repeat_interleave(128, dim=1)
    assert torch.equal(ours.to(torch.bfloat16)[live_el], deq[live_el])
    assert bool((ours.view(shape[0], -1, 128)[~live] == 0).all())


@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_values_match_compressed_tensors(symmetric):
    w = fresh((64, 256))
    sd, deq = _ct(w, 8, 128, symmetric)
    mine = quantize_int(w, 8, 128, symmetric)
    q_ct = unpack_int32(sd["weight_packed"], 8, 1, 256)
    live = torch.ones(64, 256, dtype=torch.bool)
    if not symmetric:
        live[0, :128] = False
    assert torch.equal(mine["qweight"].int()[live], q_ct[live])
    assert torch.equal(mine["scale"], sd["weight_scale"])
    ours = dequantize_int(mine["qweight"], mine["scale"], mine.get("zero_point"), 8, 128, (64, 256))
    assert torch.equal(ours.to(torch.bfloat16)[live], deq[live])


@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, True), (8, False)])
def test_error_within_bound_and_bound_catches_corruption(bits, sym):
    w = fresh((96, 512))
    parts = quantize_int(w, bits, 128, sym)
    deq = dequantize_int(parts["qweight"], parts["scale"], parts.get("zero_point"), bits, 128, (96, 512))
    scheme = {"kind": "int", "bits": bits, "group_size": 128, "symmetric": sym}
    bound = error_bound(scheme, parts, w)
    assert bool(((deq - w.float()).abs() <= bound).all())
    bad = parts["qweight"].clone()
    bad[5, 3] ^= 0x0C if bits == 4 else 0x40  # move one value by 4 (int4) / 64 (int8) steps
    deq_bad = dequantize_int(bad, parts["scale"], parts.get("zero_point"), bits, 128, (96, 512))
    assert not bool(((deq_bad - w.float()).abs() <= bound).all())


def test_pack_int32_roundtrip_and_layout():
    q = torch.randint(-8, 8, (9, 40), dtype=torch.int32)
    words = pack_int32(q, 4, 1)
    assert words.shape == (9, 5)
    assert int(words[0, 0]) & 0xF == int(q[0, 0]) + 8  # element 0 in the lowest nibble, offset-binary
    assert torch.equal(unpack_int32(words, 4, 1, 40), q)
    zp = pack_int32(q, 4, 0)
    assert zp.shape == (2, 40) and torch.equal(unpack_int32(zp, 4, 0, 9), q)


def test_rejects_bad_shapes_and_non_finite():
    with pytest.raises(ValueError, match="K % 128"):
        quantize_int(torch.zeros(4, 192), 4, 128, True)
    w = torch.zeros(4, 128)
    w[0, 0] = float("-inf")
    with pytest.raises(NonFiniteWeight, match="w.down"):
        quantize_int(w, 4, 128, True, name="w.down")
