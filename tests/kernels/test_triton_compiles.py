"""The Triton kernels compile for Hopper (sm_90) and the RTX 5090 (sm_120) on a machine without a GPU.

The CPU tests run the kernels in Triton's interpreter, which checks their indexing and math but accepts
programs the compiler rejects (a type it cannot lower, a shape it cannot lay out): such a kernel would
first fail on the GPU box, where time is scarce. Here each kernel runs once in the interpreter through
its wrapper on small inputs, the launch's argument types are read off, and a fresh Python without the
interpreter compiles each kernel ahead of time for each target to a cubin (Triton's own ptxas; the
interpreter patches triton.language while it runs, so the compiler cannot share its process), and its
shared memory checked against the target's per-block limit (the 5090 has less than half of Hopper's).
Each kernel with grid-dependency flags (EARLY, PDL) is compiled with them on too, as a Hopper launches
it. Specialisation (divisibility by 16) is left out: the device may still vectorise differently."""

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="captures launches from Triton's interpreter (a CPU machine)")

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

# compute capability, and the most shared memory a block may have there (opt-in; CUDA's occupancy tables:
# 227 KB on Hopper, 99 KB on the consumer Blackwell of the RTX 5090)
TARGETS = {"sm_90": (90, 232_448), "sm_120": (120, 101_376)}
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8", torch.uint8: "u8",
         torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv"}
COMPILE = """
import json, sys
import importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

failures, job = {}, json.load(sys.stdin)
for launch in job["launches"]:
    kernel = getattr(importlib.import_module(launch["module"]), launch["name"])
    for target, (capability, max_shared) in job["targets"].items():
        try:
            source = ASTSource(fn=kernel, signature=launch["signature"], constexprs=launch["constexprs"])
            compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
            if not compiled.asm.get("cubin"):
                failures[f"{launch['name']} {target}"] = "no cubin"
            elif compiled.metadata.shared > max_shared:  # it would compile, then fail to launch
                failures[f"{launch['name']} {target}"] = f"{compiled.metadata.shared} B of shared memory > {max_shared}"
            elif missing := [i for i in launch.get("ptx", []) if i not in compiled.asm["ptx"]]:
                failures[f"{launch['name']} {target}"] = f"no {missing} in its PTX"
        except Exception as err:  # the compiler's message is the point
            failures[f"{launch['name']} {target}"] = f"{type(err).__name__}: {err}"[-2000:]
print(json.dumps(failures))
"""


def _launches(run) -> list[dict]:
    """Every kernel launch inside run() -> its module, name, argument types and constexprs as launched, once
    per variant (one kernel with other constexprs is another program)."""
    seen: dict[str, dict] = {}
    original = InterpretedFunction.run

    def capture(self, *args, grid, warmup, **kwargs):
        jit = JITFunction(self.fn)
        bound = dict(zip(jit.arg_names, args)) | kwargs
        signature, constexprs = {}, {}
        for p in jit.params:
            value = bound.get(p.name, p.default)
            if p.is_constexpr or value is None:
                signature[p.name], constexprs[p.name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                signature[p.name] = "*" + TYPES[value.dtype]
            elif isinstance(value, bool):
                signature[p.name] = "i1"
            elif isinstance(value, int):
                signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            elif isinstance(value, float):
                signature[p.name] = "fp32"
            else:
                raise TypeError(f"{self.fn.__name__}: argument {p.name} of type {type(value).__name__}")
        launch = {"module": self.fn.__module__, "name": self.fn.__name__, "signature": signature,
                  "constexprs": constexprs}
        seen.setdefault(json.dumps(launch, sort_keys=True), launch)  # a kernel once per variant
        # and as the GPU launches it: the grid-dependency branches (launch_dependents, wait_for_inputs), which
        # the interpreter never takes
        gpu_flags = {name: True for name in ("EARLY", "PDL") if name in constexprs}
        if gpu_flags:  # with the instructions they stand for in its PTX
            expect = ["griddepcontrol.launch_dependents"] + (["griddepcontrol.wait"] if "PDL" in gpu_flags else [])
            gpu = launch | {"constexprs": constexprs | gpu_flags, "ptx": expect}
            seen.setdefault(json.dumps(gpu, sort_keys=True), gpu)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = capture
    try:
        run()
    finally:
        InterpretedFunction.run = original
    return list(seen.values())


def _gdn_conv():
    from ninfer_run.kernels import gdn_conv

    x = torch.randn(70, 40, dtype=torch.bfloat16)
    gdn_conv.causal_conv_silu(x, torch.zeros(3, 40, dtype=torch.bfloat16), torch.randn(40, 1, 4, dtype=torch.bfloat16))


def _merge_lse():
    from ninfer_run.kernels.paged_attention import merge_lse

    a, b = (torch.randn(5, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    merge_lse(a, torch.randn(5, 2), b, torch.randn(5, 2))


def _norms():
    from ninfer_run.kernels import activations, norms

    x, h, gate = (torch.randn(3, 256, dtype=torch.bfloat16) for _ in range(3))
    w = torch.randn(256, dtype=torch.bfloat16)
    norms.rms_norm(x, w, 1e-6, 1.0)
    norms.add_rms_norm(x, h, w, 1e-6, 1.0)
    norms.gated_rms_norm(x, gate, w, 1e-6)
    narrow = torch.randn(norms.NARROW_MIN_ROWS, 128, dtype=torch.bfloat16)  # a prefill chunk's: many a program
    norms.gated_rms_norm(narrow, narrow, w[:128], 1e-6)
    q, k = torch.randn(3, 4, 256, dtype=torch.bfloat16), torch.randn(3, 2, 256, dtype=torch.bfloat16)
    cos, sin = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(3, 64, dtype=torch.bfloat16)
    norms.qk_norm_rope(q, k, w, w, 1e-6, 1.0, cos, sin)
    activations.silu_mul(x, h)


def _gdn_step():
    from ninfer_run.kernels import gdn_decode, gdn_gates

    hk, hv, d = 2, 4, 32
    c = 2 * hk * d + hv * d
    slots = torch.tensor([1])
    conv = gdn_decode.conv_step(torch.randn(1, c, dtype=torch.bfloat16), torch.zeros(2, 3, c, dtype=torch.bfloat16),
                                torch.randn(c, 1, 4, dtype=torch.bfloat16), slots)
    gdn_gates.gdn_gates(torch.randn(1, hv, dtype=torch.bfloat16), torch.randn(1, hv, dtype=torch.bfloat16),
                        torch.randn(hv), torch.randn(hv))
    g, beta = gdn_gates.projected_gates(torch.randn(1, 64, dtype=torch.bfloat16),
                                        torch.randn(2 * hv, 64, dtype=torch.bfloat16), torch.randn(hv), torch.randn(hv))
    gdn_decode.recurrent_step(conv, g, beta, torch.zeros(2, hv, d, d), slots, hk)
    # a verify of 2 tokens keeping each token's window and state (MTP's rollback)
    two = gdn_decode.conv_step(torch.randn(2, c, dtype=torch.bfloat16), torch.zeros(2, 3, c, dtype=torch.bfloat16),
                               torch.randn(c, 1, 4, dtype=torch.bfloat16), slots, 2,
                               torch.zeros(2, 2, 3, c, dtype=torch.bfloat16))
    gdn_decode.recurrent_step(two, torch.randn(2, hv), torch.rand(2, hv), torch.zeros(2, hv, d, d), slots, hk, 2,
                              torch.zeros(2, 2, hv, d, d))
    # the conv and the gates in one launch, at the 27B's in_proj_a/b width
    gdn_decode.conv_gates_step(torch.randn(1, c, dtype=torch.bfloat16), torch.zeros(2, 3, c, dtype=torch.bfloat16),
                               torch.randn(c, 1, 4, dtype=torch.bfloat16), slots,
                               torch.randn(1, 5120, dtype=torch.bfloat16), torch.randn(2 * hv, 5120, dtype=torch.bfloat16),
                               torch.randn(hv), torch.randn(hv))


def _kv():
    from ninfer_run.kernels import kv_read, kv_write
    from ninfer_run.kernels.paged_attention import paged_attention
    from ninfer_run.kv.pool import BlockPool, KVLayout

    pool = BlockPool(KVLayout(2, 2, 256, 16, "int8"), 4, "cpu")
    k, v = torch.randn(3, 2, 256, dtype=torch.bfloat16), torch.randn(3, 2, 256, dtype=torch.bfloat16)
    kv_write.write_slots(pool, 1, torch.tensor([0, 1, 2]), k, v)
    cos, sin = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(3, 64, dtype=torch.bfloat16)
    kv_write.norm_rope_write_slots(pool, 1, torch.tensor([0, 1, 2]), torch.randn(3, 4, 512, dtype=torch.bfloat16)[..., :256],
                                   k, v, torch.randn(256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16),
                                   1e-6, 1.0, cos, sin)  # a captured step's q/k norm + RoPE and KV write
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    kv_read.read_head(pool, 1, table[0], 20, 1, torch.bfloat16)
    paged_attention(torch.randn(1, 3, 4, 256, dtype=torch.bfloat16), pool, 1, table, torch.tensor([20], dtype=torch.int32),
                    one_shape=True)
    paged_attention(torch.randn(1, 1, 4, 256, dtype=torch.bfloat16), pool, 1, table, torch.tensor([20], dtype=torch.int32),
                    gate=torch.randn(1, 4, 256, dtype=torch.bfloat16))  # a decode step, the output gate merged


def _nvfp4():
    from ninfer_run.kernels import cuda_ops, nvfp4_linear

    n, k = 64, 256
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    scales = torch.randint(0, 120, (n, k // 16), dtype=torch.uint8).view(torch.float8_e4m3fn)
    s2 = torch.tensor(0.01)
    nvfp4_linear.gemv(torch.randn(2, k, dtype=torch.bfloat16), codes, scales, s2)
    nvfp4_linear.dequantize(codes, scales, s2)
    tiled_codes, tiled_scales = cuda_ops.tile_nvfp4(codes, scales)
    nvfp4_linear.dequantize(tiled_codes, tiled_scales, s2, tiled_shape=(n, k))  # the sm_90a artifact's prefill


def _int4():
    from ninfer_pack.quant import quantize_int
    from ninfer_run.kernels import cuda_ops, int_linear

    n, k = 64, 256
    p = quantize_int(torch.randn(n, k) * 0.05, 4, 128, True, "w")
    x = torch.randn(2, k, dtype=torch.bfloat16)
    int_linear.gemv(x, p["qweight"], p["scale"], None, 4, 128)
    int_linear.dequantize(p["qweight"], p["scale"], None, 4, 128, k)
    int_linear.dequantize(*cuda_ops.tile_int4(p["qweight"], p["scale"]), None, 4, 128, k, tiled=True)


def _pack_quantizers():
    """ninfer-pack's GPU quantizers (--device cuda): NVFP4 and groupwise-int slabs."""
    from ninfer_pack.quant.int_triton import triton_int_slab
    from ninfer_pack.quant.nvfp4 import global_scale_of
    from ninfer_pack.quant.nvfp4_triton import triton_slab

    w = torch.randn(8, 256, dtype=torch.bfloat16) * 0.02
    triton_slab(w, global_scale_of([w]))
    for bits, symmetric in ((4, True), (8, False)):
        triton_int_slab(w, bits, 128, symmetric)


WORKLOADS = {"gdn_conv": _gdn_conv, "nvfp4": _nvfp4, "int4": _int4, "pack_quantizers": _pack_quantizers, "merge_lse": _merge_lse, "norms": _norms, "gdn_step": _gdn_step, "kv": _kv}


def test_kernels_compile_for_the_gpus():
    launches = {name: _launches(run) for name, run in WORKLOADS.items()}
    assert all(launches.values()), {name: "launched no Triton kernel" for name, got in launches.items() if not got}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    job = {"targets": TARGETS, "launches": sum(launches.values(), [])}
    done = subprocess.run([sys.executable, "-c", COMPILE], input=json.dumps(job), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())
