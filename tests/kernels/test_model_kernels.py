"""The tiny hybrid model with attention through the Triton paged kernel equals the pure-torch path."""

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # `pytest -m gpu`: compiled on a GPU, in Triton's interpreter elsewhere

from ninfer_run.kv.pool import BlockPool, KVLayout  # noqa: E402
from ninfer_run.state import PagedKV, SequenceState  # noqa: E402


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm())


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check of a CPU pool; on a GPU the engine test "
                                                      "below runs the same path")
@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
def test_paged_kernel_attention_in_the_model(tiny_model, model_id):
    """Prefill of 100 tokens (the dense long-chunk path), then decode steps through the paged kernel."""
    model = tiny_model(model_id)
    c = model.cfg
    layers = {key: i for i, key in enumerate(model.kv_layers())}
    tokens = torch.randint(0, 512, (107,), generator=torch.Generator().manual_seed(3))
    outs = {}
    for kernel in (False, True):
        kv = PagedKV(BlockPool(KVLayout(len(layers), c.num_kv_heads, c.head_dim, 16, "int8"), 8), layers)
        kv.kernel = kernel
        state = SequenceState(kv=kv)
        _, prefill = model.forward(tokens[:100], state)
        steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(100, 107)]  # decode
        outs[kernel] = torch.cat([prefill, *steps])
    err = float((outs[True] - outs[False]).abs().max() / outs[False].abs().max())
    assert err < 2e-3, err  # the paged kernel's dots take fp16 operands, even from this float32 model


@pytest.mark.parametrize("profile", ["nvfp4", "int4", "int4-asym", "int8"])
def test_quantized_weights_through_the_kernels(packed, profile):
    """Packed weights applied by the GEMV (decode) and dequantize + matmul (prefill) kernels give the
    reference model's logits."""
    from ninfer_run.loader import load

    path = packed("tiny-qwen3.5", profile)
    tokens = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(4))

    def logits(model) -> torch.Tensor:
        state = SequenceState()
        _, prefill = model.forward(tokens[:20], state)  # 20 rows: dequantize + matmul
        steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(20, 24)]  # 1 row: GEMV
        return torch.cat([prefill, *steps])

    reference = logits(load(path).model)
    if not torch.cuda.is_available():  # Triton's interpreter, float32 throughout
        model = load(path, kernels=True).model
        quantized = {name: w for name, w in model.w.items() if not isinstance(w, torch.Tensor)}
        assert {name for name, w in quantized.items() if w.mlp} == {n for n in quantized if ".mlp." in n} != set()
        assert _rel(logits(model), reference) < 1e-4
        return
    # compiled, in bf16 (the kernels' activation type): the kernels may not add error beyond what bf16
    # itself costs the same weights on the torch path (the random tiny model amplifies rounding)
    fast = _rel(logits(load(path, device="cuda", dtype=torch.bfloat16, kernels=True).model), reference)
    floor = _rel(logits(load(path, device="cuda", dtype=torch.bfloat16, kernels=False).model), reference)
    assert fast < 2 * floor + 1e-3, (fast, floor)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("profile", ["nvfp4", "int4"])
def test_engine_on_cuda_matches_the_cpu_reference(packed, profile):
    """The whole GPU path (packed weights, bf16, paged INT8 kernel, engine pools on the device)."""
    from ninfer_run.engine import EngineConfig, Request, build_engine
    from ninfer_run.loader import load

    path = packed("tiny-qwen3.5", profile)
    cpu, gpu = load(path).model, load(path, device="cuda", dtype=torch.bfloat16).model
    tokens = torch.randint(0, 512, (100,), generator=torch.Generator().manual_seed(5))  # > 64: the dense prefill path
    ref = cpu.forward(tokens, SequenceState())[1]
    engine = build_engine(gpu, EngineConfig(max_context=512, prefill_chunk=16, block_size=16))
    kv = PagedKV(engine.cache.pool, {key: i for i, key in enumerate(gpu.kv_layers())})
    got = _rel(gpu.forward(tokens, SequenceState(kv=kv))[1], ref)
    plain = load(path, device="cuda", dtype=torch.bfloat16, kernels=False).model  # the bf16 torch path, same pool
    kv = PagedKV(engine.cache.pool, {key: i for i, key in enumerate(gpu.kv_layers())})
    kv.kernel = False
    floor = _rel(plain.forward(tokens, SequenceState(kv=kv))[1], ref)
    assert got < 2 * floor + 1e-3, (got, floor)  # the kernels add no error beyond bf16's own
    result = engine.submit(Request(tokens.tolist(), max_tokens=8))
    engine.run_until_done()
    assert result.finish_reason == "length" and len(result.tokens) == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])  # zero-centred (1 + w) and plain norms
@pytest.mark.parametrize("pipeline,glu", [("ring-block-columns", False), ("bulk-block-columns", False),
                                          ("bulk-block-columns", True), ("mlp:bulk-block-columns", True)])
def test_one_row_steps_stage_the_layer_norms_in_the_gemvs(packed, monkeypatch, model_id, pipeline, glu):
    """At one row on Hopper every layer's input and post-attention norm runs inside the NVFP4 GEMV that
    reads it (cuda_ops.nvfp4_norm_gemv_group: two launches a layer, none at more rows; with FUSED_GLU the
    MLP's launch writes SiLU(gate) * up too; "mlp:" the MLP's launches alone in that pipeline, MLP_PIPELINE),
    and the logits are those of the same model with a norm kernel before each GEMV (NINFER_FUSED_NORM=0),
    to bf16 rounding."""
    from ninfer_run.kernels import cuda_ops
    from ninfer_run.loader import load

    if not cuda_ops.available():
        pytest.skip("no sm_90 GPU or the extension did not build")
    model = load(packed(model_id, "nvfp4"), device="cuda", dtype=torch.bfloat16).model
    mlp_only = pipeline.startswith("mlp:")
    monkeypatch.setattr(cuda_ops, "PIPELINE", "ring-block-columns" if mlp_only else pipeline)
    monkeypatch.setattr(cuda_ops, "MLP_PIPELINE", pipeline.removeprefix("mlp:"))
    monkeypatch.setattr(cuda_ops, "FUSED_GLU", glu)
    calls = []  # each launch's glu
    pipelines = set()  # (glu, pipeline) of each launch
    launch = cuda_ops.nvfp4_norm_gemv_group

    def counted(*a, **kw):
        calls.append(kw.get("glu", False))
        pipelines.add((kw.get("glu", False), kw.get("pipeline")))
        return launch(*a, **kw)

    monkeypatch.setattr(cuda_ops, "nvfp4_norm_gemv_group", counted)
    tokens = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(8))
    logits = {}
    layers = model.cfg.num_layers
    for fused in (True, False):
        monkeypatch.setattr(cuda_ops, "FUSED_NORM", fused)
        state, calls[:] = SequenceState(), []
        _, prefill = model.forward(tokens[:20], state)
        assert calls == []  # 20 rows: a norm kernel, then dequantize + matmul
        steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(20, 24)]
        assert len(calls) == (4 * 2 * layers if fused else 0)
        assert sum(calls) == (4 * layers if fused and glu else 0)
        if fused and mlp_only:  # the MLP's launch (glu) in MLP_PIPELINE, the layers' others in PIPELINE's
            assert pipelines == {(True, "bulk-block-columns"), (False, "ring-block-columns")}, pipelines
        logits[fused] = torch.cat([prefill, *steps])
    assert _rel(logits[True], logits[False]) < 2e-2
