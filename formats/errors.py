"""Typed errors of the format layer; each message names the file part, tensor and values involved."""


class FormatError(ValueError):
    """The bytes are not a valid .ninfer v1 artifact (or do not match what the writer was told)."""


class UnsupportedVersion(FormatError):
    """The file declares a format version this reader does not implement."""


class ChecksumMismatch(FormatError):
    """Stored bytes do not hash to the checksum recorded for them."""


class Truncated(FormatError):
    """The file is shorter (or longer) than its preamble says."""
