"""Images -> vision-tower inputs, exactly as transformers' Qwen2-VL image processor (PIL backend, the
one Qwen3.5 checkpoints name) prepares them: RGB (transparency composited on white), a BICUBIC
resize to a multiple of patch x merge within [min_pixels, max_pixels] (`smart_resize`), x / 255,
(x - mean) / std in float32, then patches in spatial-merge-block order with the frame repeated
`temporal_patch_size` times. tests/vision/test_preprocess.py holds it to the processor's output.

Untrusted bytes are decoded defensively: only common still-image formats, a pixel budget checked
from the header before any decoding, and any decoder failure is an ImageError (HTTP 400).
"""

from __future__ import annotations

import hashlib
import io
import math
import warnings
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_SOURCE_PIXELS = 40_000_000  # decoded size limit (a 20 MB PNG can expand to gigabytes)
MAX_ASPECT = 200  # smart_resize's own limit


class ImageError(ValueError):
    """The image cannot be used: not an image, unsupported format, truncated, or too large."""


@dataclass(frozen=True)
class ImageConfig:
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_preprocessor(cls, cfg: dict) -> ImageConfig:
        """From preprocessor_config.json (`size.shortest_edge/longest_edge` or the older min/max_pixels)."""
        size = cfg.get("size") or {}
        if cfg.get("resample", 3) != 3:
            raise ValueError(f"only BICUBIC resampling is supported, preprocessor_config says {cfg['resample']}")
        return cls(patch_size=cfg["patch_size"], temporal_patch_size=cfg["temporal_patch_size"],
                   merge_size=cfg["merge_size"], min_pixels=size.get("shortest_edge", cfg.get("min_pixels")),
                   max_pixels=size.get("longest_edge", cfg.get("max_pixels")),
                   mean=tuple(cfg["image_mean"]), std=tuple(cfg["image_std"]))


@dataclass(frozen=True)
class PreparedImage:
    """One image as the vision tower takes it, with the content hash that keys caches."""

    pixels: torch.Tensor  # [grid_h * grid_w, C * T * p * p] float32
    grid: tuple[int, int, int]  # (t, h, w) in patches
    digest: str  # sha256 of the decoded RGB pixels and the grid

    def tokens(self, merge_size: int) -> int:
        """Image placeholder tokens in the prompt (one per merged 2x2 patch block)."""
        t, h, w = self.grid
        return t * h * w // (merge_size * merge_size)


def decode(data: bytes) -> PIL.Image.Image:
    """Bytes -> an RGB PIL image, or ImageError naming what is wrong."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PIL.Image.DecompressionBombWarning)
            image = PIL.Image.open(io.BytesIO(data), formats=FORMATS)
            if image.width * image.height > MAX_SOURCE_PIXELS:
                raise ImageError(f"image of {image.width}x{image.height} pixels is over the limit of "
                                 f"{MAX_SOURCE_PIXELS:,} pixels")
            image.load()
    except ImageError:
        raise
    except PIL.UnidentifiedImageError:
        raise ImageError(f"not an image in a supported format ({', '.join(FORMATS)})") from None
    except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombWarning, PIL.Image.DecompressionBombError) as e:
        raise ImageError(f"the image could not be decoded: {e}") from None
    return _to_rgb(image)


def _to_rgb(image: PIL.Image.Image) -> PIL.Image.Image:
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return PIL.Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Both sides multiples of `factor`, area within [min_pixels, max_pixels], aspect ratio kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ImageError(f"image aspect ratio {max(height, width) / min(height, width):.0f} is over {MAX_ASPECT}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def prepare(image: PIL.Image.Image, cfg: ImageConfig) -> PreparedImage:
    """An RGB image -> patches [N, C*T*p*p] in the order the vision tower and the M-RoPE grid expect."""
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    h, w = smart_resize(image.height, image.width, p * m, cfg.min_pixels, cfg.max_pixels)
    resized = np.asarray(image.resize((w, h), resample=PIL.Image.Resampling.BICUBIC), dtype=np.uint8)
    x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.asarray(cfg.mean, dtype=np.float32)) / np.asarray(cfg.std, dtype=np.float32)
    x = x.transpose(2, 0, 1)  # [C, H, W]
    gh, gw = h // p, w // p
    blocks = x.reshape(3, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (gh, gw, mh, mw, C, ph, pw)
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    pixels = torch.from_numpy(np.ascontiguousarray(frames).reshape(gh * gw, 3 * t * p * p))
    digest = hashlib.sha256(resized.tobytes() + f"{gh}x{gw}".encode()).hexdigest()
    return PreparedImage(pixels, (1, gh, gw), digest)
