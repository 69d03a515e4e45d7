"""Checkpoints that are already NVFP4 (compressed-tensors `nvfp4-pack-quantized` or NVIDIA ModelOpt):
their codes and block scales are taken as they are, never re-quantized.

    compressed-tensors: X.weight_packed u8 [N, K/2], X.weight_scale f8_e4m3 [N, K/16],
                        X.weight_global_scale f32 [1]  (encode direction: s2 = 1 / global)
    ModelOpt:           X.weight u8 [N, K/2], X.weight_scale f8_e4m3 [N, K/16], X.weight_scale_2 f32 []  (s2)
Activation scales (`input_scale`, `input_global_scale`) are dropped: NInfer runs weight-only NVFP4.
`adopt_prequantized` rewrites the checkpoint's tensor index so each quantized module shows as its
logical `X.weight` [N, K]; registry validation then runs unchanged, and the packer reads the parts
through `PreQuantized.load`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from safetensors import safe_open

from .source import Checkpoint, SourceError, SourceTensor

_DROPPED = ("input_scale", "input_global_scale", "k_scale", "v_scale")


@dataclass(frozen=True)
class PreQuantized:
    name: str  # X.weight
    qweight: SourceTensor
    block_scale: SourceTensor
    global_scale: SourceTensor
    encode_direction: bool  # compressed-tensors stores 1 / s2

    def load(self) -> dict[str, torch.Tensor]:
        """The logical nvfp4 parts (row-major), as quantize_tensor would have produced them."""
        out = {}
        for role, t in (("qweight", self.qweight), ("block_scale", self.block_scale), ("global_scale", self.global_scale)):
            with safe_open(t.shard, framework="pt") as f:
                out[role] = f.get_tensor(t.name)
        g = out["global_scale"].float().reshape(())
        out["global_scale"] = (1.0 / g) if self.encode_direction else g
        return out


def _format(ckpt: Checkpoint) -> str | None:
    qc = ckpt.config.get("quantization_config")
    hf_quant = ckpt.root / "hf_quant_config.json"
    if isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        for name, group in groups.items():
            w = group.get("weights") or {}
            fmt = group.get("format") or qc.get("format")
            if (fmt, w.get("num_bits"), w.get("type"), w.get("group_size")) != ("nvfp4-pack-quantized", 4, "float", 16):
                raise SourceError(f"quantization_config group {name} is {fmt} {w.get('type')}{w.get('num_bits')} "
                                  f"group {w.get('group_size')}: only NVFP4 (nvfp4-pack-quantized, group 16) "
                                  "checkpoints can be packed without re-quantizing")
        return "compressed-tensors"
    if isinstance(qc, dict) and qc.get("quant_method") == "modelopt" or hf_quant.is_file():
        algo = qc.get("quant_algo") if isinstance(qc, dict) else None
        if hf_quant.is_file():
            algo = json.loads(hf_quant.read_text()).get("quantization", {}).get("quant_algo", algo)
        if algo != "NVFP4":
            raise SourceError(f"ModelOpt checkpoint with quant_algo {algo!r}: only NVFP4 can be packed as it is")
        return "modelopt"
    if isinstance(qc, dict):
        raise SourceError(f"quantization_config quant_method {qc.get('quant_method')!r} is not supported "
                          "(NVFP4 from compressed-tensors or ModelOpt, or an unquantized checkpoint)")
    return None


def adopt_prequantized(ckpt: Checkpoint) -> dict[str, PreQuantized]:
    """Detect an NVFP4 checkpoint and re-index its quantized modules as logical weights (in place)."""
    fmt = _format(ckpt)
    if fmt is None:
        return {}
    t = ckpt.tensors
    found: dict[str, PreQuantized] = {}
    if fmt == "compressed-tensors":
        for packed in [n for n in t if n.endswith(".weight_packed")]:
            module = packed.removesuffix(".weight_packed")
            found[f"{module}.weight"] = _parts(t, module, packed, f"{module}.weight_scale",
                                               f"{module}.weight_global_scale", True)
    else:
        for scale2 in [n for n in t if n.endswith(".weight_scale_2")]:
            module = scale2.removesuffix(".weight_scale_2")
            found[f"{module}.weight"] = _parts(t, module, f"{module}.weight", f"{module}.weight_scale", scale2, False)
    for name, p in found.items():
        for part in (p.qweight, p.block_scale, p.global_scale):
            t.pop(part.name, None)
        n, half = p.qweight.shape
        t[name] = SourceTensor(name, p.qweight.shard, torch.bfloat16, (n, 2 * half))
    for name in [n for n in t if n.rsplit(".", 1)[-1] in _DROPPED]:
        del t[name]
    return found


def _parts(t: dict[str, SourceTensor], module: str, q: str, s: str, g: str, encode: bool) -> PreQuantized:
    missing = [n for n in (q, s, g) if n not in t]
    if missing:
        raise SourceError(f"{module}: NVFP4 parts {missing} are missing")
    qt, st, gt = t[q], t[s], t[g]
    if qt.dtype != torch.uint8 or len(qt.shape) != 2:
        raise SourceError(f"{q}: expected packed E2M1 codes (u8, 2-D), got {qt.dtype} {list(qt.shape)}")
    n, half = qt.shape
    if st.dtype != torch.float8_e4m3fn or st.shape != (n, 2 * half // 16):
        raise SourceError(f"{s}: expected f8_e4m3 {[n, 2 * half // 16]}, got {st.dtype} {list(st.shape)}")
    if gt.dtype != torch.float32 or len(gt.shape) > 1 or (gt.shape and gt.shape[0] != 1):
        raise SourceError(f"{g}: expected one f32 global scale, got {gt.dtype} {list(gt.shape)}")
    return PreQuantized(f"{module}.weight", qt, st, gt, encode)
