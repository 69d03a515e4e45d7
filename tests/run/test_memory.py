"""The memory plan on the real qwen3.8-27b configuration, checked against the seed engine's figures
(shared/seed-figures.md: RTX 5090 32 GB, 20.02 GiB NVFP4 artifact, MTP3), and the CLI around it."""

import json

import pytest
import torch
from typer.testing import CliRunner

import ninfer_registry
from ninfer_run.cli import app
from ninfer_run.engine import EngineConfig
from ninfer_run.memory import GiB, MiB, ModelShape, parse_size, plan, recommend, reuse_holds

SEED_WEIGHTS, CARD = int(20.02 * GiB), parse_size("32GiB")
SEED_MEDIAN, SEED_MEDIAN_AFTER = 117_841, 86_000  # median agent prompt before / after the switch to C=2


def _shape(model_id="qwen3.8-27b"):
    e = ninfer_registry.load(model_id)
    return ModelShape.from_config(e.family, e.expected_config(), e.resolved)


def test_gdn_state_per_sequence():
    # 48 GDN layers x (48 x 128 x 128 fp32 recurrent + 3 x 10240 bf16 conv) = 144 MiB + 2.8 MiB
    assert _shape().gdn_state_bytes == 48 * (48 * 128 * 128 * 4 + 3 * 10240 * 2)


def test_int8_kv_per_token_and_pool():
    p = plan(_shape(), 0, EngineConfig(max_context=262_144))
    # 16 attention layers x 2 x 4 heads x 256 = 32,768 int8 values + one fp16 scale per 64 = 33,792 B/token.
    # (The seed engine reported 10.45 GiB for its own 262K INT8 pool; ours is 8.25 GiB: its KV format
    # was not published, so only the decisions below are compared.)
    assert p.kv_pool == 262_144 * 33_792 and abs(p.kv_pool / GiB - 8.25) < 0.01
    spec = plan(_shape(), 0, EngineConfig(max_context=262_144, max_concurrency=2, draft_tokens=3, max_frontiers=4))
    assert spec.kv_pool == 262_144 * 33_792 * 17 // 16  # + the MTP layer's KV
    assert spec.rollback_states == 4 * 2 * spec.sequence_state and spec.frontier_states == 4 * spec.sequence_state
    assert spec.host_total == spec.frontier_states  # GDN snapshots of frontiers stay off the card


def test_seed_decisions_on_a_32gb_card():
    shape = _shape()
    seed_262k = EngineConfig(max_context=262_144, max_concurrency=4, draft_tokens=3)
    with_vision = plan(shape, SEED_WEIGHTS, seed_262k, vision=True)  # default media buffers: 1 GiB + 2 GiB
    assert with_vision.media == 3 * GiB and with_vision.slack(CARD) < 0  # "does not fit at 262K"
    assert not reuse_holds(seed_262k, SEED_MEDIAN)  # 4 x 117K > 262K: reuse collapses
    final = EngineConfig(max_context=196_608, max_concurrency=2, draft_tokens=3)
    p = plan(shape, SEED_WEIGHTS, final, vision=True, media_cache_mib=256, media_live_mib=512)
    assert p.media == 768 * MiB and p.slack(CARD) > 0  # "C=2 + 196,608 context fits"
    assert reuse_holds(final, SEED_MEDIAN_AFTER)  # 2 x 86K = 172K < 196,608: frontiers stay resident


def test_recommendation_prefers_resident_prompts():
    shape, asked = _shape(), EngineConfig(max_context=262_144, max_concurrency=4, draft_tokens=3)
    media = dict(vision=True, media_cache_mib=256, media_live_mib=512)
    advice = recommend(shape, SEED_WEIGHTS, asked, CARD, SEED_MEDIAN, **media)
    assert advice.max_concurrency == 2 and advice.max_context >= 2 * SEED_MEDIAN
    got = plan(shape, SEED_WEIGHTS, EngineConfig(max_context=advice.max_context, max_concurrency=2, draft_tokens=3),
               **media)
    assert 256 * MiB <= got.slack(CARD) < 256 * MiB + 4096 * got.kv_per_token  # the largest step that keeps the margin
    # without vision buffers memory allows ~262.4K tokens (the dense prefill's one-head K/V included)
    no_vision = recommend(shape, SEED_WEIGHTS, asked, CARD, SEED_MEDIAN)
    assert no_vision.max_context == shape.max_positions == 262_144
    # on a larger card memory would take far more: the model's own 262,144 positions cap the advice
    roomy = plan(shape, SEED_WEIGHTS, EngineConfig(max_context=400_000, max_concurrency=2, draft_tokens=3))
    assert roomy.slack(parse_size("48GiB")) >= 256 * MiB
    assert recommend(shape, SEED_WEIGHTS, asked, parse_size("48GiB"), SEED_MEDIAN).max_context == 262_144
    nothing_fits = recommend(shape, 40 * GiB, asked, CARD, SEED_MEDIAN)
    assert nothing_fits.max_context == 0 and "does not fit" in nothing_fits.reason


def test_dense_has_no_recurrent_state():
    p = plan(_shape("qwen3-32b"), 10, EngineConfig(max_context=1024, max_concurrency=4, kv_dtype="bf16"), device="cpu")
    assert p.sequence_state == 0 and p.kv_pool == 1024 * 64 * 2 * 8 * 128 * 2
    # no CUDA graphs or runtime overhead on the CPU path; its attention reads one layer's K/V back in fp32
    assert p.prefill_scratch == 2 * 1024 * 8 * 128 * 4
    assert p.device_total == 10 + p.kv_pool + p.workspace + p.prefill_scratch


@pytest.mark.parametrize("text,expected", [("32GiB", 32 * GiB), ("32 GB", 32 * 10**9), ("24000MiB", 24000 * MiB),
                                           ("1.5gib", int(1.5 * GiB)), ("4096", 4096)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_rejects_nonsense():
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_plan_cli_exit_codes_and_json(packed):
    path = str(packed("tiny-qwen3.5", "nvfp4"))
    ok = CliRunner().invoke(app, ["plan", path, "--gpu-mem", "2GiB", "--median-prompt", "1000", "--json"])
    report = json.loads(ok.output)
    assert ok.exit_code == 0 and report["fits"] and report["reuse_holds"]
    assert report["recommended"]["max_concurrency"] >= 1 and report["kv_bytes_per_token"] > 0
    tight = CliRunner().invoke(app, ["plan", path, "--gpu-mem", "700MiB", "--max-context", "4000000"])
    assert tight.exit_code == 1 and "DOES NOT FIT" in tight.output and "recommended: --max-context" in tight.output
    bad = CliRunner().invoke(app, ["plan", path, "--gpu-mem", "lots"])
    assert bad.exit_code == 1 and "not a size" in bad.output
    # decode graphs keep the sequences' GDN states in their slab: the same memory with or without them
    eager = CliRunner().invoke(app, ["plan", path, "--gpu-mem", "2GiB", "--median-prompt", "1000", "--json",
                                     "--no-cuda-graphs"])
    assert eager.exit_code == 0 and json.loads(eager.output)["components"] == report["components"]


def test_the_plan_counts_the_split_prefill_attention_where_it_runs(packed, monkeypatch):
    """NINFER_PREFILL_ATTENTION=split-*: a long chunk's attention holds ~4 bf16 rows of a KV head's query
    group more a chunk token (kernels/paged_attention.py), and `plan` / `serve` count them; "auto" counts
    them only on a Hopper GPU (a plan made without one: the masked path's)."""
    from ninfer_format import Artifact
    from ninfer_run.kernels import prefill_modes
    from ninfer_run.memory import artifact_plan

    path = str(packed("tiny-qwen3.5", "nvfp4"))

    def workspace(mode, *chunk):
        monkeypatch.setattr(prefill_modes, "PREFILL_ATTENTION", mode)
        r = CliRunner().invoke(app, ["plan", path, "--gpu-mem", "8GiB", "--json", *chunk])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["components"]["activation workspace"]

    with Artifact(path) as a:
        shape = artifact_plan(a.manifest, EngineConfig(max_context=64))[0]
    group_rows = 8192 * 4 * (shape.q_heads // shape.kv_heads) * shape.head_dim * 2  # the default CUDA chunk
    assert workspace("split-cudnn") == workspace("split-flash") == workspace("masked") + group_rows
    # a longer chunk attends in pieces of SPLIT_ROWS (8,192) rows: the split holds no more
    longer = ("--prefill-chunk", "20000")
    assert workspace("split-cudnn", *longer) == workspace("masked", *longer) + group_rows
    if not torch.cuda.is_available():
        assert workspace("auto") == workspace("masked")


def test_serve_refuses_what_does_not_fit(packed):
    path = str(packed("tiny-qwen3.5", "nvfp4"))
    r = CliRunner().invoke(app, ["serve", path, "--max-context", "50000000", "--gpu-mem", "1GiB"])
    assert r.exit_code == 1 and "DOES NOT FIT" in r.output and "does not fit in memory" in r.output


def test_vision_serving_checks(packed):
    r = CliRunner().invoke(app, ["serve", str(packed("tiny-qwen3", "bf16")), "--vision", "--gpu-mem", "4GiB"])
    assert r.exit_code == 1 and "no vision tower" in r.output
    path = str(packed("tiny-qwen3.5", "nvfp4"))
    plain = json.loads(CliRunner().invoke(app, ["plan", path, "--gpu-mem", "8GiB", "--json"]).output)
    vision = json.loads(CliRunner().invoke(app, ["plan", path, "--gpu-mem", "8GiB", "--json", "--vision",
                                                 "--media-cache-mib", "256", "--media-live-mib", "512"]).output)
    assert vision["components"]["media buffers"] == 768 * MiB and plain["components"]["media buffers"] == 0
    assert vision["components"]["weights"] > plain["components"]["weights"]  # the tower's weights too


def test_serve_warms_up_before_it_listens(packed, monkeypatch):
    """--warm-up (the default on CUDA) runs its request between loading and listening, and says so."""
    import uvicorn

    listened = []
    monkeypatch.setattr(uvicorn, "run", lambda server, **kw: listened.append(kw["port"]))
    path = str(packed("tiny-qwen3.5", "nvfp4"))
    r = CliRunner().invoke(app, ["serve", path, "--warm-up", "--max-context", "4096", "--prefill-chunk", "64"])
    assert r.exit_code == 0 and "warm-up: 145-token prompt and 3 tokens, then a next turn of 146 new tokens" in r.output, r.output
    assert listened == [18080]
    quiet = CliRunner().invoke(app, ["serve", path, "--max-context", "4096"])  # CPU: off by default
    assert quiet.exit_code == 0 and "warm-up" not in quiet.output
