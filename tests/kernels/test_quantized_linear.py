"""QuantizedLinear keeps every part of a weight on the weight's device."""

import torch

from ninfer_run.kernels.linear import QuantizedLinear, Scratch


def test_parts_follow_the_weight_device():
    # the packer's quantize_nvfp4 returns s2 as a CPU scalar; left there, each GEMV would copy it
    # host-to-device synchronously (and a CUDA Graph capture of that copy fails)
    parts = {"qweight": torch.empty(8, 64, dtype=torch.uint8, device="meta"),
             "block_scale": torch.empty(8, 8, dtype=torch.float8_e4m3fn, device="meta"),
             "global_scale": torch.tensor(0.5)}
    linear = QuantizedLinear({"kind": "nvfp4"}, parts, (8, 128), Scratch())
    assert {p.device.type for p in linear.parts.values()} == {"meta"}
