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
