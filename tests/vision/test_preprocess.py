"""Image preprocessing against transformers' own image processor (the checkpoint's), on fresh images."""

import io
import json

import numpy as np
import PIL.Image
import pytest
import torch

from ninfer_run.vision.preprocess import ImageConfig, ImageError, decode, prepare

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def processors(tiny_checkpoints):
    root = tiny_checkpoints["tiny-qwen3.5"]
    ours = ImageConfig.from_preprocessor(json.loads((root / "preprocessor_config.json").read_text()))
    return ours, transformers.AutoImageProcessor.from_pretrained(root)


def _encode(image: PIL.Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(37, 53), (64, 64), (100, 250), (300, 41), (800, 600), (17, 900)])
@pytest.mark.parametrize("mode,fmt", [("RGB", "PNG"), ("RGBA", "PNG"), ("L", "PNG"), ("P", "GIF"), ("RGB", "JPEG")])
def test_matches_transformers_processor(processors, size, mode, fmt):
    ours, theirs = processors
    rng = np.random.default_rng(hash((size, mode)) % 2**32)
    array = rng.integers(0, 256, (*size[::-1], 4), dtype=np.uint8)
    image = PIL.Image.fromarray(array, "RGBA").convert(mode)
    data = _encode(image, fmt)
    prepared = prepare(decode(data), ours)
    ref = theirs(images=[PIL.Image.open(io.BytesIO(data))], return_tensors="pt")
    assert prepared.grid == tuple(ref["image_grid_thw"][0].tolist())
    assert torch.equal(prepared.pixels, ref["pixel_values"])


def test_same_pixels_same_digest_different_pixels_different_digest(processors):
    ours, _ = processors
    image = PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    a, b = prepare(decode(_encode(image, "PNG")), ours), prepare(decode(_encode(image, "BMP")), ours)
    assert a.digest == b.digest  # two encodings of the same pixels
    other = image.copy()
    other.putpixel((0, 0), (1, 2, 3))
    assert prepare(decode(_encode(other, "PNG")), ours).digest != a.digest


@pytest.mark.parametrize("data,match", [
    (b"not an image at all", "not an image"),
    (b"GIF89a" + b"\x00" * 10, "could not be decoded|not an image"),
])
def test_garbage_is_an_image_error(data, match):
    with pytest.raises(ImageError, match=match):
        decode(data)


def test_truncated_and_huge_images_are_refused():
    png = _encode(PIL.Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)), "PNG")
    with pytest.raises(ImageError):
        decode(png[: len(png) // 2])
    huge = _encode(PIL.Image.new("L", (10_000, 5_000)), "PNG")  # 50 Mpx: a few KB compressed
    with pytest.raises(ImageError, match="over the limit"):
        decode(huge)
    thin = _encode(PIL.Image.new("RGB", (1000, 2)), "PNG")
    with pytest.raises(ImageError, match="aspect ratio"):
        prepare(decode(thin), ImageConfig(16, 2, 2, 4096, 65536, (0.5,) * 3, (0.5,) * 3))
