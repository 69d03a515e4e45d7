"""The memory plan on the real qwen3.8-27b configuration (numbers from shared/arch.md and runtime.md)."""

import ninfer_registry
from ninfer_run.memory import gdn_state_bytes, plan
from ninfer_run.models.qwen3 import DenseConfig
from ninfer_run.models.qwen3_5 import HybridConfig


def _hybrid():
    e = ninfer_registry.load("qwen3.8-27b")
    return HybridConfig.from_config(e.expected_config(), e.resolved["layer_pattern"])


def test_gdn_state_per_sequence():
    # 48 GDN layers x (48 x 128 x 128 fp32 recurrent + 3 x 10240 bf16 conv) = 144 MiB + 2.8 MiB
    assert gdn_state_bytes(_hybrid()) == 48 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)


def test_int8_kv_per_token_and_pool():
    p = plan(_hybrid(), 0, max_context=262_144, max_concurrency=1)
    # 16 attention layers x 2 x 4 heads x 256 = 32,768 int8 values + one fp16 scale per 64 = 33,792 B/token
    assert p.kv_pool == 262_144 * 33_792
    spec = plan(_hybrid(), 0, max_context=262_144, max_concurrency=2, draft_tokens=3, frontiers=4)
    assert spec.kv_pool == 262_144 * 33_792 * 17 // 16  # + the MTP layer's KV
    assert spec.rollback_states == 4 * 2 * spec.sequence_state and spec.frontier_states == 4 * spec.sequence_state


def test_dense_has_no_recurrent_state():
    e = ninfer_registry.load("qwen3-32b")
    cfg = DenseConfig.from_config(e.expected_config())
    p = plan(cfg, 10, max_context=1024, max_concurrency=4, kv_dtype="bf16")
    assert p.sequence_state == 0 and p.kv_pool == 1024 * 64 * 2 * 8 * 128 * 2 and p.total == 10 + p.kv_pool
