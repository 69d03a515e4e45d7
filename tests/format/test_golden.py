"""Golden vectors: regenerating them is byte-exact, and reading them gives the recorded contents."""

import json

import pytest

from tests.conftest import GOLDEN, GOLDEN_STEMS

from gen_golden import build, describe


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_regenerates_byte_exact(stem, tmp_path):
    fresh = build(stem, tmp_path)
    assert fresh.read_bytes() == (GOLDEN / f"{stem}.ninfer").read_bytes()


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_decodes_to_expected_contents(stem):
    expected = json.loads((GOLDEN / f"{stem}.expected.json").read_text())
    assert describe(GOLDEN / f"{stem}.ninfer") == expected
