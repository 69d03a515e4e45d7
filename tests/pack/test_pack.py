"""The compiler end to end on real tiny checkpoints: every family x profile x target packs, verifies
against its source, and reads back through the format reader."""

import hashlib
import json

import pytest
import torch
from typer.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.rules import expand
from ninfer_pack.cli import app
from ninfer_registry import load

runner = CliRunner()
PROFILES = ["nvfp4", "int4", "int4-asym", "int8", "bf16"]
TARGETS = ["sm_120a", "sm_90a", "linear"]


def pack(args):
    return runner.invoke(app, ["pack", *args])


@pytest.mark.parametrize("model_id", ["tiny-qwen3.5", "tiny-qwen3"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("target", TARGETS)
def test_pack_verify_every_family_profile_target(tiny_checkpoints, tmp_path, model_id, profile, target):
    out = tmp_path / "m.ninfer"
    r = pack([model_id, "--profile", profile, "--target", target, "--source", str(tiny_checkpoints[model_id]),
              "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["tensors"] == len(expand(load(model_id).resolved, json.loads(
        (tiny_checkpoints[model_id] / "config.json").read_text()), load(model_id).available_parts))
    v = runner.invoke(app, ["verify", str(out), "--source", str(tiny_checkpoints[model_id]), "--json"])
    report = json.loads(v.output)
    assert v.exit_code == 0 and report["ok"], v.output
    assert [c["name"] for c in report["checks"]] == ["structure", "checksums", "registry", "numeric"]
    with Artifact(out) as a:
        assert a.manifest.quantization["profile"] == profile and a.manifest.target == target
        assert a.has_blob("tokenizer.json") and a.has_blob("chat_template.jinja")
        names = set(a.tensor_names)
    if model_id == "tiny-qwen3.5":
        assert "mtp.fc.weight" in names and "model.visual.merger.linear_fc2.weight" in names
        rel = summary["error_by_class"]["linear"]["rel_rms"]
        assert {"nvfp4": 0.06 < rel < 0.13, "int4": 0.05 < rel < 0.15, "int4-asym": 0.04 < rel < 0.13,
                "int8": 0 < rel < 0.01, "bf16": rel == 0}[profile]


def test_parts_can_be_left_out(tiny_checkpoints, tmp_path):
    out = tmp_path / "m.ninfer"
    r = pack(["tiny-qwen3.5", "-p", "nvfp4", "--source", str(tiny_checkpoints["tiny-qwen3.5"]), "-o", str(out),
              "--no-vision", "--no-mtp", "--lm-head", "nvfp4"])
    assert r.exit_code == 0, r.output
    with Artifact(out) as a:
        files = a.manifest.provenance["source_files"]
        src = tiny_checkpoints["tiny-qwen3.5"]
        assert {f["name"] for f in files} >= {"config.json", "model.safetensors.index.json", "tokenizer.json"}
        for f in files:  # digests are computed in parallel with packing and patched in at the end
            assert f["sha256"] == hashlib.sha256((src / f["name"]).read_bytes()).hexdigest()
        assert a.manifest.parts_included == ("text",)
        assert not any(n.startswith(("mtp.", "model.visual.")) for n in a.tensor_names)
        assert a.entry("lm_head.weight").scheme["kind"] == "nvfp4"


def test_corrupted_artifact_fails_verify(tiny_checkpoints, tmp_path):
    out = tmp_path / "m.ninfer"
    assert pack(["tiny-qwen3", "-p", "int4", "--source", str(tiny_checkpoints["tiny-qwen3"]), "-o", str(out)]).exit_code == 0
    raw = bytearray(out.read_bytes())
    raw[-5000] ^= 0x40
    out.write_bytes(bytes(raw))
    v = runner.invoke(app, ["verify", str(out), "--json"])
    assert v.exit_code == 1
    report = json.loads(v.output)
    assert not report["ok"] and not next(c for c in report["checks"] if c["name"] == "checksums")["ok"]


def test_refuses_overwrite_without_force(tiny_checkpoints, tmp_path):
    out = tmp_path / "m.ninfer"
    args = ["tiny-qwen3", "-p", "bf16", "--source", str(tiny_checkpoints["tiny-qwen3"]), "-o", str(out)]
    assert pack(args).exit_code == 0
    before = out.read_bytes()
    r = pack(args)
    assert r.exit_code == 1 and "--force" in r.output and out.read_bytes() == before
    assert pack([*args, "--force"]).exit_code == 0


def test_hf_cache_offline(tiny_checkpoints, tmp_path, monkeypatch):
    """Resolve through huggingface_hub from a populated cache with HF_HUB_OFFLINE=1."""
    import shutil

    cache = tmp_path / "hub"
    repo = cache / "models--ninfer-tests--tiny-qwen3"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tiny_checkpoints["tiny-qwen3"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    out = tmp_path / "m.ninfer"
    r = pack(["tiny-qwen3", "-p", "int8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    with Artifact(out) as a:
        assert a.manifest.provenance["source"] == "hf:ninfer-tests/tiny-qwen3@main"
    r = pack(["tiny-qwen3.5", "-p", "int8", "-o", str(tmp_path / "x.ninfer")])
    assert r.exit_code == 1 and "not in the HF cache" in r.output


@pytest.mark.gpu
def test_cuda_quantization_gives_the_same_bytes(tiny_checkpoints, tmp_path):
    for profile in ("nvfp4", "int4-asym"):
        cpu, gpu = tmp_path / f"cpu-{profile}.ninfer", tmp_path / f"gpu-{profile}.ninfer"
        src = str(tiny_checkpoints["tiny-qwen3.5"])
        assert pack(["tiny-qwen3.5", "-p", profile, "--source", src, "-o", str(cpu)]).exit_code == 0
        assert pack(["tiny-qwen3.5", "-p", profile, "--source", src, "-o", str(gpu), "--device", "cuda"]).exit_code == 0
        with Artifact(cpu) as a, Artifact(gpu) as b:
            for name in a.tensor_names:
                for role, t in a.stored_parts(name).items():
                    u = b.stored_parts(name)[role]
                    assert torch.equal(t.reshape(-1).view(torch.uint8), u.reshape(-1).view(torch.uint8)), (name, role)


def test_verify_source_catches_a_different_checkpoint(tiny_checkpoints, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    src = tiny_checkpoints["tiny-qwen3"]
    out = tmp_path / "m.ninfer"
    assert pack(["tiny-qwen3", "-p", "nvfp4", "--source", str(src), "-o", str(out)]).exit_code == 0
    other = tmp_path / "other"
    shutil.copytree(src, other)
    index = json.loads((other / "model.safetensors.index.json").read_text())
    name = "model.layers.0.mlp.down_proj.weight"
    shard = other / index["weight_map"][name]
    tensors = load_file(shard)
    tensors[name] = tensors[name].clone()
    tensors[name][3, 7] += 1.0
    save_file(tensors, shard, metadata={"format": "pt"})
    v = runner.invoke(app, ["verify", str(out), "--source", str(other), "--json"])
    report = json.loads(v.output)
    numeric = next(c for c in report["checks"] if c["name"] == "numeric")
    assert v.exit_code == 1 and not numeric["ok"] and name in numeric["detail"]
