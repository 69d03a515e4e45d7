"""Every kind of bad file gives a one-line FormatError naming the problem, never a crash."""

import struct

import pytest
import torch

from ninfer_format import Artifact, ArtifactWriter, ChecksumMismatch, FormatError, Truncated, UnsupportedVersion
from ninfer_format import constants as C
from tests.conftest import rebuild, split


def _open_fails(path, match, kind=FormatError):
    with pytest.raises(kind, match=match) as err:
        Artifact(path)
    assert "\n" not in str(err.value)


def test_golden_opens_and_verifies(golden_copy):
    with Artifact(golden_copy()) as a:
        assert a.verify() == []
        assert a.manifest.registry_id == "golden-qwen3"


@pytest.mark.parametrize("cut", [0, 10, 63, 64, 200, 4096, 5000, -1, -4096])
def test_truncated(golden_copy, cut):
    path = golden_copy()
    raw = path.read_bytes()
    path.write_bytes(raw[:cut] if cut >= 0 else raw[:len(raw) + cut])
    with pytest.raises(FormatError):
        Artifact(path)


def test_appended_bytes(golden_copy):
    path = golden_copy()
    path.write_bytes(path.read_bytes() + b"\0" * 4096)
    _open_fails(path, "preamble describes", Truncated)


def test_bad_magic_and_byte_order(golden_copy):
    path = golden_copy()
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    _open_fails(path, "not a .ninfer file")
    raw[0] ^= 0xFF
    raw[12:16] = struct.pack(">I", C.BYTE_ORDER_MARK)
    path.write_bytes(bytes(raw))
    _open_fails(path, "byte-order mark")


def test_unknown_version(golden_copy):
    path = golden_copy()
    manifest, data, d_off = split(path.read_bytes())
    raw = bytearray(rebuild(manifest, data, d_off))
    raw[8:12] = struct.pack("<I", 2)
    path.write_bytes(bytes(raw))
    _open_fails(path, "version 2 is not supported", UnsupportedVersion)


@pytest.mark.parametrize("where", ["preamble", "manifest"])
def test_flipped_header_byte(golden_copy, where):
    path = golden_copy()
    raw = bytearray(path.read_bytes())
    raw[30 if where == "preamble" else 100] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError):
        Artifact(path)


@pytest.mark.parametrize("stem", ["golden-bf16-linear", "golden-nvfp4-sm_120a", "golden-int4-asym-sm_90a"])
def test_flipped_data_byte_is_found_by_verify(golden_copy, stem):
    path = golden_copy(stem)
    manifest, _, d_off = split(path.read_bytes())
    raw = bytearray(path.read_bytes())
    for tensor in manifest["tensors"]:
        for part in tensor["parts"]:
            pos = d_off + part["offset"] + part["length"] // 2
            raw[pos] ^= 0x10
            path.write_bytes(bytes(raw))
            with Artifact(path) as a:
                problems = a.verify()
                assert len(problems) == 1 and f"{tensor['name']}.{part['role']}" in problems[0]
                with pytest.raises(ChecksumMismatch):
                    a.stored_parts(tensor["name"], check=True)
            raw[pos] ^= 0x10


def test_flipped_padding_byte_is_found_by_verify(golden_copy):
    path = golden_copy()
    raw = bytearray(path.read_bytes())
    manifest, _, d_off = split(bytes(raw))
    raw[d_off - 1] = 1  # manifest padding
    path.write_bytes(bytes(raw))
    with Artifact(path) as a:
        assert any("manifest padding" in p for p in a.verify())
    raw[d_off - 1] = 0
    part = next(p for t in manifest["tensors"] for p in t["parts"] if p["length"] % 256)
    raw[d_off + part["offset"] + part["length"]] = 7  # inside the alignment gap after that part
    path.write_bytes(bytes(raw))
    with Artifact(path) as a:
        assert any("padding" in p for p in a.verify())


def _forge(path, mutate, match):
    manifest, data, d_off = split(path.read_bytes())
    mutate(manifest)
    path.write_bytes(rebuild(manifest, data))
    _open_fails(path, match)


def _first_part(m):
    return m["tensors"][0]["parts"][0]


@pytest.mark.parametrize("mutate,match", [
    (lambda m: _first_part(m).update(offset=1 << 50), "runs past the data section"),
    (lambda m: _first_part(m).update(offset=3), "not 256-byte aligned"),
    (lambda m: m["tensors"][1]["parts"][0].update(offset=_first_part(m)["offset"]), "overlaps"),
    (lambda m: _first_part(m).update(shape=[1 << 45, 1 << 45]), "invalid dimension"),
    (lambda m: _first_part(m).update(shape=[-1]), "invalid dimension"),
    (lambda m: _first_part(m).update(length=_first_part(m)["length"] + 2), "does not match"),
    (lambda m: _first_part(m).update(dtype="f4"), "unknown dtype"),
    (lambda m: _first_part(m).update(layout="tiled_9x9"), "unknown layout"),
    (lambda m: _first_part(m).update(role="bias"), "unknown role"),
    (lambda m: _first_part(m).update(offset=True), "must be int"),
    (lambda m: m["tensors"][0].update(name="model.layers.0.mlp.extra.weight"), "not in registry entry"),
    (lambda m: m["tensors"][0].update(name="model.layers.0.\udcff"), "invalid name"),
    (lambda m: m["tensors"].pop(), "missing"),
    (lambda m: m["tensors"].append(m["tensors"][0]), "duplicate tensor names"),
    (lambda m: m.update(format_version=2), "manifest says version 2"),
    (lambda m: m.update(target="sm_75"), "unknown target"),
    (lambda m: m.update(extra=1), "unknown keys"),
    (lambda m: m["config"].update(num_hidden_layers=2), "missing"),
    (lambda m: m["config"].update(num_hidden_layers=10**9), "out of range"),
    (lambda m: m["config"].update(hidden_size="128"), "not an integer"),
    (lambda m: m["model"]["registry_entry"].update(id="qwen3-32b"), "hashes to"),
    (lambda m: m["quantization"]["classes"].update(linear={"kind": "plain", "dtype": "bf16"}), "differs from the profile"),
    (lambda m: m["blobs"][0].update(compression="lz4"), "unknown compression"),
])
def test_forged_manifest(golden_copy, mutate, match):
    _forge(golden_copy(), mutate, match)


def test_header_length_beyond_file(golden_copy):
    path = golden_copy()
    manifest, data, d_off = split(path.read_bytes())
    raw = bytearray(rebuild(manifest, data, d_off))
    from ninfer_format.writer import encode_preamble

    raw[:64] = encode_preamble(10**12, d_off, len(data), 0)
    path.write_bytes(bytes(raw))
    _open_fails(path, "exceeds")


@pytest.mark.parametrize("body,match", [
    (b"\xff\xfe{}", "not valid UTF-8"),
    (b"{\"a\": NaN}", "constant NaN"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply|top level"),
    (b"{\"format_version\": 1, \"format_version\": 1}", "duplicate JSON key"),
    (b"{not json", "not valid JSON"),
])
def test_garbage_manifest(golden_copy, body, match):
    path = golden_copy()
    _, data, _ = split(path.read_bytes())
    path.write_bytes(rebuild(body, data))
    _open_fails(path, match)


def test_writer_is_atomic_and_refuses_overwrite(golden_copy, tmp_path):
    src = golden_copy()
    with Artifact(src) as a:
        header = {k: a.manifest.raw[k] for k in ("model", "quantization", "target", "config", "provenance")}
        plans = []
        from ninfer_format import TensorPlan
        from ninfer_format.quants import PartSpec

        for t in a.manifest.tensors:
            plans.append(TensorPlan(t.name, t.scheme, t.logical_shape, t.logical_dtype,
                                    tuple(PartSpec(p.role, p.dtype, p.shape, p.layout) for p in t.parts)))
        out = tmp_path / "out.ninfer"
        with pytest.raises(RuntimeError):
            with ArtifactWriter(out, header, {}, plans) as w:
                w.write(plans[0].name, a.stored_parts(plans[0].name))
                raise RuntimeError("interrupted")
        assert list(tmp_path.glob("*out.ninfer*")) == []
        with pytest.raises(FormatError, match="expected tensor"):
            with ArtifactWriter(out, header, {}, plans) as w:
                w.write(plans[1].name, a.stored_parts(plans[1].name))
        with pytest.raises(FormatError, match="planned"):
            with ArtifactWriter(out, header, {}, plans) as w:
                parts = dict(a.stored_parts(plans[0].name))
                role = next(iter(parts))
                parts[role] = torch.zeros(3)
                w.write(plans[0].name, parts)
        assert list(tmp_path.glob("*out.ninfer*")) == []
        with ArtifactWriter(out, header, {"tokenizer.json": b'{"x": 1}' * 100}, plans) as w:
            for p in plans:
                w.write(p.name, a.stored_parts(p.name))
        with Artifact(out) as b:
            assert b.verify() == []
            assert b.blob("tokenizer.json") == b'{"x": 1}' * 100
            assert b.manifest.blobs[0].compression == "zstd"
            for p in plans:
                for role, t in a.stored_parts(p.name).items():
                    assert torch.equal(b.stored_parts(p.name)[role].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
        with pytest.raises(FileExistsError):
            ArtifactWriter(out, header, {}, plans)
        with pytest.raises(FileNotFoundError, match="does not exist"):
            ArtifactWriter(tmp_path / "missing" / "x.ninfer", header, {}, plans)


def test_views_are_zero_copy_and_copy_on_write(golden_copy):
    path = golden_copy("golden-bf16-linear")
    before = path.read_bytes()
    with Artifact(path) as a:
        name = a.tensor_names[0]
        t = a.stored_parts(name)["data"]
        t2 = a.stored_parts(name)["data"]
        assert t.data_ptr() == t2.data_ptr()
        t.zero_()
        del t, t2
    assert path.read_bytes() == before
