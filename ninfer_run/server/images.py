"""Image references in API requests -> prepared images (both dialects).

OpenAI sends `image_url.url` (a `data:` URL, or http(s)); Anthropic sends `source` blocks (`base64`
with `data`, or `url`). Remote URLs are fetched only when the server was started with
--allow-image-urls (a server that fetches arbitrary URLs for its clients is an SSRF hazard); then
with a timeout and a size cap. Decoding and resizing run in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import urllib.request
from dataclasses import dataclass

from ..vision.media import MediaEncoder
from ..vision.preprocess import ImageConfig, ImageError, PreparedImage, decode, prepare
from .generation import ApiError

MAX_IMAGE_BYTES = 20 << 20
FETCH_TIMEOUT_S = 10.0
_DATA_URL = re.compile(r"^data:(?P<type>[\w/+.-]*)(?P<params>(;[\w-]+=[^;,]*)*)(?P<b64>;base64)?,(?P<data>.*)$", re.S)
NO_VISION = "image inputs need an artifact with a vision tower served with --vision"


@dataclass(frozen=True)
class ImageSource:
    """Where an image in a request comes from: its bytes already, or a URL."""

    data: bytes | None = None
    url: str | None = None


@dataclass
class VisionSupport:
    config: ImageConfig
    image_token_id: int
    merge: int
    media: MediaEncoder
    allow_urls: bool = False


def from_base64(text: str) -> ImageSource:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "image data is not valid base64", param="messages") from None
    return ImageSource(data=data)


def from_url(url: str) -> ImageSource:
    """A `data:` URL is decoded now; anything else stays a URL for `prepare_images` to judge."""
    m = _DATA_URL.match(url)
    if m is None:
        return ImageSource(url=url)
    if not m.group("b64"):
        raise ApiError(400, "image data URLs must be base64 (data:image/png;base64,...)", param="messages")
    return from_base64(m.group("data"))


def _fetch(url: str, allow: bool) -> bytes:
    if not url.startswith(("http://", "https://")):
        raise ApiError(400, f"unsupported image URL scheme in {url[:40]!r} (use a data: URL)", param="messages")
    if not allow:
        raise ApiError(400, "remote image URLs are refused: send the image as a data: URL / base64, or start the "
                            "server with --allow-image-urls", param="messages")
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 - opted in
            data = response.read(MAX_IMAGE_BYTES + 1)
    except (OSError, ValueError) as e:
        raise ApiError(400, f"could not fetch the image {url[:80]}: {e}", param="messages") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ApiError(400, f"the image at {url[:80]} is over {MAX_IMAGE_BYTES >> 20} MiB", param="messages")
    return data


async def prepare_images(vision: VisionSupport | None, sources: list[ImageSource]) -> tuple[PreparedImage, ...]:
    """Fetch (if allowed), decode, resize and patch each image; ApiError 400 for any bad one."""
    if not sources:
        return ()
    if vision is None:
        raise ApiError(400, NO_VISION, param="messages")

    def work() -> tuple[PreparedImage, ...]:
        out = []
        for i, source in enumerate(sources):
            data = source.data if source.data is not None else _fetch(source.url, vision.allow_urls)
            if len(data) > MAX_IMAGE_BYTES:
                raise ApiError(400, f"image {i + 1} is over {MAX_IMAGE_BYTES >> 20} MiB", param="messages")
            try:
                out.append(prepare(decode(data), vision.config))
            except ImageError as e:
                raise ApiError(400, f"image {i + 1}: {e}", param="messages") from None
        return tuple(out)

    images = await asyncio.to_thread(work)
    try:
        vision.media.check(images)
    except ImageError as e:
        raise ApiError(400, str(e), param="messages") from None
    return images
