"""A fast GPU twin of a pure-torch slab function, trusted only after it matches the reference.

Bytes must not depend on the device. For every new slab signature (shapes, dtypes, arguments) the
twin's result is compared once with the reference's; a signature that differs, or whose twin
fails, stays on the reference path with a warning. The check costs one reference slab per shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and \
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return a is None and b is None


def checked(reference: Callable, fast: Callable) -> Callable:
    verdict: dict[tuple, bool] = {}

    def run(*args):
        sig = tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor) else a for a in args)
        if verdict.get(sig) is False:
            return reference(*args)
        try:
            out = fast(*args)
        except Exception as e:  # noqa: BLE001 - any failure of the fast path falls back to the reference
            log.warning("%s failed for %s (%s); using %s", fast.__name__, sig, e, reference.__name__)
            verdict[sig] = False
            return reference(*args)
        if sig not in verdict:
            ref = reference(*args)
            verdict[sig] = _same(out, ref)
            if not verdict[sig]:
                log.warning("%s differs from %s for %s; using the reference", fast.__name__, reference.__name__, sig)
                return ref
        return out

    return run
