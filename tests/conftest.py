"""Shared fixtures: golden artifacts, manifest surgery helpers, tiny checkpoints packed once per profile."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import torch

# Triton kernels run compiled on a CUDA machine; without one (and with triton installed) they run in
# Triton's interpreter on the CPU, which checks their indexing and math on small shapes. Set before
# anything imports triton: its own library functions are decorated (interpreted or not) at import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import xxhash  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from ninfer_format import constants as C  # noqa: E402
from ninfer_format.writer import encode_preamble  # noqa: E402
from ninfer_pack.cli import app as pack_app  # noqa: E402
from ninfer_run.loader import load  # noqa: E402

GOLDEN = Path(__file__).resolve().parent.parent / "formats" / "golden"
GOLDEN_STEMS = ["golden-bf16-linear", "golden-nvfp4-sm_120a", "golden-int4-asym-sm_90a"]


@pytest.fixture
def golden_copy(tmp_path):
    """Copy a golden artifact into tmp_path (tests mutate the copy)."""

    def copy(stem: str = "golden-nvfp4-sm_120a") -> Path:
        dst = tmp_path / f"{stem}.ninfer"
        shutil.copy(GOLDEN / f"{stem}.ninfer", dst)
        return dst

    return copy


def split(raw: bytes) -> tuple[dict, bytes, int]:
    """-> (manifest JSON object, data section bytes, data offset)."""
    _, _, _, _, m_len, d_off, _, _, _ = struct.unpack("<8sIIQQQQQQ", raw[:64])
    return json.loads(raw[64 : 64 + m_len]), raw[d_off:], d_off


def rebuild(manifest: dict | bytes, data: bytes, data_offset: int | None = None) -> bytes:
    """Assemble a file around a (possibly forged) manifest with correct hashes, so the parser sees it."""
    body = manifest if isinstance(manifest, bytes) else json.dumps(manifest, separators=(",", ":")).encode()
    d_off = data_offset or -(-(64 + len(body)) // C.SECTION_ALIGNMENT) * C.SECTION_ALIGNMENT
    pre = encode_preamble(len(body), d_off, len(data), xxhash.xxh3_64_intdigest(body))
    return pre + body + b"\0" * (d_off - 64 - len(body)) + data


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Real tiny HF checkpoints (transformers' own classes), built once per test session."""
    from make_tiny_checkpoint import build

    root = tmp_path_factory.mktemp("tiny")
    return {model_id: build(model_id, root / model_id) for model_id in ("tiny-qwen3.5", "tiny-qwen3")}


@pytest.fixture(scope="session")
def packed(tiny_checkpoints, tmp_path_factory):
    """packed(model_id, profile) -> path of the artifact (built on first use)."""
    root, done = tmp_path_factory.mktemp("packed"), {}

    def get(model_id: str, profile: str = "bf16"):
        if (model_id, profile) not in done:
            path = root / f"{model_id}-{profile}.ninfer"
            r = CliRunner().invoke(pack_app, ["pack", model_id, "-p", profile, "--source", str(tiny_checkpoints[model_id]),
                                         "-o", str(path)])
            assert r.exit_code == 0, r.output
            done[(model_id, profile)] = path
        return done[(model_id, profile)]

    return get


@pytest.fixture(scope="session")
def tiny_model(packed):
    """tiny_model(model_id, profile) -> the loaded reference model (cached)."""
    cache = {}

    def get(model_id: str, profile: str = "bf16"):
        if (model_id, profile) not in cache:
            cache[(model_id, profile)] = load(packed(model_id, profile)).model
        return cache[(model_id, profile)]

    return get
