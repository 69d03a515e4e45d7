"""The fused small ops against their torch references on fresh inputs: RMSNorm (zero-centred offset
and plain weights, q/k-norm shaped rows, alone and followed by partial RoPE), the gated GDN output
norm, the GDN gates.
On a CPU the interpreter runs them in fp16 (its float32 -> bf16 cast truncates instead of rounding;
in fp16 the results were bit-identical); on a GPU in bf16."""

import pytest
import torch

from ninfer_run import layers

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import norms  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("shape", [(5, 256), (3, 4, 128), (1, 5120)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_reference(shape, offset):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=g) * 3).to(DEVICE, DTYPE)
    w = (torch.randn(shape[-1], generator=g) * 0.1 + (0 if offset else 1)).to(DEVICE, DTYPE)
    got, want = norms.rms_norm(x, w, 1e-6, offset), layers.rms_norm_reference(x, w, 1e-6, offset)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert _rel(got, want) < 4e-3  # sums may associate differently: rare 1-ulp flips of the output


@pytest.mark.parametrize("heads,dim,rotary", [(3, 256, 64), (2, 128, 128)])  # Qwen3.5's partial, Qwen3's full
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("strided", [False, True])
def test_rms_norm_rope_matches_reference(heads, dim, rotary, offset, strided):
    """strided: x is every other head_dim of a wider row, as Qwen3.5's q in its q/gate projection (read in
    place by the kernel, not copied first)."""
    g = torch.Generator().manual_seed(heads + dim + rotary)
    t = 5
    wide = (torch.randn(t, heads, 2 * dim, generator=g) * 3).to(DEVICE, DTYPE)
    x = wide[..., :dim] if strided else wide[..., :dim].contiguous()
    w = (torch.randn(dim, generator=g) * 0.1 + (0 if offset else 1)).to(DEVICE, DTYPE)
    cos, sin = layers.rope_cos_sin(torch.tensor([0, 7, 8, 9, 1000], device=DEVICE), rotary, 1e7, DTYPE)
    got = norms.rms_norm_rope(x, w, 1e-6, offset, cos, sin)
    want = layers.apply_rope(layers.rms_norm_reference(x, w, 1e-6, offset), cos, sin)
    assert got.shape == want.shape and got.dtype == want.dtype
    # as the norm alone: sums may associate differently (rare 1-ulp flips); the rotated columns by themselves
    assert _rel(got, want) < 4e-3 and _rel(got[..., :rotary], want[..., :rotary]) < 4e-3


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_qk_norm_rope_is_each_ones_norm_and_rope(offset):
    """An attention layer's q (strided, as Qwen3.5's) and k in one launch: each exactly what its own
    rms_norm_rope launch gives (the same row code, its own weight, heads and stride)."""
    g = torch.Generator().manual_seed(11)
    t, heads, kv_heads, dim, rotary = 5, 6, 2, 128, 64
    q = (torch.randn(t, heads, 2 * dim, generator=g) * 3).to(DEVICE, DTYPE)[..., :dim]
    k = (torch.randn(t, kv_heads, dim, generator=g) * 3).to(DEVICE, DTYPE)
    wq, wk = ((torch.randn(dim, generator=g) * 0.1 + (0 if offset else 1)).to(DEVICE, DTYPE) for _ in range(2))
    cos, sin = layers.rope_cos_sin(torch.tensor([0, 7, 8, 9, 1000], device=DEVICE), rotary, 1e7, DTYPE)
    got_q, got_k = norms.qk_norm_rope(q, k, wq, wk, 1e-6, offset, cos, sin)
    assert torch.equal(got_q, norms.rms_norm_rope(q, wq, 1e-6, offset, cos, sin))
    assert torch.equal(got_k, norms.rms_norm_rope(k, wk, 1e-6, offset, cos, sin))


@pytest.mark.parametrize("weight_dtype", ["same", "float32"])
def test_gated_rms_norm_matches_reference(weight_dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 3, 128, generator=g).to(DEVICE, DTYPE)
    gate = (torch.randn(6, 3, 128, generator=g) * 2).to(DEVICE, DTYPE)
    w = (torch.randn(128, generator=g) * 0.1 + 1).to(DEVICE, DTYPE if weight_dtype == "same" else torch.float32)
    got, want = norms.gated_rms_norm(x, gate, w, 1e-6), layers.gated_rms_norm_reference(x, gate, w, 1e-6)
    assert got.dtype == want.dtype and _rel(got, want) < 4e-3


@pytest.mark.parametrize("gated,offset,strided", [(True, 0.0, False), (False, 1.0, True), (False, 0.0, False)])
def test_narrow_rows_many_a_program_match_reference(gated, offset, strided, monkeypatch):
    """A prefill chunk's narrow rows (the GDN output norm's 128 columns) go many to a program: the same
    values as the reference and as one row a program (74 rows: two full programs and a partial one;
    strided: every other 128 columns of wider rows, read in place)."""
    g = torch.Generator().manual_seed(9)
    wide = (torch.randn(37, 2, 256, generator=g) * 3).to(DEVICE, DTYPE)
    x = wide[..., :128] if strided else wide[..., :128].contiguous()
    gate = (torch.randn(37, 2, 128, generator=g) * 2).to(DEVICE, DTYPE)
    w = (torch.randn(128, generator=g) * 0.1 + (0 if offset else 1)).to(DEVICE, DTYPE)

    def norm():
        return norms.gated_rms_norm(x, gate, w, 1e-6) if gated else norms.rms_norm(x, w, 1e-6, offset)

    one_row = norm()
    monkeypatch.setattr(norms, "NARROW_MIN_ROWS", 64)
    got = norm()
    want = (layers.gated_rms_norm_reference(x, gate, w, 1e-6) if gated
            else layers.rms_norm_reference(x, w, 1e-6, offset))
    assert got.shape == want.shape and got.dtype == want.dtype
    assert _rel(got, want) < 4e-3 and _rel(got, one_row) < 2e-3


@pytest.mark.parametrize("rows", [1, 37])
def test_gdn_gates_match_reference(rows):
    """The fused GDN gates (log-decay and beta) vs the torch form, including softplus above its threshold."""
    from ninfer_run.kernels.gated_delta import gates_reference
    from ninfer_run.kernels.gdn_gates import gdn_gates

    g = torch.Generator().manual_seed(rows)
    a = (torch.randn(rows, 48, generator=g) * 8).to(DEVICE, DTYPE)  # some a + dt_bias > 20
    b = (torch.randn(rows, 48, generator=g) * 3).to(DEVICE, DTYPE)
    a_log = (torch.rand(48, generator=g) * 2.7).to(DEVICE, DTYPE)
    dt_bias = (torch.randn(48, generator=g) + 10).to(DEVICE, DTYPE)
    got, want = gdn_gates(a, b, a_log, dt_bias), gates_reference(a, b, a_log, dt_bias)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype == torch.float32 and _rel(x, y) < 1e-5


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_add_rms_norm_matches_reference(offset):
    """The residual add and the norm after it in one kernel: the sum as torch rounds it, and its norm."""
    g = torch.Generator().manual_seed(11 + int(offset))
    x = (torch.randn(4, 640, generator=g) * 3).to(DEVICE, DTYPE)
    h = torch.randn(4, 640, generator=g).to(DEVICE, DTYPE)
    w = (torch.randn(640, generator=g) * 0.1 + (0 if offset else 1)).to(DEVICE, DTYPE)
    total, normed = norms.add_rms_norm(x, h, w, 1e-6, offset)
    assert torch.equal(total, x + h)  # one rounding of an exact float32 sum: bit for bit
    want = layers.rms_norm_reference(x + h, w, 1e-6, offset)
    assert normed.dtype == want.dtype and _rel(normed, want) < 4e-3


@pytest.mark.parametrize("n", [1, 5120, 3 * 17408 + 5])
def test_silu_mul_matches_reference(n):
    from ninfer_run.kernels.activations import silu_mul

    g = torch.Generator().manual_seed(n)
    gate = (torch.randn(n, generator=g) * 4).to(DEVICE, DTYPE)
    up = torch.randn(n, generator=g).to(DEVICE, DTYPE)
    got, want = silu_mul(gate, up), layers.silu_mul_reference(gate, up)
    assert got.shape == want.shape and got.dtype == want.dtype and _rel(got, want) < 4e-3


@pytest.mark.parametrize("rows,k", [(1, 5120), (4, 640), (16, 384)])
def test_projected_gdn_gates_match_reference(rows, k):
    """in_proj_a/b (stacked, bf16) and the gates in one kernel vs F.linear then the gates: the projection
    rounded to x's dtype as F.linear's output is (sums in another order: a bf16 rounding apart at most)."""
    from ninfer_run.kernels.gated_delta import projected_gates_reference
    from ninfer_run.kernels.gdn_gates import projected_gates

    g = torch.Generator().manual_seed(rows + k)
    x = torch.randn(rows, k, generator=g).to(DEVICE, DTYPE)
    w_ab = (torch.randn(96, k, generator=g) * 2.4 / k**0.5).to(DEVICE, DTYPE)  # a ~ N(0, 2.4)
    a_log = (torch.rand(48, generator=g) * 2.7).to(DEVICE, DTYPE)
    dt_bias = (torch.randn(48, generator=g) + 18).to(DEVICE, DTYPE)  # a + dt_bias past softplus's 20 often
    got, want = projected_gates(x, w_ab, a_log, dt_bias), projected_gates_reference(x, w_ab, a_log, dt_bias)
    for x_, y in zip(got, want):
        assert x_.shape == y.shape == (rows, 48) and x_.dtype == torch.float32
        # a or b an ulp apart here and there (sum order), those gates ~0.5% apart; the rest equal to float32's
        # last bits (so the projection is rounded to x's dtype, as F.linear's output is)
        same = (x_ - y).abs() <= 1e-6 * y.abs()
        assert _rel(x_, y) < 5e-3 and float(same.float().mean()) > 0.8
    with pytest.raises(ValueError, match="at most 16 rows"):
        projected_gates(torch.zeros(17, k, dtype=DTYPE, device=DEVICE), w_ab, a_log, dt_bias)
