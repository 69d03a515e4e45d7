"""The registry: every entry is well formed, expands against its own config, and names exactly the
tensors transformers' own model classes have (built on the meta device from the entry's config)."""

import json
import math

import pytest
import torch

import ninfer_registry as R
from ninfer_format.rules import RuleError, evaluate, expand


@pytest.mark.parametrize("model_id", R.ids(include_test_only=True))
def test_entry_loads_and_expands(model_id):
    e = R.load(model_id)
    tensors = expand(e.resolved, e.expected_config(), e.available_parts)
    assert tensors and all(all(d > 0 for d in t.shape) for t in tensors.values())
    for profile in e.profiles:
        classes = R.scheme_classes(e, profile)
        assert {t.tensor_class for t in tensors.values()} <= set(classes)
    assert len(e.sha256) == 64 and json.dumps(e.resolved)


def test_listing_and_closed_set():
    assert {"qwen3.8-27b", "qwen3.5-27b", "qwen3-32b"} <= set(R.ids())
    assert "tiny-qwen3.5" not in R.ids() and "tiny-qwen3.5" in R.ids(include_test_only=True)
    with pytest.raises(R.RegistryError, match="not a registered model; registered: qwen3-32b"):
        R.load("llama-3-8b")
    with pytest.raises(R.RegistryError, match="not allowed"):
        R.scheme_classes(R.load("qwen3.8-27b"), "fp8")
    with pytest.raises(R.RegistryError, match="unknown scheme"):
        R.scheme_classes(R.load("qwen3.8-27b"), "nvfp4", {"lm_head": "fp2"})
    assert R.scheme_classes(R.load("qwen3.8-27b"), "nvfp4", {"lm_head": "nvfp4"})["lm_head"]["kind"] == "nvfp4"


def test_headline_counts_match_the_architecture_notes():
    # shared/arch.md §2.2: text 26,895,998,464 + vision 460,730,096 (meta-device transformers build)
    # + MTP 424,699,392 (computed, 15 tensors)
    e = R.load("qwen3.8-27b")
    t = expand(e.resolved, e.expected_config(), e.available_parts)
    by_part = {}
    for x in t.values():
        by_part[x.part] = by_part.get(x.part, 0) + math.prod(x.shape)
    assert by_part == {"text": 26_895_998_464, "vision": 460_730_096, "mtp": 424_699_392}
    assert sum(1 for x in t.values() if x.part == "mtp") == 15
    assert R.load("qwen3.5-27b").resolved["tensors"] == e.resolved["tensors"]


def _meta_state_dict(model_cls, config):
    with torch.device("meta"):
        model = model_cls(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("model_id", ["qwen3.8-27b", "tiny-qwen3.5"])
def test_hybrid_names_and_shapes_match_transformers(model_id):
    transformers = pytest.importorskip("transformers")
    e = R.load(model_id)
    cfg = e.expected_config()
    config = transformers.Qwen3_5Config(text_config=cfg["text_config"], vision_config=cfg["vision_config"],
                                        **{k: v for k, v in cfg.items() if not isinstance(v, dict)})
    theirs = _meta_state_dict(transformers.Qwen3_5ForConditionalGeneration, config)
    ours = {n: t.shape for n, t in expand(e.resolved, cfg, ("text", "vision")).items()}
    assert ours == theirs


@pytest.mark.slow
@pytest.mark.parametrize("model_id", ["qwen3-32b", "tiny-qwen3", "golden-qwen3"])
def test_dense_names_and_shapes_match_transformers(model_id):
    transformers = pytest.importorskip("transformers")
    e = R.load(model_id)
    cfg = e.expected_config()
    theirs = _meta_state_dict(transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**cfg))
    ours = {n: t.shape for n, t in expand(e.resolved, cfg, ("text",)).items()}
    assert ours == theirs


@pytest.mark.parametrize("expr,value", [("text.a*2 + text.b//3", 2 * 7 + 9 // 3), (12, 12), ("(text.a - 1) * text.b", 54)])
def test_expressions(expr, value):
    assert evaluate(expr, {"t": {"a": 7, "b": 9}}, {"text": "t"}) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "text.a ** 99", "text.c", "text.a / 2", "text.a // 0", "1e3", "lambda: 1"])
def test_expression_rejects(expr):
    with pytest.raises(RuleError):
        evaluate(expr, {"t": {"a": 7, "c": "x"}}, {"text": "t"})
