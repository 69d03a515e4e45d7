"""`ninfer-pack export --to compressed-tensors`: transformers (through the compressed-tensors library)
loads the checkpoint and decompresses to our weights; packing it again gives the same artifact."""

import json

import pytest
import torch
from typer.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.quants import pack_int32
from ninfer_pack.cli import app

transformers = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors")
MODELS = ["tiny-qwen3.5", "tiny-qwen3"]


def _export(artifact, out, *extra):
    return CliRunner().invoke(app, ["export", str(artifact), "--to", "compressed-tensors", str(out), "--json",
                                    "--shard-mib", "1", *extra])


def _hf_name(model, name):
    keys = model.state_dict()
    return name if name in keys else name.replace("model.language_model.", "model.", 1)


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("profile", ["nvfp4", "int4", "int4-asym", "int8", "bf16"])
def test_compressed_tensors_loads_our_weights(packed, model_id, profile, tmp_path):
    artifact = packed(model_id, profile)
    r = _export(artifact, tmp_path / "ct")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    if profile == "bf16":
        assert summary["formats"] == [] and "quantization_config" not in config
    else:
        ct.quantization.QuantizationConfig.model_validate(config["quantization_config"])  # the library's schema
    load = {} if profile == "bf16" else {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)}
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ct", dtype=torch.float32, **load)
    state = model.state_dict()
    a = Artifact(artifact)
    compared = 0
    for name in a.tensor_names:
        key = _hf_name(model, name)
        if key not in state:  # MTP and vision tensors: no module in the text-only transformers model
            continue
        ours = a.dequantized(name)
        # compressed-tensors decompresses into the checkpoint's dtype (bf16): ours, rounded the same way
        assert torch.equal(state[key], ours.to(state[key].dtype if a.entry(name).scheme["kind"] == "plain"
                                              else torch.bfloat16).float()), name
        compared += 1
    assert compared == len(state)


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("target", ["sm_120a", "sm_90a"])
def test_export_then_pack_round_trip(tiny_checkpoints, model_id, target, tmp_path):
    """Codes, block scales and plain tensors come back bit for bit; a global scale goes through
    compressed-tensors' encode direction (1 / s2) and back, exact to one float32 rounding."""
    original = tmp_path / "a.ninfer"
    r = CliRunner().invoke(app, ["pack", model_id, "-p", "nvfp4", "-t", target, "--source",
                                 str(tiny_checkpoints[model_id]), "-o", str(original)])
    assert r.exit_code == 0, r.output
    assert _export(original, tmp_path / "ct").exit_code == 0
    again = tmp_path / "b.ninfer"
    r = CliRunner().invoke(app, ["pack", model_id, "-p", "nvfp4", "-t", target, "--source", str(tmp_path / "ct"),
                                 "-o", str(again)])
    assert r.exit_code == 0, r.output
    a, b = Artifact(original), Artifact(again)
    assert a.tensor_names == b.tensor_names
    for name in a.tensor_names:
        pa, pb = a.stored_parts(name), b.stored_parts(name)
        assert pa.keys() == pb.keys(), name
        for role in pa:
            if role == "global_scale":
                assert torch.equal(pb[role], 1.0 / (1.0 / pa[role])) and float((pa[role] - pb[role]).abs()) <= \
                    float(torch.finfo(torch.float32).eps * pa[role]), name
            else:
                assert torch.equal(pa[role].reshape(-1).view(torch.uint8), pb[role].reshape(-1).view(torch.uint8)), name


def test_refuses_to_replace_without_force_and_leaves_nothing_on_failure(packed, tmp_path):
    artifact = packed("tiny-qwen3", "int4")
    (tmp_path / "ct").mkdir()
    r = _export(artifact, tmp_path / "ct")
    assert r.exit_code == 1 and "--force" in r.output
    assert _export(artifact, tmp_path / "ct", "--force").exit_code == 0
    r = _export(tmp_path / "missing.ninfer", tmp_path / "other")
    assert r.exit_code == 1 and not (tmp_path / "other").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ct"]  # no temporary folder left behind
    r = CliRunner().invoke(app, ["export", str(artifact), "--to", "gguf", str(tmp_path / "g")])
    assert r.exit_code == 1 and "compressed-tensors" in r.output


def test_int8_packing_matches_compressed_tensors():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    g = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (24, 40), generator=g, dtype=torch.int8)
    for dim in (0, 1):
        assert torch.equal(pack_int32(q, 8, dim), pack_to_int32(q, 8, packed_dim=dim))
    q4 = torch.randint(-8, 8, (16, 64), generator=g, dtype=torch.int8)
    assert torch.equal(pack_int32(q4, 4, 1), pack_to_int32(q4, 4, packed_dim=1))
