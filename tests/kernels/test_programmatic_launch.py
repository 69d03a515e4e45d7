"""A step's Triton kernels launched as programmatic dependents (kernels/common.programmatic) wait for the
kernel ahead of them before they read its output.

Under programmatic dependent launch a kernel may start while the one ahead still runs; only its
wait_for_inputs makes the ahead kernel's writes visible. Each case here puts a kernel ahead that lets
its dependents launch at once, then spends ~1 ms before it writes the input the kernel under test
reads (NaN until then). The kernel under test must give what it gives on the finished input: a kernel
that read before its wait would read NaN or a part-written input. Needs a Hopper or later GPU (the
interpreter and older GPUs launch plainly: nothing to order)."""

import functools

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from ninfer_run.kernels import activations, common, gdn_decode, gdn_gates, kv_write, norms  # noqa: E402
from ninfer_run.kernels.paged_attention import paged_attention  # noqa: E402
from ninfer_run.kv.pool import BlockPool, KVLayout  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and common.programmatic(torch.device("cuda"))["PDL"]),
    reason="programmatic launches need compiled Triton on a Hopper or later GPU")]

DELAY_NS = 1_000_000


@triton.jit
def _late_copy_kernel(src_ptr, dst_ptr, n, delay_ns, BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_launch_dependents()  # the kernel under test may launch now
    start = tl.extra.cuda.globaltimer()
    while tl.extra.cuda.globaltimer() - start < delay_ns:
        pass
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + i, tl.load(src_ptr + i, mask=i < n), mask=i < n)


def _late(src: torch.Tensor) -> torch.Tensor:
    """A NaN tensor like src, which a kernel on the stream fills with src ~1 ms after it started (its
    dependents may launch at its start)."""
    dst = torch.full_like(src, float("nan"))
    torch.cuda.synchronize()
    _late_copy_kernel[(triton.cdiv(src.numel(), 1024),)](src, dst, src.numel(), DELAY_NS, BLOCK=1024)
    return dst


def _bf16(*shape, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)


# Each case prepares every other input (and synchronizes: a plain kernel between the late copy and the
# kernel under test would wait for the copy's end and hide a missing wait), then returns the call that
# launches only the kernel under test on its one late input.

def _norm():
    w = _bf16(512, seed=1)
    return lambda x: norms.rms_norm(x, w, 1e-6, 1.0)


def _gated_norm():
    gate, w = _bf16(4, 128, seed=2), _bf16(128, seed=3)
    return lambda x: norms.gated_rms_norm(x, gate, w, 1e-6)


def _qk_norm_rope():
    cos, sin, k, wq, wk = (_bf16(2, 64, seed=4), _bf16(2, 64, seed=5), _bf16(2, 2, 256, seed=6), _bf16(256, seed=7),
                           _bf16(256, seed=8))
    return lambda q: torch.cat([y.flatten() for y in norms.qk_norm_rope(q, k, wq, wk, 1e-6, 1.0, cos, sin)])


def _silu_mul():
    up = _bf16(2, 4096, seed=9)
    return lambda gate: activations.silu_mul(gate, up)


def _projected_gates():
    w, a_log, dt = _bf16(16, 1024, seed=10), _bf16(8, seed=11).float(), _bf16(8, seed=12).float()
    return lambda x: torch.cat([t.flatten() for t in gdn_gates.projected_gates(x, w, a_log, dt)])


HK, HV, D = 2, 4, 128
CHANNELS = 2 * HK * D + HV * D


def _conv_step():
    windows, weight, slots = _bf16(2, 3, CHANNELS, seed=13), _bf16(CHANNELS, 1, 4, seed=14), _slots()

    def run(x):
        out = gdn_decode.conv_step(x, windows, weight, slots)
        return torch.cat([out.flatten(), windows.flatten()])  # and the window it advanced in place
    return run


def _conv_gates_step(late: str):
    """conv_gates_step with its conv rows (x) or its gates' rows (h) written late."""
    windows, weight, slots = _bf16(2, 3, CHANNELS, seed=21), _bf16(CHANNELS, 1, 4, seed=22), _slots()
    x, h, w = _bf16(1, CHANNELS, seed=23), _bf16(1, 1024, seed=24), _bf16(2 * HV, 1024, seed=25)
    a_log, dt = _bf16(HV, seed=26).float(), _bf16(HV, seed=27).float()

    def run(rows):
        conv, g, beta = gdn_decode.conv_gates_step(rows if late == "x" else x, windows, weight, slots,
                                                   rows if late == "h" else h, w, a_log, dt)
        return torch.cat([conv.flatten().float(), windows.flatten().float(), g.flatten(), beta.flatten()])
    return run


def _recurrent_step():
    states, slots = _bf16(2, HV, D, D, seed=15).float(), _slots()
    g, beta = -_bf16(1, HV, seed=16).float().abs(), _bf16(1, HV, seed=17).float().sigmoid()

    def run(conv):
        out = gdn_decode.recurrent_step(conv, g, beta, states, slots, HK)
        return torch.cat([out.flatten().float(), states.flatten()])
    return run


def _pool() -> BlockPool:
    return BlockPool(KVLayout(2, 2, 256, 16, "int8"), 8, "cuda")


def _kv_write():
    pool, v, slots = _pool(), _bf16(3, 2, 256, seed=18), torch.tensor([3, 17, 40], device="cuda")

    def run(k):
        kv_write.write_slots(pool, 1, slots, k, v)
        return torch.cat([t.flatten().float() for t in (pool.k, pool.v, pool.k_scale, pool.v_scale)])
    return run


def _attention():
    pool = _pool()
    kv_write.write_slots(pool, 1, torch.arange(100, device="cuda"), _bf16(100, 2, 256, seed=19),
                         _bf16(100, 2, 256, seed=20))
    table = torch.arange(8, dtype=torch.int32, device="cuda")[None]
    lens = torch.tensor([100], dtype=torch.int32, device="cuda")
    return lambda q: paged_attention(q, pool, 1, table, lens)


def _slots() -> torch.Tensor:
    return torch.tensor([1], device="cuda")


CASES = {  # kernel under test: (its late input's shape, its preparation)
    "rms_norm": ((3, 512), _norm),
    "gated_rms_norm": ((4, 128), _gated_norm),
    "qk_norm_rope": ((2, 4, 256), _qk_norm_rope),
    "silu_mul": ((2, 4096), _silu_mul),
    "projected_gates": ((1, 1024), _projected_gates),
    "conv_step": ((1, CHANNELS), _conv_step),
    "conv_gates_step, conv rows late": ((1, CHANNELS), functools.partial(_conv_gates_step, "x")),
    "conv_gates_step, gate rows late": ((1, 1024), functools.partial(_conv_gates_step, "h")),
    "recurrent_step": ((1, CHANNELS), _recurrent_step),
    "kv_write": ((3, 2, 256), _kv_write),
    "paged_attention": ((1, 1, 4, 256), _attention),
}


@pytest.mark.parametrize("name", CASES)
def test_kernel_waits_for_the_kernel_ahead(name):
    shape, prepare = CASES[name]
    src = _bf16(*shape, seed=100)
    expected = prepare()(src.clone())  # on a finished input
    run = prepare()  # the same inputs afresh (the in-place states too)
    torch.cuda.synchronize()
    got = run(_late(src))
    torch.cuda.synchronize()
    assert not torch.isnan(expected).any()
    assert torch.equal(got, expected), f"{name}: read its input before the kernel ahead had written it"
