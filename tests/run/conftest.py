"""Runtime fixtures: tiny checkpoints packed once per profile, loaded on the reference path."""

import pytest
from typer.testing import CliRunner

from ninfer_pack.cli import app
from ninfer_run.loader import load


@pytest.fixture(scope="session")
def packed(tiny_checkpoints, tmp_path_factory):
    """packed(model_id, profile) -> path of the artifact (built on first use)."""
    root, done = tmp_path_factory.mktemp("packed"), {}

    def get(model_id: str, profile: str = "bf16"):
        if (model_id, profile) not in done:
            path = root / f"{model_id}-{profile}.ninfer"
            r = CliRunner().invoke(app, ["pack", model_id, "-p", profile, "--source", str(tiny_checkpoints[model_id]),
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
