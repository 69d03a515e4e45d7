"""The reference runtime against transformers' own implementation, on the tiny checkpoints."""

import pytest
import torch

from ninfer_run.loader import load
from ninfer_run.state import SequenceState

transformers = pytest.importorskip("transformers")
MODELS = ["tiny-qwen3.5", "tiny-qwen3"]


@pytest.fixture(scope="module")
def artifacts(packed):
    return {(m, p): packed(m, p) for m in MODELS for p in ("bf16", "nvfp4", "int4")}


def _hf(src, weights=None):
    """transformers' model for the checkpoint, optionally with our (dequantized) weights copied in."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    if weights is not None:
        with torch.no_grad():
            for name, param in model.state_dict().items():
                key = name if name in weights else name.replace("model.", "model.language_model.", 1)
                param.copy_(weights[key])
    return model


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed))


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("model_id", MODELS)
def test_bf16_logits_match_transformers(model_id, tiny_checkpoints, artifacts):
    ours = load(artifacts[(model_id, "bf16")]).model
    tokens = _tokens(40, seed=1)
    _, logits = ours.forward(tokens, SequenceState())
    with torch.no_grad():
        ref = _hf(tiny_checkpoints[model_id])(tokens[None]).logits[0]
    assert _rel(logits, ref) < 1e-4


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("profile", ["nvfp4", "int4"])
def test_quantized_logits_match_transformers_with_dequantized_weights(model_id, profile, tiny_checkpoints, artifacts):
    loaded = load(artifacts[(model_id, profile)])
    tokens = _tokens(32, seed=2)
    _, logits = loaded.model.forward(tokens, SequenceState())
    with torch.no_grad():
        ref = _hf(tiny_checkpoints[model_id], loaded.model.w)(tokens[None]).logits[0]
        plain = _hf(tiny_checkpoints[model_id])(tokens[None]).logits[0]
    assert _rel(logits, ref) < 1e-4
    assert _rel(logits, plain) > 1e-3  # the quantization is really there


@pytest.mark.parametrize("model_id", MODELS)
def test_incremental_decode_equals_full_forward(model_id, artifacts):
    model = load(artifacts[(model_id, "bf16")]).model
    tokens = _tokens(30, seed=3)
    _, full = model.forward(tokens, SequenceState())
    state = SequenceState()
    _, first = model.forward(tokens[:17], state)
    steps = [model.forward(tokens[i : i + 1], state)[1] for i in range(17, 30)]
    assert _rel(torch.cat([first, *steps]), full) < 1e-5


@pytest.mark.parametrize("model_id", MODELS)
def test_greedy_generation_matches_transformers_generate(model_id, tiny_checkpoints, artifacts):
    model = load(artifacts[(model_id, "bf16")]).model
    prompt = _tokens(12, seed=4)
    state = SequenceState()
    _, logits = model.forward(prompt, state)
    out = []
    for _ in range(64):
        nxt = int(logits[-1].argmax())
        out.append(nxt)
        _, logits = model.forward(torch.tensor([nxt]), state)
    hf = _hf(tiny_checkpoints[model_id])
    with torch.no_grad():
        ref = hf.generate(prompt[None], max_new_tokens=64, min_new_tokens=64, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, 12:].tolist()
    assert out == ref
