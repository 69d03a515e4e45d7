"""The CUDA caching allocator's settings for serving: expandable segments.

Prefill's transient buffers change size with every chunk (each KV head of the context decoded to
bf16: 8K .. 100K+ tokens), so the default allocator's fixed-size segments keep missing, freeing and
re-reserving memory, each time behind a device sync. On the H200 a 100K-token prefill of the 27B
took 25.6-28.3 s that way (16.6 s of GPU work) and 17.1 s with expandable segments, which grow one
mapping instead. torch reads the setting when the allocator starts (the first CUDA allocation):
set at run time (torch.cuda.memory._set_allocator_settings, after the weights were placed) it
changed nothing (27.0 s), so ninfer_run sets the environment variable when it is imported. A
PYTORCH_CUDA_ALLOC_CONF the user set is left as it is.
"""

from __future__ import annotations

import os

SETTINGS = "expandable_segments:True"


def configure() -> bool:
    """Ask for expandable segments unless PYTORCH_CUDA_ALLOC_CONF is set; True if this set it.
    Effective only before the process's first CUDA allocation."""
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = SETTINGS
    return True
