"""Which torch.compile options keep the quantizer slabs bit-exact with eager on this GPU (and how fast)?"""
import sys

import torch
import torch._inductor.config as ic

from ninfer_pack.quant.intgroup import int_slab
from ninfer_pack.quant.nvfp4 import quantize_slab

print("inductor has emulate_divison_rounding:", hasattr(ic, "emulate_divison_rounding"),
      "emulate_precision_casts:", hasattr(ic, "emulate_precision_casts"))
torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
w = (torch.randn(8192, 5120) * 0.02).to(torch.bfloat16).cuda()
s2 = (w.abs().amax().float() / 2688).reshape(())
cases = {"nvfp4": (quantize_slab, (w, s2)), "int4": (int_slab, (w, 4, 128, True)), "int4-asym": (int_slab, (w, 4, 128, False))}
variants = {"default": {}, "div_rn": {"emulate_divison_rounding": True},
            "div_rn+casts": {"emulate_divison_rounding": True, "emulate_precision_casts": True},
            "casts": {"emulate_precision_casts": True}}


def same(a, b):
    if a is None or b is None:
        return a is b
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


for cname, (fn, args) in cases.items():
    ref = fn(*args)
    for vname, opts in variants.items():
        opts = {k: v for k, v in opts.items() if hasattr(ic, k)}
        torch._dynamo.reset()
        c = torch.compile(fn, dynamic=False, options=opts or None)
        out = c(*args)
        exact = all(same(a, b) for a, b in zip(ref, out))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            c(*args)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 10
        print(f"{cname:<10} {vname:<13} exact={exact}  {ms:.3f} ms  {w.numel() * 2 / ms / 1e6:.0f} GB/s")
