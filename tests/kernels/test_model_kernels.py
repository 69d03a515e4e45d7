"""The tiny hybrid model with attention through the Triton paged kernel equals the pure-torch path."""

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere

from ninfer_run.kv.pool import BlockPool, KVLayout  # noqa: E402
from ninfer_run.state import PagedKV, SequenceState  # noqa: E402


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
def test_paged_kernel_attention_in_the_model(tiny_model, model_id):
    model = tiny_model(model_id)
    c = model.cfg
    layers = {key: i for i, key in enumerate(model.kv_layers())}
    tokens = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(3))
    outs = {}
    for kernel in (False, True):
        kv = PagedKV(BlockPool(KVLayout(len(layers), c.num_kv_heads, c.head_dim, 16, "int8"), 8), layers)
        kv.kernel = kernel
        state = SequenceState(kv=kv)
        _, prefill = model.forward(tokens[:33], state)  # chunked prefill over the pool
        steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(33, 40)]  # decode
        outs[kernel] = torch.cat([prefill, *steps])
    err = float((outs[True] - outs[False]).abs().max() / outs[False].abs().max())
    assert err < 1e-4, err


@pytest.mark.parametrize("profile", ["nvfp4", "int4", "int4-asym", "int8"])
def test_quantized_weights_through_the_kernels(packed, profile):
    """Packed weights applied by the GEMV (decode) and dequantize + matmul (prefill) kernels give the
    reference model's logits."""
    from ninfer_run.loader import load

    path = packed("tiny-qwen3.5", profile)
    # compiled on a GPU in bf16 (the kernels' activation type), interpreted in fp32 on a CPU
    device, dtype, bound = ("cuda", torch.bfloat16, 2e-2) if torch.cuda.is_available() else ("cpu", torch.float32, 1e-4)
    reference, fast = load(path).model, load(path, device=device, dtype=dtype, kernels=True).model
    tokens = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(4))
    outs = []
    for model in (reference, fast):
        state = SequenceState()
        _, prefill = model.forward(tokens[:20], state)  # 20 rows: dequantize + matmul
        steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(20, 24)]  # 1 row: GEMV
        outs.append(torch.cat([prefill, *steps]).float().cpu())
    err = float((outs[1] - outs[0]).abs().max() / outs[0].abs().max())
    assert err < bound, err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("profile", ["nvfp4", "int4"])
def test_engine_on_cuda_matches_the_cpu_reference(packed, profile):
    """The whole GPU path (packed weights, bf16, paged INT8 kernel, engine pools on the device)."""
    from ninfer_run.engine import EngineConfig, Request, build_engine
    from ninfer_run.loader import load

    path = packed("tiny-qwen3.5", profile)
    cpu, gpu = load(path).model, load(path, device="cuda", dtype=torch.bfloat16).model
    tokens = torch.randint(0, 512, (50,), generator=torch.Generator().manual_seed(5))
    ref = cpu.forward(tokens, SequenceState())[1]
    engine = build_engine(gpu, EngineConfig(max_context=512, prefill_chunk=16, block_size=16))
    kv = PagedKV(engine.cache.pool, {key: i for i, key in enumerate(gpu.kv_layers())})
    got = gpu.forward(tokens, SequenceState(kv=kv))[1].float().cpu()
    assert float((got - ref).norm() / ref.norm()) < 3e-2  # bf16 activations vs the float32 reference
    result = engine.submit(Request(tokens.tolist(), max_tokens=8))
    engine.run_until_done()
    assert result.finish_reason == "length" and len(result.tokens) == 8
