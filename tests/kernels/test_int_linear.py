"""Groupwise int4/int8 GEMV and dequantization kernels (Triton) against their pure-torch references."""

import pytest
import torch

from ninfer_pack.quant import quantize_int
from tests.kernels.conftest import rounded_once, within_one_rounding

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import int_linear as k  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter's bf16 dot is broken
SHAPES = [(1, 64, 256), (5, 72, 384)] if DEVICE == "cpu" else [(1, 5120, 17408), (8, 17408, 5120), (3, 1000, 2048)]
SCHEMES = [(4, 128, True), (4, 128, False), (8, 128, True), (4, 64, False)]


def _weight(n, kk, bits, group, symmetric, seed):
    g = torch.Generator().manual_seed(seed)
    parts = quantize_int(torch.randn(n, kk, generator=g) * 0.05, bits, group, symmetric, "w")
    return {role: t.to(DEVICE) for role, t in parts.items()}


MLP_SHAPES = {"gate": (512, 1280), "up": (512, 1280), "down": (1280, 512)}  # (N, K): K % 256 == 0, the bulk ones'


def _mlp_parts() -> dict[str, dict]:
    """An int4-g128 SwiGLU MLP's quantized parts (up symmetric, gate and down with zero points)."""
    return {name: _weight(n, kk, 4, 128, name != "up", n + kk + i) for i, (name, (n, kk)) in enumerate(MLP_SHAPES.items())}


def _mlp_weights(parts: dict[str, dict]):
    """The engine's QuantizedLinear for each of _mlp_parts (tiled at construction, as the loader's)."""
    from ninfer_run.kernels.linear import QuantizedLinear, Scratch

    scheme, scratch = {"kind": "int", "bits": 4, "group_size": 128}, Scratch()
    return {name: QuantizedLinear(scheme, {r: t.clone() for r, t in p.items()}, MLP_SHAPES[name], scratch,
                                  f"layers.0.mlp.{name}_proj") for name, p in parts.items()}


@pytest.mark.parametrize("bits,group,symmetric", SCHEMES)
@pytest.mark.parametrize("m,n,kk", SHAPES)
def test_gemv_matches_reference(m, n, kk, bits, group, symmetric):
    p = _weight(n, kk, bits, group, symmetric, m + n + bits)
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(kk)).to(DEVICE, DTYPE)
    out = k.gemv(x, p["qweight"], p["scale"], p.get("zero_point"), bits, group, programs=8 if DEVICE == "cpu" else None)
    ref = k.reference(x, p["qweight"], p["scale"], p.get("zero_point"), bits, group)
    assert not torch.isnan(out).any()
    assert float((out - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("bits,group,symmetric", SCHEMES)
def test_dequantize_is_the_reference_rounded_the_same_way(bits, group, symmetric):
    n, kk = (72, 256) if DEVICE == "cpu" else (17408, 5120)
    p = _weight(n, kk, bits, group, symmetric, n + bits)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter truncates to bf16
    out = torch.full((n, kk), float("nan"), dtype=dtype, device=DEVICE)
    k.dequantize(p["qweight"], p["scale"], p.get("zero_point"), bits, group, kk, out=out)
    assert torch.equal(out, k.reference_dequantize(p["qweight"], p["scale"], p.get("zero_point"), bits, group, kk,
                                                   dtype))


@pytest.mark.parametrize("symmetric", [True, False])
def test_dequantize_reads_the_tiled_layout(symmetric):
    """The prefill's dequantization of cuda_ops.tile_int4's codes and records == the reference's of the
    row-major parts."""
    from ninfer_run.kernels.cuda_ops import tile_int4

    n, kk = (48, 384) if DEVICE == "cpu" else (17408, 5120)
    p = _weight(n, kk, 4, 128, symmetric, n + symmetric)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    out = torch.full((n, kk), float("nan"), dtype=dtype, device=DEVICE)
    k.dequantize(*tile_int4(p["qweight"], p["scale"], p.get("zero_point")), None, 4, 128, kk, out=out, tiled=True)
    assert torch.equal(out, k.reference_dequantize(p["qweight"], p["scale"], p.get("zero_point"), 4, 128, kk, dtype))


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("m,n,kk", [(1, 5120, 17408), (4, 17408, 5120), (9, 1024, 5120), (16, 48, 5120), (1, 16, 128),
                                    (2, 64, 1280)])
def test_cuda_int4_gemv_matches_reference(m, n, kk, symmetric):
    """Row-major and tiled, every pipeline and shape: the reference's float32 sums rounded once. The bulk
    pipelines where K % 256 == 0 (K = 1280: a slot's last chunk holds 2 of its 8 or 4 tiles; bulk-staged-x
    at one row is its own persistent kernel, at more rows bulk's)."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    p = _weight(n, kk, 4, 128, symmetric, m * n)
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(kk + m)).to(DEVICE, DTYPE)
    ref = k.reference(x, p["qweight"], p["scale"], p.get("zero_point"), 4, 128)
    tiled = cuda_ops.tile_int4(p["qweight"], p["scale"], p.get("zero_point"))
    for shape in sorted(cuda_ops.GEMV_SHAPES):  # warps past the K tiles idle (K = 128: one tile)
        out = cuda_ops.int4_gemv(x, p["qweight"], p["scale"], p.get("zero_point"), shape=shape)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        assert rounded_once(out, ref), shape
        for pipeline in ("ring", "ring-staged-x"):  # the tiled codes (x staged where it fits)
            (out,) = cuda_ops.int4_gemv_group(x, [(*tiled, None)], shape, tiled=True,
                                              pipeline=pipeline)
            assert out.shape == (m, n) and rounded_once(out, ref), (shape, pipeline)
    for pipeline, shapes in (("bulk", cuda_ops.BULK_SHAPES), ("bulk-staged-x", cuda_ops.STAGED_BULK_SHAPES)):
        for shape in sorted(shapes) if kk % 256 == 0 else ():
            (out,) = cuda_ops.int4_gemv_group(x, [(*tiled, None)], shape, tiled=True, pipeline=pipeline)
            assert out.shape == (m, n) and rounded_once(out, ref), (shape, pipeline)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("m", [1, 12])
def test_cuda_int4_gemv_group_gives_each_weight_its_own_product(m):
    """Three weights of unequal N, symmetric and with zero points mixed, in one launch."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    kk = 5120
    parts = [_weight(n, kk, 4, 128, symmetric, n) for n, symmetric in ((6144, False), (1024, True), (528, False))]
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(m)).to(DEVICE, DTYPE)
    outs = cuda_ops.int4_gemv_group(x, [(p["qweight"], p["scale"], p.get("zero_point")) for p in parts])
    tiled_parts = [(*cuda_ops.tile_int4(p["qweight"], p["scale"], p.get("zero_point")), None) for p in parts]
    tiled = cuda_ops.int4_gemv_group(x, tiled_parts, tiled=True, pipeline="ring-staged-x")
    bulk = [cuda_ops.int4_gemv_group(x, tiled_parts, tiled=True, pipeline=pipeline) for pipeline in cuda_ops.INT4_BULK]
    for i, (out, out_tiled, p) in enumerate(zip(outs, tiled, parts)):
        ref = k.reference(x, p["qweight"], p["scale"], p.get("zero_point"), 4, 128)
        assert rounded_once(out, ref) and rounded_once(out_tiled, ref)
        assert all(rounded_once(ys[i], ref) for ys in bulk)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("m,n,kk", [(1, 17408, 5120), (3, 1024, 5120), (12, 1024, 5120), (1, 64, 1280)])
def test_cuda_int4_glu_is_silu_of_gate_times_up(m, n, kk):
    """gate (zero points) and up (symmetric) in one launch of the bulk pipelines -> SiLU(gate) * up from the
    float32 sums, rounded once, in each of their shapes (K = 1280: a partial last slot); the ring refuses."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    gate, up = _weight(n, kk, 4, 128, False, n + 1), _weight(n, kk, 4, 128, True, n + 2)
    x = torch.randn(m, kk, generator=torch.Generator().manual_seed(m)).to(DEVICE, DTYPE)
    want = torch.nn.functional.silu(k.reference(x, gate["qweight"], gate["scale"], gate["zero_point"], 4, 128)) * \
        k.reference(x, up["qweight"], up["scale"], None, 4, 128)
    weights = [(*cuda_ops.tile_int4(w["qweight"], w["scale"], w.get("zero_point")), None) for w in (gate, up)]
    for pipeline, shapes in (("bulk", cuda_ops.BULK_SHAPES), ("bulk-staged-x", cuda_ops.STAGED_BULK_SHAPES)):
        for shape in sorted(shapes):
            (out,) = cuda_ops.int4_gemv_group(x, weights, shape, tiled=True, pipeline=pipeline, glu=True)
            assert out.shape == (m, n) and rounded_once(out, want), (shape, pipeline)
    with pytest.raises(ValueError, match="bulk pipeline"):
        cuda_ops.int4_gemv_group(x, weights, (8, 2), tiled=True, pipeline="ring-staged-x", glu=True)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
def test_int4_mlp_writes_silu_mul_in_gate_and_ups_launch_where_the_bulk_pipeline_runs(monkeypatch):
    """layers.swiglu_mlp over int4 QuantizedLinear weights (tiled at construction): with INT4_PIPELINE
    bulk (or bulk-staged-x) and FUSED_GLU, gate and up are one launch that writes SiLU(gate) * up; with
    the staged ring, two GEMV outputs and silu_mul. Both the float32 reference MLP to bf16 rounding."""
    from ninfer_run import layers
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    raw = _mlp_parts()
    dense = {name: k.reference_dequantize(p["qweight"], p["scale"], p.get("zero_point"), 4, 128, MLP_SHAPES[name][1],
                                          torch.float32) for name, p in raw.items()}
    x = torch.randn(1, MLP_SHAPES["gate"][1], generator=torch.Generator().manual_seed(7)).to(DEVICE, DTYPE)
    want = (torch.nn.functional.silu(x.float() @ dense["gate"].T) * (x.float() @ dense["up"].T)) @ dense["down"].T
    glus = []
    launch = cuda_ops.int4_gemv_group

    def counted(*a, **kw):
        glus.append(kw.get("glu", False))
        return launch(*a, **kw)

    monkeypatch.setattr(cuda_ops, "int4_gemv_group", counted)
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", True)
    for pipeline, fused in (("bulk", True), ("bulk-staged-x", True), ("ring-staged-x", False)):
        monkeypatch.setattr(cuda_ops, "INT4_PIPELINE", pipeline)
        w = _mlp_weights(raw)
        assert all(q.tiled for q in w.values())
        glus.clear()
        got = layers.swiglu_mlp(x, w["gate"], w["up"], w["down"])
        assert glus == ([True, False] if fused else [False, False]), (pipeline, glus)
        assert float((got.float() - want).norm() / want.norm()) < 1e-2, pipeline


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
def test_cuda_int4_gemv_refuses_what_it_has_no_kernel_for():
    """The bulk pipeline takes tiled int4 where K % 256 == 0 (its records' copies 16-byte aligned), the
    block columns are NVFP4's, staged x needs the tiled codes: a clear error, no launch."""
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    p = _weight(64, 384, 4, 128, True, 1)
    x = torch.randn(1, 384).to(DEVICE, DTYPE)
    tiled = cuda_ops.tile_int4(p["qweight"], p["scale"])
    for weights, is_tiled, pipeline in (([(*tiled, None)], True, "bulk"),
                                        ([(*tiled, None)], True, "bulk-block-columns"),
                                        ([(p["qweight"], p["scale"], None)], False, "ring-staged-x")):
        with pytest.raises(RuntimeError, match="int4_gemv launch failed"):
            cuda_ops.int4_gemv_group(x, weights, tiled=is_tiled, pipeline=pipeline)
    with pytest.raises(RuntimeError, match=r"q: i32 \[N/16, K/128, 256\] \(tiled\)"):
        cuda_ops.int4_gemv_group(x, [(p["qweight"], p["scale"], None)], tiled=True)
    with pytest.raises(RuntimeError, match=r"tiled: scale u8 \[N/16, K/128, 40\]"):  # the row-major scales
        cuda_ops.int4_gemv_group(x, [(tiled[0], p["scale"], None)], tiled=True)



@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
@pytest.mark.parametrize("offset", [1.0, 0.0])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("glu", [False, True])
def test_cuda_int4_norm_gemv_stages_the_layers_add_and_norm(offset, residual, glu):
    """int4_norm_gemv_group (one row, bulk-staged-x, both staged shapes): the residual sum exactly as torch
    adds it, the normed row within one bf16 rounding of layers.rms_norm_reference, and each output the float32
    product of that very row rounded once (glu: SiLU(gate) * up of it), so every block staged the row block
    0 wrote. More strips than resident blocks (gate and up 17408 x 5120, three parts otherwise)."""
    from ninfer_run import layers
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    kk = 5120
    rows = (17408, 17408) if glu else (17408, 1040, 528)
    parts = [_weight(n, kk, 4, 128, i % 2 == 0, n + i) for i, n in enumerate(rows)]
    tiled = [(*cuda_ops.tile_int4(p["qweight"], p["scale"], p.get("zero_point")), None) for p in parts]
    g = torch.Generator().manual_seed(int(offset) + 2 * residual + 4 * glu)
    x = (torch.randn(1, kk, generator=g) * 3).to(DEVICE, DTYPE)
    h = torch.randn(1, kk, generator=g).to(DEVICE, DTYPE) if residual else None
    w = (torch.randn(kk, generator=g) * 0.1 + (0.0 if offset else 1.0)).to(DEVICE, DTYPE)
    want_sum = x + h if residual else x
    want_normed = layers.rms_norm_reference(want_sum, w, 1e-6, offset)

    def products(row):
        refs = [k.reference(row, p["qweight"], p["scale"], p.get("zero_point"), 4, 128) for p in parts]
        return [torch.nn.functional.silu(refs[0]) * refs[1]] if glu else refs

    for shape in sorted(cuda_ops.STAGED_BULK_SHAPES):
        total, normed, outs = cuda_ops.int4_norm_gemv_group(x, h, w, 1e-6, offset, tiled, normed=True, shape=shape,
                                                            glu=glu)
        assert torch.equal(total, want_sum), shape
        assert within_one_rounding(normed, want_normed), shape
        assert len(outs) == len(products(normed)) and all(
            rounded_once(out, want) for out, want in zip(outs, products(normed))), shape
        _, none, again = cuda_ops.int4_norm_gemv_group(x, h, w, 1e-6, offset, tiled, shape=shape, glu=glu)
        assert none is None and all(torch.equal(a, b) for a, b in zip(again, outs)), shape


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA C++ GEMV runs on a Hopper GPU")
def test_int4_layer_norm_and_mlp_are_one_launch_where_bulk_staged_x_runs(monkeypatch):
    """layers.add_rms_norm_swiglu_mlp over int4 QuantizedLinear weights at one row: with INT4_PIPELINE
    bulk-staged-x (FUSED_NORM, FUSED_GLU) the residual add, the norm, gate, up and SiLU-mul are one launch,
    then down's; the sum and the MLP's output those of the kernels apart (NINFER_FUSED_NORM=0) to bf16
    rounding; in bulk no norm launch runs."""
    from ninfer_run import layers
    from ninfer_run.kernels import cuda_ops

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    w = _mlp_weights(_mlp_parts())
    hidden = MLP_SHAPES["gate"][1]
    g = torch.Generator().manual_seed(3)
    x, h = ((torch.randn(1, hidden, generator=g) * 2).to(DEVICE, DTYPE) for _ in range(2))
    norm_w = (torch.randn(hidden, generator=g) * 0.1).to(DEVICE, DTYPE)
    launches = []
    launch = cuda_ops.int4_norm_gemv_group
    monkeypatch.setattr(cuda_ops, "int4_norm_gemv_group", lambda *a, **kw: launches.append(kw.get("glu")) or launch(*a, **kw))
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", True)
    results = {}
    for pipeline, fused in (("bulk-staged-x", True), ("bulk-staged-x", False), ("bulk", True)):
        monkeypatch.setattr(cuda_ops, "INT4_PIPELINE", pipeline)
        monkeypatch.setattr(cuda_ops, "FUSED_NORM", fused)
        launches.clear()
        results[pipeline, fused] = layers.add_rms_norm_swiglu_mlp(x, h, norm_w, 1e-6, 1.0, w["gate"], w["up"], w["down"])
        assert launches == ([True] if pipeline == "bulk-staged-x" and fused else []), (pipeline, fused, launches)
    (s1, y1), (s0, y0) = results["bulk-staged-x", True], results["bulk-staged-x", False]
    assert torch.equal(s1, s0) and float((y1.float() - y0.float()).norm() / y0.float().norm()) < 1e-2
