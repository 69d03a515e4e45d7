"""ninfer-run: loads a .ninfer artifact and serves it."""

from . import allocator

allocator.configure()  # before anything allocates on the GPU (see allocator.py)
