"""NVFP4 GEMV and dequantization kernels (Triton) against their pure-torch references, fresh random inputs."""

import pytest
import torch

from ninfer_pack.quant import quantize_nvfp4
from tests.kernels.conftest import rounded_once, within_one_rounding

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import nvfp4_linear as k  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter's bf16 dot is broken; fp16 tiles are exact too (tests/kernels/conftest.py)
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
SHAPES = [(1, 64, 256), (3, 130, 512), (16, 96, 768)] if DEVICE == "cpu" else \
    [(1, 5120, 17408), (4, 17408, 5120), (16, 10240, 5120), (7, 1000, 2048)]


def _weight(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    q, s8, s2 = quantize_nvfp4(torch.randn(n, k, generator=g) * 0.05)
    return q.to(DEVICE), s8.to(DEVICE), s2.to(DEVICE)


@pytest.mark.parametrize("m,n,kk", SHAPES)
def test_gemv_matches_reference(m, n, kk):
    q, s8, s2 = _weight(n, kk, m + n)
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(kk)).to(DEVICE, DTYPE)
    out = torch.full((m, n), float("nan"))  # poisoned: every element must be written
    out = k.gemv(x, q, s8, s2, programs=8 if DEVICE == "cpu" else None)
    ref = k.reference(x, q, s8, s2)
    assert not torch.isnan(out).any()
    assert float((out - ref).norm() / ref.norm()) < 1e-5  # exact products, fp32 sums in another order


@pytest.mark.parametrize("n,kk", [(64, 256), (70, 512)] if DEVICE == "cpu" else [(17408, 5120), (1000, 2048)])
def test_dequantize_is_the_reference_rounded_the_same_way(n, kk):
    q, s8, s2 = _weight(n, kk, n)
    # bf16 on the GPU; the interpreter truncates float32 -> bf16, so it checks the float32 values
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    out = torch.full((n, kk), float("nan"), dtype=dtype, device=DEVICE)
    k.dequantize(q, s8, s2, out=out)
    assert torch.equal(out, k.reference_dequantize(q, s8, s2, dtype))


def test_gemv_rejects_what_it_cannot_do():
    q, s8, s2 = _weight(64, 256, 0)
    with pytest.raises(ValueError, match="M <= 16"):
        k.gemv(torch.zeros(17, 256, dtype=DTYPE, device=DEVICE), q, s8, s2)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("m,n,kk", [(1, 5120, 17408), (4, 17408, 5120), (9, 1024, 5120), (16, 48, 5120),
                                    (1, 16, 128), (3, 6144, 5120), (12, 32, 2432)])  # 2432: 19 K tiles
def test_cuda_gemv_matches_reference(m, n, kk):
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    q, s8, s2 = _weight(n, kk, m * n)
    # the codes' full range, 0.5 (a bf16 subnormal once placed) and the scales' subnormals included
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(kk + m)).to(DEVICE, DTYPE)
    ref = k.reference(x, q, s8, s2)
    tiled = cuda_ops.tile_nvfp4(q, s8)
    for shape in sorted(cuda_ops.GEMV_SHAPES):  # warps past the K tiles idle (K = 128: one tile)
        out = cuda_ops.nvfp4_gemv(x, q, s8, s2, shape=shape)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        assert rounded_once(out, ref), shape
        # the tiled codec pairs K differently inside each MMA: float32 sums in another order
        (out,) = cuda_ops.nvfp4_gemv_group(x, [(*tiled, s2)], shape, tiled=True, pipeline="ring")
        assert rounded_once(out, ref), shape
    for shape in sorted(cuda_ops.BULK_SHAPES):  # a partial last slot (19 tiles), slots reused (136 tiles)
        (out,) = cuda_ops.nvfp4_gemv_group(x, [(*tiled, s2)], shape, tiled=True, pipeline="bulk")
        assert rounded_once(out, ref), ("bulk", shape)
    # subnormal block scales (e4m3 exponent 0): every scale byte set to 1..7 must still decode exactly
    tiny = torch.randint(1, 8, s8.shape, generator=torch.Generator().manual_seed(1), dtype=torch.uint8).to(DEVICE)
    small = tiny.view(s8.dtype)
    assert rounded_once(cuda_ops.nvfp4_gemv(x, q, small, s2), k.reference(x, q, small, s2))
    # the tiled layout with zero, negative and subnormal scales mixed in (tile_nvfp4 rewrites them)
    odd = _odd_scales(s8, m + n)
    want = k.reference(x, q, odd, s2)
    for pipeline in ("ring", "bulk"):
        (got,) = cuda_ops.nvfp4_gemv_group(x, [(*cuda_ops.tile_nvfp4(q, odd), s2)], tiled=True, pipeline=pipeline)
        assert rounded_once(got, want) if want.abs().max() > 0 else torch.equal(got, torch.zeros_like(got))


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("m", [1, 12])
@pytest.mark.parametrize("pdl", [True, False])
def test_cuda_gemv_group_gives_each_weight_its_own_product(m, pdl):
    """Up to three weights of unequal N in one launch (the blocks of each part find their weight,
    scales and global scale): each output is its own reference's, tiled and row-major, in every pipeline
    (1040 rows: a part whose strip count is odd)."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    kk = 5120
    weights = [_weight(n, kk, n) for n in (6144, 1040, 528)]
    weights[1] = (weights[1][0], weights[1][1], weights[1][2] * 3)  # global scales differ per part
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(m)).to(DEVICE, DTYPE)
    for count in (2, 3):
        group = weights[:count]
        refs = [k.reference(x, *w) for w in group]
        tiled = [(*cuda_ops.tile_nvfp4(q, s8), s2) for q, s8, s2 in group]
        for outs in (cuda_ops.nvfp4_gemv_group(x, group, pdl=pdl),
                     *(cuda_ops.nvfp4_gemv_group(x, tiled, tiled=True, pdl=pdl, pipeline=pipeline)
                       for pipeline in cuda_ops.PIPELINES)):
            assert len(outs) == count
            for out, ref in zip(outs, refs):
                assert out.shape == ref.shape and rounded_once(out, ref)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("m,n,kk", [(1, 17408, 5120), (4, 17408, 5120), (12, 1024, 5120), (2, 32, 2432)])
def test_cuda_glu_is_silu_of_gate_times_up(m, n, kk):
    """gate and up (global scales unequal) in one launch of the bulk pipeline -> SiLU(gate) * up from the
    float32 sums, rounded once: each of its shapes (many blocks, a partial last slot); the ring refuses."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    (qg, sg, s2g), (qu, su, s2u) = _weight(n, kk, n + 1), _weight(n, kk, n + 2)
    s2u = s2u * 3
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(m)).to(DEVICE, DTYPE)
    want = torch.nn.functional.silu(k.reference(x, qg, sg, s2g)) * k.reference(x, qu, su, s2u)
    weights = [(*cuda_ops.tile_nvfp4(qg, sg), s2g), (*cuda_ops.tile_nvfp4(qu, su), s2u)]
    for shape in sorted(cuda_ops.BULK_SHAPES):
        (out,) = cuda_ops.nvfp4_gemv_group(x, weights, shape, tiled=True, pipeline="bulk", glu=True)
        assert out.shape == (m, n) and rounded_once(out, want), shape
    with pytest.raises(ValueError, match="bulk pipeline"):
        cuda_ops.nvfp4_gemv_group(x, weights, (8, 2), tiled=True, pipeline="ring", glu=True)


REFUSED_LAUNCHES = """
import torch
from ninfer_run.kernels import cuda_ops
assert cuda_ops.available()
x = torch.zeros(1, 256, dtype=torch.bfloat16, device="cuda")
q, s8 = (torch.zeros(16, n, dtype=torch.uint8, device="cuda") for n in (128, 16))
weight = [(q, s8, torch.ones(1, device="cuda"))]
y = torch.empty(1, 8, dtype=torch.bfloat16, device="cuda")
cases = {  # 3 warps: no such kernel, the launcher refuses; then arguments ops.cpp checks
    "launch": lambda: cuda_ops.nvfp4_gemv_group(x, weight, (3, 2)),
    "x [M, K]": lambda: cuda_ops.nvfp4_gemv_group(x[0], weight, (8, 2)),
    "each y bf16": lambda: torch.ops.ninfer.nvfp4_gemv(x, [q], [s8], [weight[0][2]], [y], 8, 2, False, True, 0, False),
}
for name, call in cases.items():
    try:
        print(name, "returned", call(), flush=True)
    except RuntimeError as err:
        print(name, "RuntimeError", str(err).splitlines()[0], flush=True)
"""


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
def test_cuda_gemv_refusal_is_an_error_not_a_crash():
    """What the extension refuses must come back with its reason, as a RuntimeError from cuda_ops (in a
    subprocess: a crash fails this test alone). Until stop 18 each of these ended the process with SIGSEGV
    on the H200 (csrc/ops.cpp's guarded says why)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", REFUSED_LAUNCHES], capture_output=True, text=True, timeout=600)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, (lines, r.stderr[-2000:])
    assert "launch RuntimeError nvfp4_gemv launch failed (warps 3, depth 2): CUDA error 1" in lines, lines
    assert "x [M, K] RuntimeError nvfp4_gemv: x [M, K]" in lines, lines
    assert "each y bf16 returned nvfp4_gemv: each y bf16 [M, its weight's N]" in lines, lines


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
# (4, 1024, 6144): x is 48 KB, the most staged x there is, so with the partial sums it takes the plain ring
# (it crashed the bench at C = 4 while the partials were not counted); (8, 512, 5120): x 80 KB, the plain ring
# (8, 17408, 5120) x 80 KB, (4, 5120, 17408) x 139 KB, (8, 5120, 17408) x 278 KB: the plain ring
@pytest.mark.parametrize("m,n,kk", [(1, 5120, 17408), (3, 6144, 5120), (8, 1024, 2048), (4, 1024, 6144), (8, 512, 5120),
                                    (2, 1040, 5120), (8, 17408, 5120), (4, 5120, 17408), (8, 5120, 17408)])
def test_cuda_gemv_with_x_staged_in_shared_memory_matches_reference(m, n, kk):
    """csrc's kRingStagedX (x copied to shared memory by each block; the default since stop 18): the same products."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    q, s8, s2 = _weight(n, kk, m + kk)
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(n)).to(DEVICE, DTYPE)
    ref = k.reference(x, q, s8, s2)
    tiled = [(*cuda_ops.tile_nvfp4(q, s8), s2)]
    for shape in sorted(cuda_ops.GEMV_SHAPES):
        (out,) = cuda_ops.nvfp4_gemv_group(x, tiled, shape, tiled=True, pipeline="ring-staged-x")
        assert rounded_once(out, ref), shape


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
# (1, 5120, 17408): the down projection, x and its zeros 34 KB; (1, 16, 128): one tile, 7 of 8 warps idle;
# (2, ...), (8, ...): more rows than one, the staged ring (bulk-block-columns: bulk) instead; 2432: 19 K
# tiles, a partial last slot of the bulk pipeline's 8 or 4
@pytest.mark.parametrize("m,n,kk", [(1, 5120, 17408), (1, 17408, 5120), (1, 1040, 2432), (1, 16, 128),
                                    (2, 1040, 5120), (8, 1024, 2048)])
def test_cuda_gemv_with_block_columns_matches_reference(m, n, kk):
    """csrc's Nvfp4Columns (ring-block-columns, and bulk-block-columns: the same arithmetic over the bulk
    pipeline's slots): each NVFP4 block an MMA column, its scale applied to the fp32 sum. The codes' full
    range (0.5: a bf16 subnormal in the MMA), zero, negative and subnormal scales, x of 1e-12 to 1e4 (staged
    times 2^100, which must stay exact)."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    q, s8, s2 = _weight(n, kk, m + kk + 1)
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(n + 3))
    for scales in (s8, _odd_scales(s8, n)):
        tiled = [(*cuda_ops.tile_nvfp4(q, scales), s2)]
        for magnitude in (1.0, 1e-12, 1e4):
            xm = (x * magnitude).to(DEVICE, DTYPE)
            ref = k.reference(xm, q, scales, s2)
            for pipeline, shapes in (("ring-block-columns", cuda_ops.GEMV_SHAPES),
                                     ("bulk-block-columns", cuda_ops.BULK_SHAPES)):
                for shape in sorted(shapes):
                    (out,) = cuda_ops.nvfp4_gemv_group(xm, tiled, shape, tiled=True, pipeline=pipeline)
                    assert rounded_once(out, ref), (pipeline, magnitude, shape)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
def test_cuda_block_columns_persistent_blocks_walk_every_part():
    """ring-block-columns and bulk-block-columns launch as many blocks as fit at once, each walking strips
    b, b + grid, ... (bulk-block-columns' slots and their barrier phases running on from strip to strip):
    three parts of 1,186 strips in all (more than the H200's resident blocks, so blocks cross from one part
    into the next), each output its own reference's."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    kk = 5120
    weights = [_weight(n, kk, n + 5) for n in (17408, 1040, 528)]
    x = torch.randn(1, kk, generator=torch.Generator().manual_seed(7)).to(DEVICE, DTYPE)
    tiled = [(*cuda_ops.tile_nvfp4(q, s8), s2) for q, s8, s2 in weights]
    for pipeline, shapes in (("ring-block-columns", cuda_ops.GEMV_SHAPES),
                             ("bulk-block-columns", cuda_ops.BULK_SHAPES)):
        for shape in sorted(shapes):
            outs = cuda_ops.nvfp4_gemv_group(x, tiled, shape, tiled=True, pipeline=pipeline)
            for out, w in zip(outs, weights):
                assert rounded_once(out, k.reference(x, *w)), (pipeline, shape)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("offset", [1.0, 0.0])
@pytest.mark.parametrize("residual", [True, False])
def test_cuda_norm_gemv_stages_the_layers_add_and_norm(offset, residual):
    """nvfp4_norm_gemv_group (one row; ring-block-columns and bulk-block-columns): the residual sum exactly as
    torch adds it, the normed row within one bf16 rounding of layers.rms_norm_reference (its sum of squares
    associates differently), and each output the float32 product of that very row rounded once, so every
    block staged the row block 0 wrote. Three parts, more strips than resident blocks, every shape built."""
    from ninfer_run import layers
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    kk = 5120
    weights = [_weight(n, kk, n + 11) for n in (17408, 1040, 528)]
    tiled = [(*cuda_ops.tile_nvfp4(q, s8), s2) for q, s8, s2 in weights]
    g = torch.Generator().manual_seed(int(offset) + 2 * residual)
    x = (torch.randn(1, kk, generator=g) * 3).to(DEVICE, DTYPE)
    h = torch.randn(1, kk, generator=g).to(DEVICE, DTYPE) if residual else None
    w = (torch.randn(kk, generator=g) * 0.1 + (0.0 if offset else 1.0)).to(DEVICE, DTYPE)
    want_sum = x + h if residual else x
    want_normed = layers.rms_norm_reference(want_sum, w, 1e-6, offset)
    for pipeline, shapes in (("ring-block-columns", cuda_ops.GEMV_SHAPES),
                             ("bulk-block-columns", cuda_ops.STAGED_BULK_SHAPES)):
        for shape in sorted(shapes):
            total, normed, outs = cuda_ops.nvfp4_norm_gemv_group(x, h, w, 1e-6, offset, tiled, normed=True,
                                                                 shape=shape, pipeline=pipeline)
            assert torch.equal(total, want_sum), (pipeline, shape)
            assert within_one_rounding(normed, want_normed), (pipeline, shape)
            for out, weight in zip(outs, weights):
                assert rounded_once(out, k.reference(normed, *weight)), (pipeline, shape)
            _, none, again = cuda_ops.nvfp4_norm_gemv_group(x, h, w, 1e-6, offset, tiled, shape=shape,
                                                            pipeline=pipeline)
            assert none is None and all(torch.equal(a, b) for a, b in zip(again, outs)), (pipeline, shape)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("n,kk", [(17408, 5120), (1040, 2432)])
def test_cuda_norm_glu_is_silu_of_gate_times_up_of_the_normed_row(n, kk):
    """bulk-block-columns with a staged norm and glu (one row, the engine's MLP block in one launch): gate's
    strip, then up's, through the same slots, -> SiLU(gate) * up of the row the launch normed, from the
    float32 sums, rounded once; the residual sum exact; glu without the norm too. 17408 x 5120: more strips
    than resident blocks; 2432: 19 K tiles, a partial last slot. The rings refuse glu."""
    from ninfer_run import layers
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    (qg, sg, s2g), (qu, su, s2u) = _weight(n, kk, n + 21), _weight(n, kk, n + 22)
    s2u = s2u * 3
    weights = [(*cuda_ops.tile_nvfp4(qg, sg), s2g), (*cuda_ops.tile_nvfp4(qu, su), s2u)]
    g = torch.Generator().manual_seed(kk)
    x, h = ((torch.randn(1, kk, generator=g) * 3).to(DEVICE, DTYPE) for _ in range(2))
    w = (torch.randn(kk, generator=g) * 0.1 + 1.0).to(DEVICE, DTYPE)

    def glu_of(row):
        return torch.nn.functional.silu(k.reference(row, qg, sg, s2g)) * k.reference(row, qu, su, s2u)

    for shape in sorted(cuda_ops.STAGED_BULK_SHAPES):
        total, normed, (out,) = cuda_ops.nvfp4_norm_gemv_group(x, h, w, 1e-6, 0.0, weights, normed=True, shape=shape,
                                                               pipeline="bulk-block-columns", glu=True)
        assert torch.equal(total, x + h), shape
        assert within_one_rounding(normed, layers.rms_norm_reference(x + h, w, 1e-6, 0.0)), shape
        assert out.shape == (1, n) and rounded_once(out, glu_of(normed)), shape
        (plain,) = cuda_ops.nvfp4_gemv_group(x, weights, shape, tiled=True, pipeline="bulk-block-columns", glu=True)
        assert rounded_once(plain, glu_of(x)), shape
    with pytest.raises(ValueError, match="glu"):
        cuda_ops.nvfp4_norm_gemv_group(x, h, w, 1e-6, 0.0, weights, pipeline="ring-block-columns", glu=True)
    for ring in ("ring-staged-x", "ring-block-columns"):
        with pytest.raises(ValueError, match="glu"):
            cuda_ops.nvfp4_gemv_group(x, weights, tiled=True, pipeline=ring, glu=True)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
def test_cuda_norm_gemv_refuses_what_it_cannot_stage():
    """More than one row, a sum written over x, or a norm weight of another length: a RuntimeError that says
    why, nothing launched."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    kk = 512
    q, s8, s2 = _weight(32, kk, 3)
    tiled = [(*cuda_ops.tile_nvfp4(q, s8), s2)]
    x, h = (torch.randn(2, kk, device=DEVICE).to(DTYPE) for _ in range(2))
    w = torch.ones(kk, device=DEVICE, dtype=DTYPE)
    with pytest.raises(RuntimeError, match="one row"):
        cuda_ops.nvfp4_norm_gemv_group(x, h, w, 1e-6, 1.0, tiled)
    ys = [torch.empty(1, 32, device=DEVICE, dtype=DTYPE)]
    args = [[t for t, _, _ in tiled], [sc.view(torch.uint8) for _, sc, _ in tiled], [s2.reshape(1).float()], ys, 8, 2, True,
            cuda_ops.PIPELINES["ring-block-columns"], False]
    with pytest.raises(RuntimeError, match="must not be x or residual"):
        cuda_ops._raise_refusal(torch.ops.ninfer.nvfp4_norm_gemv(x[:1], h[:1], w, x[:1], None, 1e-6, 1.0, *args))
    with pytest.raises(RuntimeError, match="weight bf16"):
        cuda_ops._raise_refusal(torch.ops.ninfer.nvfp4_norm_gemv(x[:1], None, w[:256], None, None, 1e-6, 1.0, *args))


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("pipeline,rows", [("ring", 1), ("ring-staged-x", 1), ("bulk", 1), ("ring-block-columns", 1),
                                           ("bulk-block-columns", 1), ("ring-staged-x", 4)])
def test_cuda_gemv_waits_for_the_kernel_that_writes_its_x(pipeline, rows):
    """A GEMV launched as a programmatic dependent starts while the kernel before it runs (the norm lets
    it: kernels/common.launch_dependents) and streams weights; it must read x only after that kernel's
    writes (griddepcontrol.wait). In a CUDA graph a norm over 16K rows writes x, its last rows, last; a GEMV
    that read early would see the previous replay's rows."""
    from ninfer_run.kernels import cuda_ops, norms

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    n, kk = 17408, 5120
    q, s8, s2 = _weight(n, kk, 9)
    tiled = [(*cuda_ops.tile_nvfp4(q, s8), s2)]
    source = torch.empty(16384, kk, device=DEVICE, dtype=DTYPE)
    weight = torch.rand(kk, device=DEVICE, dtype=DTYPE)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        normed = norms.rms_norm(source, weight, 1e-6, 0.0)  # warm-up (compiles) outside the capture
        cuda_ops.nvfp4_gemv_group(normed[-rows:], tiled, tiled=True, pipeline=pipeline)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            normed = norms.rms_norm(source, weight, 1e-6, 0.0)
            (y,) = cuda_ops.nvfp4_gemv_group(normed[-rows:], tiled, tiled=True, pdl=True, pipeline=pipeline)
    for seed in range(6):
        source.copy_(torch.randn(source.shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE))
        graph.replay()
        torch.cuda.synchronize()
        assert rounded_once(y, k.reference(normed[-rows:], q, s8, s2)), seed


def _odd_scales(s8: torch.Tensor, seed: int) -> torch.Tensor:
    """Block scales with every kind tile_nvfp4 rewrites or the GEMV's scale decode must get right mixed in:
    zero (+0 and -0, the codes then any), negative (their sign moves to the codes), e4m3 subnormals."""
    g = torch.Generator().manual_seed(seed)
    raw = s8.view(torch.uint8).cpu().clone()
    kind = torch.randint(0, 8, raw.shape, generator=g)
    raw = torch.where(kind == 0, 0, raw)
    raw = torch.where(kind == 1, 0x80, raw)
    raw = torch.where(kind == 2, raw | 0x80, raw)
    raw = torch.where(kind == 3, torch.randint(1, 8, raw.shape, generator=g, dtype=torch.uint8), raw)
    return raw.to(torch.uint8).to(s8.device).view(s8.dtype)


@pytest.mark.parametrize("n,kk", [(32, 256), (48, 384)] if DEVICE == "cpu" else [(17408, 5120), (1024, 2048)])
def test_dequantize_of_the_tiled_layout_equals_the_row_major_one(n, kk):
    from ninfer_run.kernels.cuda_ops import tile_nvfp4

    q, s8, s2 = _weight(n, kk, n + 1)
    s8 = _odd_scales(s8, n)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    want = k.dequantize(q, s8, s2, dtype=dtype)
    codes, scales = tile_nvfp4(q, s8)
    out = torch.full((n, kk), float("nan"), dtype=dtype, device=DEVICE)
    assert torch.equal(k.dequantize(codes, scales, s2, out=out, tiled_shape=(n, kk)), want)
