"""Byte encodings of each quantization scheme: the parts they store, and pure-torch dequantization.

This is the decoding side only (shared by the compiler's verify and the runtime's reference path);
how scales are *chosen* lives in ninfer_pack.quant.

nvfp4 (ModelOpt's NVFP4 weight format, byte-identical to compressed-tensors `nvfp4-pack-quantized`):
    qweight      u8 [N, K/2]   E2M1 codes, element 2i in the low nibble, 2i+1 in the high nibble
    block_scale  f8_e4m3 [N, K/16]  one scale per 16 consecutive K elements (layout per target)
    global_scale f32 []        *decode* direction: s2 = amax / (6 * 448)
    w[n, k] = E2M1[code[n, k]] * (float(block_scale[n, k // 16]) * s2)
int (compressed-tensors `pack-quantized` conventions):
    bits 4: qweight i32 [N, K/8], element j of a word at bits 4j..4j+3, offset-binary (q + 8)
    bits 8: qweight i8 [N, K]
    scale        bf16 [N, K/G]
    zero_point   (asymmetric only) bits 4: i32 [ceil(N/8), K/G] packed along N, offset-binary;
                 bits 8: i8 [N, K/G]
    w[n, k] = (q[n, k] - z[n, k // G]) * scale[n, k // G]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layouts import blocked_shape, layout_for

E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)
FP4_MAX = 6.0
FP8_E4M3_MAX = 448.0
NVFP4_GROUP = 16


@dataclass(frozen=True)
class PartSpec:
    role: str
    dtype: str
    shape: tuple[int, ...]
    layout: str


class SchemeError(ValueError):
    """A tensor cannot be stored with the requested scheme (shape, rank)."""


def part_specs(scheme: dict, logical_shape: tuple[int, ...], logical_dtype: str, target: str) -> list[PartSpec]:
    """The exact parts (roles, dtypes, stored shapes, layouts) a tensor has under `scheme` for `target`."""
    kind = scheme["kind"]
    if kind == "plain":
        return [PartSpec("data", scheme["dtype"], tuple(logical_shape), "row_major")]
    if len(logical_shape) != 2:
        raise SchemeError(f"{kind} quantizes 2-D weights only, got shape {list(logical_shape)}")
    n, k = logical_shape
    if kind == "nvfp4":
        if k % NVFP4_GROUP:
            raise SchemeError(f"nvfp4 needs K % 16 == 0, got K = {k}")
        layout = layout_for(target, kind, "block_scale")
        scale_shape = blocked_shape(n, k // 16) if layout == "blocked_128x4" else (n, k // 16)
        return [
            PartSpec("qweight", "u8", (n, k // 2), "row_major"),
            PartSpec("block_scale", "f8_e4m3", scale_shape, layout),
            PartSpec("global_scale", "f32", (), "row_major"),
        ]
    if kind == "int":
        bits, group = scheme["bits"], scheme["group_size"]
        if k % group:
            raise SchemeError(f"int{bits} group {group} needs K % {group} == 0, got K = {k}")
        specs = [
            PartSpec("qweight", "i32", (n, k // 8), "row_major") if bits == 4 else PartSpec("qweight", "i8", (n, k), "row_major"),
            PartSpec("scale", "bf16", (n, k // group), "row_major"),
        ]
        if not scheme["symmetric"]:
            zp_shape = (-(-n // 8), k // group) if bits == 4 else (n, k // group)
            specs.append(PartSpec("zero_point", "i32" if bits == 4 else "i8", zp_shape, "row_major"))
        return specs
    raise SchemeError(f"unknown scheme kind {kind!r}")


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes 0..15 -> [..., K/2] uint8, even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles."""
    out = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


# value pairs of every packed byte: low nibble (even element) first
_BYTE_PAIRS = torch.stack((E2M1_VALUES[torch.arange(256) & 0x0F], E2M1_VALUES[torch.arange(256) >> 4]), dim=-1)


def dequantize_nvfp4(qweight: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Row-major parts -> float32 [N, K]; the same float32 operation order as ModelOpt's dequantize."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    values = _BYTE_PAIRS.to(qweight.device)[qweight.int()].view(n, k)
    per_block = block_scale.float() * global_scale.float()
    return (values.view(n, k // NVFP4_GROUP, NVFP4_GROUP) * per_block.unsqueeze(-1)).view(n, k)


def pack_int32(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Signed ints -> offset-binary, `32 // bits` per int32 word along `dim` (compressed-tensors pack_to_int32)."""
    per_word = 32 // bits
    v = (values.to(torch.int64) + (1 << (bits - 1))).movedim(dim, -1)
    pad = (-v.shape[-1]) % per_word
    if pad:
        v = torch.nn.functional.pad(v, (0, pad))
    v = v.view(*v.shape[:-1], -1, per_word)
    shifts = torch.arange(per_word, device=v.device, dtype=torch.int64) * bits
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def unpack_int32(words: torch.Tensor, bits: int, dim: int, length: int) -> torch.Tensor:
    """Inverse of pack_int32: -> signed int32 values, `length` of them along `dim`."""
    per_word = 32 // bits
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    shifts = torch.arange(per_word, device=w.device, dtype=torch.int64) * bits
    v = ((w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).flatten(-2)[..., :length]
    return (v - (1 << (bits - 1))).to(torch.int32).movedim(-1, dim).contiguous()


def dequantize_int(qweight, scale, zero_point, bits: int, group_size: int, logical_shape) -> torch.Tensor:
    """Row-major parts -> float32 [N, K]: (q - z) * s per group of `group_size` along K."""
    n, k = logical_shape
    q = unpack_int32(qweight, bits, 1, k) if bits == 4 else qweight.to(torch.int32)
    groups = k // group_size
    if zero_point is None:
        z = torch.zeros(n, groups, dtype=torch.int32, device=q.device)
    else:
        z = unpack_int32(zero_point, bits, 0, zero_point.shape[0] * 8)[:n] if bits == 4 else zero_point.to(torch.int32)
    q = q.view(n, groups, group_size).float() - z.float().unsqueeze(-1)
    return (q * scale.float().unsqueeze(-1)).view(n, k)


def row_slices(scheme: dict, logical_shape, parts: dict[str, torch.Tensor], max_elements: int = 1 << 22):
    """Yield (start, stop, parts of rows start:stop) so a tensor can be decoded a slab at a time.

    Slabs hold at most `max_elements` values (at least 8 rows: int4 zero points pack 8 rows a word),
    which keeps verification and error statistics bounded in memory for any tensor size.
    """
    n = logical_shape[0] if logical_shape else 1
    per_row = 1
    for d in logical_shape[1:]:
        per_row *= d
    step = max(8, max_elements // max(per_row, 1) // 8 * 8)
    if not logical_shape or scheme["kind"] == "plain" and len(logical_shape) == 1:
        yield 0, n, parts
        return
    for start in range(0, n, step):
        stop = min(n, start + step)
        sliced = {}
        for role, t in parts.items():
            if role == "global_scale":
                sliced[role] = t
            elif role == "zero_point" and scheme.get("bits") == 4:
                sliced[role] = t[start // 8 : -(-stop // 8)]
            else:
                sliced[role] = t[start:stop]
        yield start, stop, sliced


def dequantize(scheme: dict, logical_shape, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logical (row-major) parts of one tensor (or of a row slab from row_slices) -> float32 values."""
    kind = scheme["kind"]
    if kind == "plain":
        return parts["data"].float()
    if kind == "nvfp4":
        return dequantize_nvfp4(parts["qweight"], parts["block_scale"], parts["global_scale"])
    rows = parts["qweight"].shape[0]
    return dequantize_int(
        parts["qweight"], parts["scale"], parts.get("zero_point"), scheme["bits"], scheme["group_size"],
        (rows, logical_shape[1]),
    )
