"""The sm_120a block-scaled FP4 GEMM: it compiles for sm_120a (with the nvcc on this machine), and its
indexing is proven by exact CPU emulation against the float64 reference on fresh random operands."""

import re
import shutil
import subprocess

import pytest
import torch

from ninfer_format.layouts import blocked_offset, to_blocked
from ninfer_format.quants import pack_nibbles
from ninfer_run.kernels import nvfp4_sm120a as k

HELPERS = ("a_row", "a_kbyte", "w_kbyte", "sfa_row", "d_row", "d_col")


def _c_helpers() -> dict[str, tuple[list[str], str]]:
    src = k.SOURCE.read_text()
    found = {}
    for m in re.finditer(r"__device__ __forceinline__ (?:int|long long) (\w+)\(([^)]*)\) \{\s*return (.*?);\s*\}", src,
                         re.S):
        found[m.group(1)] = ([p.split()[-1] for p in m.group(2).split(",")], " ".join(m.group(3).split()))
    return found


def _as_python(expr: str):
    """A C integer expression over non-negative ints -> a Python function (`/` is floor division there)."""
    expr = expr.replace("(long long)", "").replace("/", "//")
    return lambda **names: eval(expr, {}, names)  # noqa: S307 - the expression comes from our own .cu


def test_emulator_helpers_are_the_kernels_own():
    found = _c_helpers()
    for name in HELPERS:
        params, expr = found[name]
        fn = _as_python(expr)
        for values in [dict(zip(params, v)) for v in _grid(params)]:
            assert fn(**values) == getattr(k, name)(*values.values()), (name, values)
    params, expr = found["blocked_offset"]
    fn = _as_python(expr)
    for r in (0, 1, 31, 32, 127, 128, 300):
        for c in (0, 3, 4, 17):
            assert fn(r=r, c=c, cols=24) == blocked_offset(r, c, 24)


def _grid(params):
    ranges = {"g": range(8), "q": range(4), "r": range(4), "i": range(4), "lane": range(32), "k0": (0, 64, 448)}
    out = [[]]
    for p in params:
        out = [o + [v] for o in out for v in ranges[p]]
    return out


def _operand(rows, cols, g):
    codes = torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.uint8)
    scales = (torch.rand(rows, cols // 16, generator=g) * 4 + 0.01).to(torch.float8_e4m3fn)
    return codes, scales


@pytest.mark.parametrize("m,n,kk", [(16, 8, 64), (1, 8, 128), (5, 13, 192), (37, 24, 64)])
def test_emulated_kernel_equals_reference_exactly(m, n, kk):
    g = torch.Generator().manual_seed(m * 1000 + n * 10 + kk)
    a_codes, a_scales = _operand(m, kk, g)
    w_codes, w_scales = _operand(n, kk, g)
    got = k.emulate(pack_nibbles(a_codes), a_scales, pack_nibbles(w_codes), to_blocked(w_scales), 0.75, m, n, kk)
    want = k.reference(a_codes, a_scales, w_codes, w_scales, 0.75)
    assert torch.equal(got, want)


def test_emulation_catches_a_wrong_index():
    """The proof has teeth: one swapped operand half changes the result."""
    g = torch.Generator().manual_seed(5)
    a_codes, a_scales = _operand(16, 64, g)
    w_codes, w_scales = _operand(8, 64, g)
    good = k.reference(a_codes, a_scales, w_codes, w_scales, 1.0)
    original = k.w_kbyte
    try:
        k.w_kbyte = lambda k0, q, r: (k0 + 8 * q + 32 * (1 - r)) // 2
        bad = k.emulate(pack_nibbles(a_codes), a_scales, pack_nibbles(w_codes), to_blocked(w_scales), 1.0, 16, 8, 64)
    finally:
        k.w_kbyte = original
    assert not torch.equal(bad, good)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_compiles_for_sm_120a(tmp_path):
    out = tmp_path / "kernel.o"
    r = subprocess.run(["nvcc", *k.NVCC_ARCH, "-c", str(k.SOURCE), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0
