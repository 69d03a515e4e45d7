"""Prompts with images: placeholder expansion, M-RoPE positions, and prefix-cache keys.

As transformers' Qwen3.5 processor and `get_rope_index` do it: each image's single `<|image_pad|>`
becomes one placeholder per merged patch block; text tokens advance all three position axes
together; an image's tokens take (t, row, col) positions offset by the position where it starts,
and the text after it resumes at that offset + max(rows, cols). Tokens past the prompt sit at
index + `rope_delta` on all three axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .preprocess import PreparedImage

_KEY_SPACE = 1 << 62


@dataclass
class MultimodalPrompt:
    positions: torch.Tensor  # [3, P] M-RoPE positions of the prompt's tokens
    rope_delta: int  # position of a token past the prompt = its index + rope_delta
    image_rows: torch.Tensor  # [n] prompt indices of the image placeholders, image by image
    images: tuple[PreparedImage, ...]
    embeds: torch.Tensor | None = None  # [n, hidden] from the vision tower, set when the request is admitted


class PlaceholderMismatch(ValueError):
    """The number of image placeholders in the rendered prompt differs from the number of images."""


def expand(tokens: list[int], image_token_id: int, images: tuple[PreparedImage, ...], merge: int) -> list[int]:
    """Each `image_token_id` (one per image, in order) -> that image's number of placeholders."""
    found = sum(1 for t in tokens if t == image_token_id)
    if found != len(images):
        raise PlaceholderMismatch(f"the prompt has {found} image placeholders for {len(images)} images")
    out, i = [], 0
    for t in tokens:
        if t == image_token_id:
            out += [image_token_id] * images[i].tokens(merge)
            i += 1
        else:
            out.append(t)
    return out


def multimodal_prompt(tokens: list[int], image_token_id: int, images: tuple[PreparedImage, ...],
                      merge: int) -> MultimodalPrompt:
    """Positions for an already expanded prompt (one run of placeholders per image)."""
    columns, rows = [], []
    position, index, image = 0, 0, 0
    while index < len(tokens):
        if tokens[index] != image_token_id:
            columns.append(torch.full((3, 1), position))
            position, index = position + 1, index + 1
            continue
        t, h, w = images[image].grid
        gh, gw = h // merge, w // merge
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij"))
        columns.append(grid.reshape(3, -1) + position)
        rows.append(torch.arange(index, index + t * gh * gw))
        position += max(gh, gw)
        index += t * gh * gw
        image += 1
    positions = torch.cat(columns, dim=1) if columns else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions.max()) + 1 - len(tokens) if len(tokens) else 0
    return MultimodalPrompt(positions, delta, torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long), images)


def cache_key(tokens: list[int], image_token_id: int, images: tuple[PreparedImage, ...], merge: int) -> list[int]:
    """The prompt as the prefix cache sees it: each image's placeholders replaced by ids derived from
    its content digest (negative, so never a vocabulary id), so two images never share cached KV."""
    out, index, image = [], 0, 0
    while index < len(tokens):
        if tokens[index] != image_token_id:
            out.append(tokens[index])
            index += 1
            continue
        base, n = int(images[image].digest[:15], 16), images[image].tokens(merge)
        out += [-1 - (base + k) % _KEY_SPACE for k in range(n)]
        index, image = index + n, image + 1
    return out
