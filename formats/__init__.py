"""ninfer_format: the .ninfer v1 container (spec: ninfer-v1.md), shared by the compiler and the runtime.

Depends on nothing else in the project. Public API:
    Artifact(path)                       strict mmap reader, zero-copy torch views
    ArtifactWriter(path, header, blobs, plans)   streaming atomic writer
    TensorPlan, PartSpec, part_specs     what a tensor stores under a scheme and target
    FormatError (+ UnsupportedVersion, ChecksumMismatch, Truncated)
"""

from .compliance import entry_sha256
from .errors import ChecksumMismatch, FormatError, Truncated, UnsupportedVersion
from .quants import PartSpec, SchemeError, dequantize, part_specs
from .reader import Artifact
from .writer import ArtifactWriter, TensorPlan

__all__ = [
    "Artifact", "ArtifactWriter", "ChecksumMismatch", "FormatError", "PartSpec", "SchemeError", "TensorPlan",
    "Truncated", "UnsupportedVersion", "dequantize", "entry_sha256", "part_specs",
]
