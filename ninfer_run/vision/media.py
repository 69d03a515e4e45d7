"""Encoding a request's images: the vision tower behind a cache of its outputs keyed by content.

--media-cache-mib bounds the cached embeddings (least recently used go first); --media-live-mib
bounds the memory one request's images may take while they are encoded (their pixels and the
tower's activations), checked before the request is queued so an oversized image is a 400, not an
out-of-memory in the engine.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .encoder import ATTENTION_CHUNK, VisionTower
from .preprocess import ImageError, PreparedImage


class MediaEncoder:
    def __init__(self, tower: VisionTower, cache_bytes: int, live_bytes: int):
        self.tower, self.cache_bytes, self.live_bytes = tower, cache_bytes, live_bytes
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.cached_bytes = 0
        self.hits = self.misses = 0

    def working_set(self, images: tuple[PreparedImage, ...]) -> int:
        """Bytes one request's images need while encoded: pixels, ~8 activations of the widest layer
        per patch, a chunk of attention scores, and the output embeddings."""
        c, total = self.tower.cfg, 0
        for image in images:
            n = image.pixels.shape[0]
            total += image.pixels.numel() * 4 + n * c.hidden * 4 * 8
            total += min(n, ATTENTION_CHUNK) * n * c.heads * 4 + n // (c.merge * c.merge) * c.out_hidden * 4
        return total

    def check(self, images: tuple[PreparedImage, ...]) -> None:
        need = self.working_set(images)
        if need > self.live_bytes:
            raise ImageError(f"the images need {need / 2**20:.0f} MiB to encode, over --media-live-mib "
                             f"{self.live_bytes / 2**20:.0f}: send smaller or fewer images")

    def encode(self, images: tuple[PreparedImage, ...]) -> torch.Tensor:
        """Embeddings of all images, in order [sum of tokens, out_hidden]."""
        return torch.cat([self._one(image) for image in images])

    def _one(self, image: PreparedImage) -> torch.Tensor:
        hit = self._cache.get(image.digest)
        if hit is not None:
            self._cache.move_to_end(image.digest)
            self.hits += 1
            return hit
        self.misses += 1
        out = self.tower.forward(image.pixels, image.grid)
        size = out.numel() * out.element_size()
        if size <= self.cache_bytes:
            while self.cached_bytes + size > self.cache_bytes:
                _, old = self._cache.popitem(last=False)
                self.cached_bytes -= old.numel() * old.element_size()
            self._cache[image.digest] = out
            self.cached_bytes += size
        return out
