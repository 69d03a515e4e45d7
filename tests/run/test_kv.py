"""Paged INT8 group-64 KV: the pool's bookkeeping, the encoding, and its accuracy cost vs bf16 KV."""

import pytest
import torch

from ninfer_run.kv.pool import BlockPool, KVLayout, PoolExhausted
from ninfer_run.kv.quant import dequantize_kv, quantize_kv
from ninfer_run.state import DenseKV, PagedKV, SequenceState


def test_int8_group64_roundtrip_error_bound():
    x = torch.randn(50, 4, 256) * 3
    x[0, 0, :64] = 0
    q, s = quantize_kv(x)
    assert q.dtype == torch.int8 and s.shape == (50, 4, 4)
    err = (dequantize_kv(q, s) - x).abs()
    bound = s.float().repeat_interleave(64, -1) * 0.5 * (1 + 1e-3)
    assert bool((err <= bound).all()) and bool((dequantize_kv(q, s)[0, 0, :64] == 0).all())


def test_pool_allocate_release_refcount_and_exhaustion():
    layout = KVLayout(layers=2, kv_heads=2, head_dim=64, block_size=16)
    pool = BlockPool.for_context(layout, max_context=100)
    assert pool.num_blocks == 7 and layout.bytes_per_token == 2 * 2 * 2 * 64 + 2 * 2 * 2 * 2
    a = pool.allocate(5)
    with pytest.raises(PoolExhausted, match="need 3 blocks, 2 of 7 free"):
        pool.allocate(3)
    pool.retain(a[:2])
    pool.release(a)
    assert pool.free_blocks == 5
    pool.release(a[:2])
    assert pool.free_blocks == 7
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(a[:1])


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_pool_write_read(dtype):
    layout = KVLayout(layers=1, kv_heads=2, head_dim=64, block_size=8, dtype=dtype)
    pool = BlockPool(layout, 10)
    blocks = pool.allocate(3)[::-1]  # any block order
    k, v = torch.randn(20, 2, 64), torch.randn(20, 2, 64)
    pool.write(0, blocks, 0, k[:13], v[:13])
    pool.write(0, blocks, 13, k[13:], v[13:])
    rk, rv = pool.read(0, blocks, 20)
    tol = 0.02 if dtype == "int8" else 0.01
    assert float((rk - k).abs().max()) < tol * float(k.abs().max()) and float((rv - v).abs().max()) < tol * float(v.abs().max())


def _run(model, tokens, kv):
    state = SequenceState(kv=kv)
    _, first = model.forward(tokens[:25], state)
    steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(25, len(tokens))]
    return torch.cat([first, *steps])


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
def test_paged_kv_logits_and_int8_accuracy_cost(model_id, tiny_model, record_property):
    model = tiny_model(model_id)
    c = model.cfg
    tokens = torch.randint(0, 512, (60,), generator=torch.Generator().manual_seed(5))
    layers = {key: i for i, key in enumerate(model.kv_layers())}
    reference = _run(model, tokens, DenseKV())
    results = {}
    for dtype in ("bf16", "int8"):
        pool = BlockPool(KVLayout(len(layers), c.num_kv_heads, c.head_dim, block_size=16, dtype=dtype), 8)
        kv = PagedKV(pool, layers)
        results[dtype] = _run(model, tokens, kv)
        kv.release()
        assert pool.free_blocks == 8
    scale = float(reference.abs().max())
    bf16_err = float((results["bf16"] - reference).abs().max()) / scale
    int8_err = float((results["int8"] - results["bf16"]).abs().max()) / scale
    record_property("int8_vs_bf16_kv_max_rel_logit_err", int8_err)
    print(f"{model_id}: bf16 paged KV vs fp32 reference {bf16_err:.2e}; INT8 vs bf16 KV {int8_err:.2e}")
    # measured on these models (seeded prompt): bf16 vs fp32 6e-4 (hybrid, 1 attention layer) and 4.1e-3
    # (dense, 4); INT8 vs bf16 2.1e-3 and 1.5e-2 of the logit range. Bounds at about twice that.
    assert bf16_err < 1e-2
    assert int8_err < 3e-2
    assert int(results["int8"][-10:].argmax(-1).ne(results["bf16"][-10:].argmax(-1)).sum()) <= 2


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_read_head_in_slices_equals_read(dtype):
    """One head's K/V decoded a slice at a time (the dense prefill path) equals the whole read."""
    pool = BlockPool(KVLayout(2, 3, 64, 16, dtype), 12)
    blocks = pool.allocate(9)[::-1]
    g = torch.Generator().manual_seed(1)
    pool.write(1, blocks, 0, torch.randn(130, 3, 64, generator=g), torch.randn(130, 3, 64, generator=g))
    k, v = pool.read(1, blocks, 130, torch.bfloat16)
    for head in range(3):
        kh, vh = pool.read_head(1, blocks, 130, head, torch.bfloat16, slice_tokens=7)
        assert torch.equal(kh, k[:, head]) and torch.equal(vh, v[:, head])
