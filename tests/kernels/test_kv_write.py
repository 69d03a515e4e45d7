"""The graphed step's fused K/V quantize-and-store (kernels/kv_write.py) against the pool's torch path
(kv/quant.quantize_kv + indexed stores): the same int8 values and fp16 scales, bit for bit, at the
same slots, nothing else touched; ties at .5 and all-zero groups included."""

import pytest
import torch

from ninfer_run.kv.pool import BlockPool, KVLayout

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import kv_write  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


@pytest.mark.parametrize("heads,dim", [(2, 128), (4, 256)])
def test_quantized_store_is_the_pools(heads, dim):
    layout = KVLayout(3, heads, dim, 16, "int8")
    fused, torch_path = BlockPool(layout, 16, DEVICE), BlockPool(layout, 16, "cpu")
    g = torch.Generator().manual_seed(heads + dim)
    rows = 200  # enough values that a division rounded otherwise would flip some x / scale past a .5
    k = torch.randn(rows, heads, dim, generator=g) * 3
    v = torch.randn(rows, heads, dim, generator=g)
    k[1, 0, :64] = 0  # an all-zero group: scale 1
    k[2, 0, :64] = torch.tensor([127.0] + [0.5, 1.5, 2.5, -0.5, -2.5, 3.5, -3.5] * 9)  # scale 1, ties at .5
    k, v = k.to(DTYPE), v.to(DTYPE)
    slots = torch.randperm(16 * 16, generator=g)[:rows]  # distinct
    torch_path.write_slots(1, slots, k, v)  # the CPU pool: quantize_kv and indexed stores
    kv_write.write_slots(fused, 1, slots.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
    for name in ("k", "v", "k_scale", "v_scale"):
        assert torch.equal(getattr(fused, name).cpu(), getattr(torch_path, name)), name
    tie = int(slots[2])
    assert torch.equal(fused.k[1, tie // 16, tie % 16, 0, :8].cpu(), torch.tensor([127, 0, 2, 2, 0, -2, 4, -4], dtype=torch.int8))


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norm_rope_write_is_qk_norm_rope_then_the_write(offset):
    """q/k norm + RoPE and the K/V write in one launch: q exactly as norms.qk_norm_rope gives it, and the
    pool exactly as write_slots leaves it after that launch's k (int8 values and scales bit for bit, the
    same slots, nothing else touched)."""
    from ninfer_run import layers
    from ninfer_run.kernels import norms

    g = torch.Generator().manual_seed(41 + int(offset))
    t, heads, kv_heads, dim, rotary = 5, 6, 2, 128, 64
    layout = KVLayout(3, kv_heads, dim, 16, "int8")
    fused, apart = BlockPool(layout, 16, DEVICE), BlockPool(layout, 16, DEVICE)
    q = (torch.randn(t, heads, 2 * dim, generator=g) * 3).to(DEVICE, DTYPE)[..., :dim]  # strided, as Qwen3.5's
    k = (torch.randn(t, kv_heads, dim, generator=g) * 3).to(DEVICE, DTYPE)
    v = torch.randn(t, kv_heads, dim, generator=g).to(DEVICE, DTYPE)
    wq, wk = ((torch.randn(dim, generator=g) * 0.1 + (0 if offset else 1)).to(DEVICE, DTYPE) for _ in range(2))
    cos, sin = layers.rope_cos_sin(torch.tensor([0, 7, 8, 9, 1000], device=DEVICE), rotary, 1e7, DTYPE)
    slots = torch.randperm(16 * 16, generator=g)[:t].to(DEVICE)

    got_q = kv_write.norm_rope_write_slots(fused, 2, slots, q, k, v, wq, wk, 1e-6, offset, cos, sin)
    want_q, want_k = norms.qk_norm_rope(q, k, wq, wk, 1e-6, offset, cos, sin)
    kv_write.write_slots(apart, 2, slots, want_k, v)

    assert got_q.shape == q.shape and torch.equal(got_q, want_q)
    for name in ("k", "v", "k_scale", "v_scale"):
        assert torch.equal(getattr(fused, name), getattr(apart, name)), name
    assert fused.k[2].any() and not fused.k[:2].any()  # the layer's slots, no other layer's
