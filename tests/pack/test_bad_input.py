"""Bad checkpoints and bad destinations: a clear one-line error, exit code != 0, and no output file."""

import json
import shutil
import struct
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from ninfer_pack.cli import app

runner = CliRunner()


@pytest.fixture
def ckpt(tiny_checkpoints, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["tiny-qwen3"], dst)
    return dst


def _pack(ckpt, out, *extra, model="tiny-qwen3"):
    return runner.invoke(app, ["pack", model, "-p", "nvfp4", "--source", str(ckpt), "-o", str(out), *extra])


def _fails(result, out, *needles):
    assert result.exit_code != 0
    assert "Traceback" not in result.output and result.output.startswith("error: ")
    for needle in needles:
        assert needle in result.output, result.output
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*"))


def _edit_config(ckpt, **changes):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def _shard_of(ckpt, name):
    return ckpt / json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"][name]


def test_unregistered_model(ckpt, tmp_path):
    out = tmp_path / "m.ninfer"
    _fails(runner.invoke(app, ["pack", "llama-3-8b", "-p", "nvfp4", "--source", str(ckpt), "-o", str(out)]), out,
           "not a registered model", "qwen3.8-27b")


def test_wrong_model_for_the_id(ckpt, tmp_path):
    out = tmp_path / "m.ninfer"
    _fails(_pack(ckpt, out, model="tiny-qwen3.5"), out, "model_type is 'qwen3'", "needs 'qwen3_5'")


def test_config_value_differs(ckpt, tmp_path):
    _edit_config(ckpt, rms_norm_eps=1e-5)
    out = tmp_path / "m.ninfer"
    _fails(_pack(ckpt, out), out, "config key rms_norm_eps is 1e-05", "needs 1e-06")


def test_config_layer_types_differ(tiny_checkpoints, tmp_path):
    dst = tmp_path / "h"
    shutil.copytree(tiny_checkpoints["tiny-qwen3.5"], dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["text_config"]["layer_types"][0] = "full_attention"
    (dst / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "m.ninfer"
    _fails(_pack(dst, out, model="tiny-qwen3.5"), out, "layer_types[0] is 'full_attention'")


def test_missing_unexpected_and_misshaped_tensors(ckpt, tmp_path):
    out = tmp_path / "m.ninfer"
    name = "model.layers.1.mlp.up_proj.weight"
    shard = _shard_of(ckpt, name)
    tensors = load_file(shard)
    tensors[name] = torch.zeros(255, 128, dtype=torch.bfloat16)
    tensors["model.layers.1.mlp.extra.weight"] = torch.zeros(4, dtype=torch.bfloat16)
    save_file(tensors, shard, metadata={"format": "pt"})
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.1.mlp.extra.weight"] = shard.name
    gone = "model.layers.0.self_attn.k_norm.weight"
    del index["weight_map"][gone]
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    _fails(_pack(ckpt, out), out, f"tensor {gone} is missing", "tensor model.layers.1.mlp.extra.weight is not part of",
           f"tensor {name} has shape [255, 128], tiny-qwen3 needs [256, 128]")


def test_missing_shard(ckpt, tmp_path):
    shard = _shard_of(ckpt, "model.norm.weight")
    shard.unlink()
    out = tmp_path / "m.ninfer"
    _fails(_pack(ckpt, out), out, "missing shard", shard.name)


@pytest.mark.parametrize("damage", ["truncate", "header_length", "offsets"])
def test_shard_header_lies(ckpt, tmp_path, damage):
    shard = _shard_of(ckpt, "model.norm.weight")
    raw = bytearray(shard.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) - 100]
    elif damage == "header_length":
        raw[:8] = struct.pack("<Q", len(raw) * 2)
    else:
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        first = next(k for k in header if k != "__metadata__")
        header[first]["data_offsets"][1] += 2
        body = json.dumps(header).encode().ljust(n)
        raw[8 : 8 + n] = body[:n] if len(body) <= n else body
    shard.write_bytes(bytes(raw))
    out = tmp_path / "m.ninfer"
    _fails(_pack(ckpt, out), out, shard.name)


def test_output_directory_missing(ckpt, tmp_path):
    out = tmp_path / "nope" / "m.ninfer"
    r = _pack(ckpt, out)
    assert r.exit_code == 1 and "does not exist" in r.output and not out.parent.exists()


def test_read_only_destination(ckpt, tmp_path, monkeypatch):
    # CI runs as root, which ignores permission bits, so the refusal is simulated at the syscall
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    out = tmp_path / "m.ninfer"
    _fails(_pack(ckpt, out), out, "Permission denied")


def test_interrupt_leaves_nothing(ckpt, tmp_path, monkeypatch):
    import ninfer_pack.pack as pack_module

    real = pack_module.quantize_tensor
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_module, "quantize_tensor", interrupted)
    out = tmp_path / "m.ninfer"
    r = _pack(ckpt, out)
    assert r.exit_code == 130 and "interrupted" in r.output
    assert not out.exists() and not list(tmp_path.glob(".m.ninfer*"))


DISK_FULL = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk: write() fails with EFBIG instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
sys.argv = ["ninfer-pack", "tiny-qwen3", "-p", "bf16", "--source", sys.argv[1], "-o", sys.argv[2]]
from ninfer_pack.cli import main
main()
"""


def test_disk_fills_up(ckpt, tmp_path):
    out = tmp_path / "m.ninfer"
    r = subprocess.run([sys.executable, "-c", DISK_FULL, str(ckpt), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "error:" in r.stderr and "Traceback" not in r.stderr
    assert "File too large" in r.stderr or "No space" in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".m.ninfer*"))
