"""Triton kernels run compiled on a CUDA machine; without one (and with triton installed) they run in
Triton's interpreter on the CPU, which checks their indexing and math on small shapes."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
