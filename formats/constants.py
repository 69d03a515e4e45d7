"""Every number, name and closed set of the .ninfer v1 format, in one place (see ninfer-v1.md)."""

from __future__ import annotations

import torch

MAGIC = b"NINFER\x00\x1a"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
BYTE_ORDER_MARK = 0x0A0B0C0D
PREAMBLE_SIZE = 64
SECTION_ALIGNMENT = 4096
TENSOR_ALIGNMENT = 256
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_NAME_LENGTH = 256
MAX_RANK = 8
CHECKSUM_ALGORITHM = "xxh3_64"
CHECKSUM_HEX_DIGITS = 16

# name -> (torch dtype, bytes per element)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "bf16": (torch.bfloat16, 2),
    "f16": (torch.float16, 2),
    "f32": (torch.float32, 4),
    "f8_e4m3": (torch.float8_e4m3fn, 1),
    "u8": (torch.uint8, 1),
    "i8": (torch.int8, 1),
    "i32": (torch.int32, 4),
    "i64": (torch.int64, 8),
}
DTYPE_NAMES: dict[torch.dtype, str] = {dt: name for name, (dt, _) in DTYPES.items()}

# How the bytes of one part are arranged.
#   row_major      C order of `shape`.
#   blocked_128x4  NVFP4 block scales in the cuBLAS / CUTLASS / torchao `to_blocked` 128x4 swizzle
#                  (rows padded to 128, scale columns to 4, zero-filled); `shape` is the stored 2-D shape.
LAYOUTS = ("row_major", "blocked_128x4")

# Target GPUs an artifact can be laid out for; "linear" is the untiled debugging layout.
TARGETS = ("sm_120a", "sm_90a", "linear")
DEFAULT_TARGET = "sm_120a"

# Quantization kinds and the exact part roles each stores.
SCHEME_KINDS: dict[str, tuple[str, ...]] = {
    "plain": ("data",),
    "nvfp4": ("qweight", "block_scale", "global_scale"),
    "int": ("qweight", "scale"),  # + "zero_point" when asymmetric
}
OPTIONAL_ROLES: dict[str, tuple[str, ...]] = {"int": ("zero_point",)}
ROLES = ("data", "qweight", "block_scale", "global_scale", "scale", "zero_point")

BLOB_COMPRESSIONS = ("none", "zstd")
# The files an artifact may embed beside its tensors (closed set: a reader refuses any other name).
BLOB_NAMES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "chat_template.jinja", "chat_template.json", "generation_config.json", "preprocessor_config.json",
    "video_preprocessor_config.json",
)
MAX_BLOB_BYTES = 256 * 1024 * 1024

MANIFEST_KEYS = (
    "format_version",
    "checksum_algorithm",
    "tensor_alignment",
    "model",
    "quantization",
    "target",
    "config",
    "provenance",
    "blobs",
    "tensors",
)
