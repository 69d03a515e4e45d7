"""Already-NVFP4 checkpoints (made by compressed-tensors' and ModelOpt's own quantizers) pack without
re-quantization: the artifact holds the checkpoint's bytes."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from ninfer_format import Artifact
from ninfer_pack.cli import app
from ninfer_run.loader import load
from ninfer_run.state import SequenceState

from make_tiny_checkpoint import prequantize

pytest.importorskip("compressed_tensors")
pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
MODELS = ["tiny-qwen3.5", "tiny-qwen3"]
FORMATS = ["compressed-tensors", "modelopt"]


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("prequantized")
    return {(m, f): prequantize(m, tiny_checkpoints[m], root / f"{m}-{f}", f) for m in MODELS for f in FORMATS}


def _pack(model_id, src, out, profile="nvfp4", *extra):
    return CliRunner().invoke(app, ["pack", model_id, "-p", profile, "--source", str(src), "-o", str(out), "--json",
                                    *extra])


def _checkpoint_tensors(src):
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for shard in set(index.values()):
        with safe_open(src / shard, framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("target", ["sm_120a", "sm_90a"])
def test_packs_the_checkpoint_bytes_as_they_are(checkpoints, model_id, fmt, target, tmp_path):
    src = checkpoints[(model_id, fmt)]
    out = tmp_path / "a.ninfer"
    r = _pack(model_id, src, out, "nvfp4", "-t", target)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["prequantized_tensors"] > 0
    ckpt = _checkpoint_tensors(src)
    a = Artifact(out)
    seen = 0
    for name in a.tensor_names:
        module = name.removesuffix(".weight")
        if a.entry(name).scheme["kind"] != "nvfp4":
            continue
        parts = a.logical_parts(name)  # the target layout undone
        if fmt == "compressed-tensors":
            codes, scales = ckpt[f"{module}.weight_packed"], ckpt[f"{module}.weight_scale"]
            s2 = 1.0 / ckpt[f"{module}.weight_global_scale"].float().reshape(())
        else:
            codes, scales, s2 = ckpt[name], ckpt[f"{module}.weight_scale"], ckpt[f"{module}.weight_scale_2"]
        assert torch.equal(parts["qweight"], codes)
        assert torch.equal(parts["block_scale"].view(torch.uint8), scales.view(torch.uint8))
        assert torch.equal(parts["global_scale"], s2.float())
        seen += 1
    assert seen == json.loads(r.output)["prequantized_tensors"]
    assert "input_scale" not in " ".join(a.tensor_names) and "quantization_config" not in a.manifest.config
    assert CliRunner().invoke(app, ["verify", str(out)]).exit_code == 0
    _, logits = load(out).model.forward(torch.arange(5), SequenceState())
    assert bool(torch.isfinite(logits).all())


def test_a_profile_that_would_dequantize_is_refused(checkpoints, tmp_path):
    r = _pack("tiny-qwen3.5", checkpoints[("tiny-qwen3.5", "modelopt")], tmp_path / "b.ninfer", "bf16")
    assert r.exit_code == 1 and "is NVFP4 in the checkpoint but the profile stores it as" in r.output
    assert not (tmp_path / "b.ninfer").exists()


def test_fused_tensors_need_one_global_scale(checkpoints, tmp_path):
    src = tmp_path / "split"
    shutil.copytree(checkpoints[("tiny-qwen3", "compressed-tensors")], src)
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    key = "model.layers.0.self_attn.k_proj.weight_global_scale"
    tensors = load_file(src / index[key])
    tensors[key] = tensors[key] * 2
    save_file(tensors, src / index[key], metadata={"format": "pt"})
    r = _pack("tiny-qwen3", src, tmp_path / "c.ninfer")
    assert r.exit_code == 1 and "need one NVFP4 global scale" in r.output and "k_proj" in r.output


def test_other_quantization_formats_are_named(checkpoints, tmp_path):
    src = tmp_path / "int4"
    shutil.copytree(checkpoints[("tiny-qwen3", "compressed-tensors")], src)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["format"] = "pack-quantized"
    (src / "config.json").write_text(json.dumps(config))
    r = _pack("tiny-qwen3", src, tmp_path / "d.ninfer")
    assert r.exit_code == 1 and "only NVFP4" in r.output
