"""Fuzz the reader: mutate valid golden files; every outcome is a clean FormatError or an identical read.

Two kinds of mutation: raw byte damage (caught by the preamble/manifest/tensor checksums) and forged
manifests whose hashes are recomputed, so the strict JSON schema, range and closed-set checks are
what must hold. NINFER_FUZZ_EXAMPLES raises the count (default 2,000, derandomized for CI).
"""

import json
import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_format import Artifact, FormatError
from tests.conftest import GOLDEN, GOLDEN_STEMS, rebuild, split

EXAMPLES = int(os.environ.get("NINFER_FUZZ_EXAMPLES", "2000"))
ORIGINAL = {stem: (GOLDEN / f"{stem}.ninfer").read_bytes() for stem in GOLDEN_STEMS}


def _snapshot(a: Artifact) -> dict:
    return {
        "tensors": {t.name: [(p.role, p.dtype, p.shape, p.layout, bytes(a._bytes(p.offset, p.length))) for p in t.parts]
                    for t in a.manifest.tensors},
        "blobs": {b.name: a.blob(b.name) for b in a.manifest.blobs},
    }


EXPECTED = {}
for _stem, _raw in ORIGINAL.items():
    _path = GOLDEN / f"{_stem}.ninfer"
    with Artifact(_path) as _a:
        EXPECTED[_stem] = _snapshot(_a)


def _mutate_raw(draw, raw: bytearray) -> bytes:
    kind = draw(st.sampled_from(["flip", "flip_header", "truncate", "insert", "u64"]))
    if kind == "truncate":
        return bytes(raw[: draw(st.integers(0, len(raw) - 1))])
    if kind == "insert":
        pos = draw(st.integers(0, len(raw)))
        return bytes(raw[:pos] + draw(st.binary(min_size=1, max_size=64)) + raw[pos:])
    if kind == "u64":
        pos = draw(st.sampled_from([8, 16, 24, 32, 40, 48, 56]))
        raw[pos : pos + 8] = struct.pack("<Q", draw(st.integers(0, 2**64 - 1)))
        return bytes(raw)
    hi = 8192 if kind == "flip_header" else len(raw) - 1
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, min(hi, len(raw) - 1)))
        raw[pos] ^= draw(st.integers(1, 255))
    return bytes(raw)


def _mutate_manifest(draw, raw: bytes) -> bytes:
    manifest, data, _ = split(raw)
    text = bytearray(json.dumps(manifest, separators=(",", ":")).encode())
    kind = draw(st.sampled_from(["byte", "digit", "splice"]))
    if kind == "splice":
        a = draw(st.integers(0, len(text)))
        b = draw(st.integers(a, min(len(text), a + 40)))
        text[a:b] = draw(st.sampled_from([b"", b"0", b"-1", b"1e999", b"null", b"[]", b"{}", b'"x"', b"true",
                                          b"\\u0000", b"9" * 30, b"\xff"]))
    else:
        for _ in range(draw(st.integers(1, 3))):
            positions = [i for i, c in enumerate(text) if chr(c).isdigit()] if kind == "digit" else range(len(text))
            pos = draw(st.sampled_from(list(positions)))
            text[pos] = draw(st.integers(48, 57)) if kind == "digit" else draw(st.integers(0, 255))
    return rebuild(bytes(text), data)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("NINFER_FUZZ_RANDOM") != "1", database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_files_fail_cleanly_or_read_identically(data, tmp_path):
    stem = data.draw(st.sampled_from(GOLDEN_STEMS))
    raw = ORIGINAL[stem]
    forged = data.draw(st.booleans())
    mutated = _mutate_manifest(data.draw, raw) if forged else _mutate_raw(data.draw, bytearray(raw))
    path = tmp_path / "fuzz.ninfer"
    path.write_bytes(mutated)
    try:
        with Artifact(path) as a:
            if a.verify():
                return  # damage found by checksums / padding checks
            assert _snapshot(a) == EXPECTED[stem], "a mutated file read back different tensors without an error"
    except FormatError as e:
        assert "\n" not in str(e) and str(e)
