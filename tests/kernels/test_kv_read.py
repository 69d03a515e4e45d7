"""One KV head decoded from the INT8 pool by the Triton kernel (kernels/kv_read.py) against the pool's
torch path (BlockPool.read_head): the same values bit for bit, every head, blocks out of order, a length
that ends inside a block and inside a program's positions, scales down to fp16's subnormals."""

import pytest
import torch

from ninfer_run.kv.pool import BlockPool, KVLayout

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere
from ninfer_run.kernels import kv_read  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


@pytest.mark.parametrize("heads,dim,length", [(3, 128, 101), (4, 256, 64)])
def test_read_head_is_the_pools(heads, dim, length):
    layout = KVLayout(2, heads, dim, 16, "int8")
    pool = BlockPool(layout, 12, "cpu")
    g = torch.Generator().manual_seed(heads + length)
    for name in ("k", "v"):
        getattr(pool, name).copy_(torch.randint(-127, 128, pool.k.shape, generator=g, dtype=torch.int8))
    for name in ("k_scale", "v_scale"):  # e^-17 .. e^4: products from fp16 subnormals up, in float32 exactly
        getattr(pool, name).copy_(torch.exp(torch.empty(pool.k_scale.shape).uniform_(-17, 4, generator=g)).half())
    blocks = torch.randperm(12, generator=g)[: -(-length // 16)].tolist()
    table = torch.tensor(blocks, dtype=torch.int32, device=DEVICE)
    want = [pool.read_head(1, blocks, length, h, DTYPE) for h in range(heads)]
    pool_on_device = BlockPool(layout, 12, DEVICE)
    for name in ("k", "v", "k_scale", "v_scale"):
        getattr(pool_on_device, name).copy_(getattr(pool, name))
    for h in range(heads):
        k, v = kv_read.read_head(pool_on_device, 1, table, length, h, DTYPE)
        assert k.shape == (length, dim) and k.dtype == DTYPE
        assert torch.equal(k.cpu(), want[h][0]) and torch.equal(v.cpu(), want[h][1]), h
