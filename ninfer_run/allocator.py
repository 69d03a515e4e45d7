"""The CUDA caching allocator's settings for serving: expandable segments.

Prefill's transient buffers change size with every chunk (each KV head of the context decoded to
bf16: 8K .. 100K+ tokens), so the default allocator's fixed-size segments keep missing, freeing and
re-reserving memory, each time behind a device sync. On the H200 a 100K-token prefill of the 27B
took 25.6 s that way (16.6 s of GPU work) and 17.1 s with expandable segments, which grow one
mapping instead. A PYTORCH_CUDA_ALLOC_CONF the user set is left as it is.
"""

from __future__ import annotations

import os

import torch

SETTINGS = "expandable_segments:True"


def configure() -> bool:
    """Turn expandable segments on unless PYTORCH_CUDA_ALLOC_CONF is set; True if this changed them.
    Segments reserved before the call keep their kind; later ones are expandable."""
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or not torch.cuda.is_available():
        return False
    torch.cuda.memory._set_allocator_settings(SETTINGS)
    return True
