"""The CLIs as users run them: readable help, JSON for CI, one-line errors, no tracebacks."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ninfer_pack.cli import app
from ninfer_run.cli import app as run_app
from tests.conftest import GOLDEN

runner = CliRunner()
NVFP4 = str(GOLDEN / "golden-nvfp4-sm_120a.ninfer")


def test_list_and_show():
    r = runner.invoke(app, ["list"])
    assert r.exit_code == 0 and "qwen3.8-27b" in r.output and "tiny-qwen3" not in r.output
    listed = json.loads(runner.invoke(app, ["list", "--all", "--json"]).output)
    assert {"tiny-qwen3.5", "qwen3-32b"} <= {e["id"] for e in listed}
    r = runner.invoke(app, ["show", "qwen3.8-27b"])
    assert r.exit_code == 0 and "1199" in r.output and "text_config.output_gate_type" in r.output
    r = runner.invoke(app, ["show", "gpt-5"])
    assert r.exit_code == 1 and r.output.startswith("error: 'gpt-5' is not a registered model")


def test_inspect_human_and_json():
    r = runner.invoke(app, ["inspect", NVFP4, "--tensors"])
    assert r.exit_code == 0 and "golden-qwen3" in r.output and "model.layers.0.mlp.down_proj.weight" in r.output
    info = json.loads(runner.invoke(app, ["inspect", NVFP4, "--json"]).output)
    assert info["profile"] == "nvfp4" and info["target"] == "sm_120a" and len(info["tensor_table"]) == 14


def test_verify_ok_and_defective(tmp_path):
    r = runner.invoke(app, ["verify", NVFP4, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["ok"]
    bad = tmp_path / "bad.ninfer"
    raw = bytearray((GOLDEN / "golden-nvfp4-sm_120a.ninfer").read_bytes())
    raw[len(raw) // 2] ^= 1
    bad.write_bytes(bytes(raw))
    r = runner.invoke(app, ["verify", str(bad)])
    assert r.exit_code == 1 and "[FAIL] checksums" in r.output and "DEFECTIVE" in r.output
    bad.write_bytes(bytes(raw[:100]))
    r = runner.invoke(app, ["verify", str(bad), "--json"])
    report = json.loads(r.output)
    assert r.exit_code == 1 and report["checks"][0]["name"] == "structure" and not report["ok"]
    r = runner.invoke(app, ["inspect", str(tmp_path / "missing.ninfer")])
    assert r.exit_code == 1 and r.output.startswith("error: ") and "No such file" in r.output


def test_ninfer_run_check():
    r = runner.invoke(run_app, ["check", NVFP4, "--checksums"])
    assert r.exit_code == 0 and "checksums ok" in r.output


def test_console_scripts_installed():
    exe = shutil.which("ninfer-pack", path=str(Path(sys.executable).parent))
    assert exe, "ninfer-pack console script is not installed"
    r = subprocess.run([exe, "verify", NVFP4], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout
    r = subprocess.run([exe, "qwen3.8-27b", "--profile", "fp3", "--source", "/nonexistent"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "profile 'fp3' is not allowed" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "pack" in r.stdout and "verify" in r.stdout
