"""Host slabs for prefix-cache frontiers' GDN snapshots: one exact-size slab a frontier, reused.

A GPU snapshot (147 MiB on the 27B) copied out into freshly pinned memory held the engine's loop for
80-140 ms a finished run (H100, stop 39: the driver locks every page), a stall of every other stream's
decode, and torch's pinned allocator rounds each tensor up to a power of two (3 -> 4 MiB: a third more
locked memory than memory.py plans). So each frontier takes one slab of exactly a snapshot's bytes,
page-locked once (cudaHostRegister) and handed to the next frontier when its own is evicted; while no
slab is free and fewer than the cap exist, the next one is locked ahead in a background thread, the first
as the engine is built (`prepare`, from its decode graphs' GDN slab). On a CPU engine the slabs are plain
memory (nothing to lock).
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass

import torch

log = logging.getLogger("ninfer.prefix")
_ALIGN = 256  # bytes: every view starts aligned for any dtype
_PORTABLE = 1  # cudaHostRegisterPortable


@dataclass(frozen=True)
class SnapshotLayout:
    """Where each GDN state tensor of a snapshot lies in a slab: (key, shape, dtype, offset) per tensor."""

    conv: tuple[tuple[int, tuple[int, ...], torch.dtype, int], ...]
    recurrent: tuple[tuple[int, tuple[int, ...], torch.dtype, int], ...]
    nbytes: int

    @classmethod
    def of(cls, conv: dict[int, torch.Tensor], recurrent: dict[int, torch.Tensor]) -> SnapshotLayout:
        """By layer key (the order a state's dicts were filled in does not matter)."""
        offset, parts = 0, []
        for tensors in (conv, recurrent):
            entries = []
            for key in sorted(tensors):
                t = tensors[key]
                entries.append((key, tuple(t.shape), t.dtype, offset))
                offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
            parts.append(tuple(entries))
        return cls(parts[0], parts[1], offset)

    def views(self, slab: torch.Tensor) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        def view(entries):
            out = {}
            for key, shape, dtype, offset in entries:
                n = torch.Size(shape).numel() * dtype.itemsize
                out[key] = slab[offset: offset + n].view(dtype).view(shape)
            return out
        return view(self.conv), view(self.recurrent)


class HostSlabs:
    """At most `cap` slabs of one layout (the first snapshot's) for an engine on `device`; page-locked there
    when it is a GPU."""

    def __init__(self, cap: int, device: torch.device):
        self.cap, self.device, self.pin = cap, device, device.type == "cuda"
        self.layout: SnapshotLayout | None = None
        self.created = 0  # slabs made (or being made), never more than cap
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self._ahead: threading.Thread | None = None
        self._locked: list[tuple[int, torch.Tensor]] = []  # (pointer, slab) to unlock when the pool goes
        weakref.finalize(self, _unlock, self._locked).atexit = False  # at exit the process's memory goes anyway

    def prepare(self, conv: dict[int, torch.Tensor], recurrent: dict[int, torch.Tensor]) -> None:
        """Lay the slabs out for states shaped as these (an engine's GDN slab slot, before any request) and
        lock the first one in the background, so that no retirement waits for it."""
        if self.layout is None:
            self.layout = SnapshotLayout.of(conv, recurrent)
            self._lock_ahead()

    def snapshot(self, conv: dict[int, torch.Tensor], recurrent: dict[int, torch.Tensor]):
        """Copies of `conv` and `recurrent` in a slab -> (conv, recurrent, slab). From a GPU the copies are
        queued without a host wait: nothing reads them on the host, and copying back (`restore`) is queued
        after them on the same stream."""
        if self.layout is None:
            self.layout = SnapshotLayout.of(conv, recurrent)
        elif SnapshotLayout.of(conv, recurrent) != self.layout:
            raise ValueError("a GDN snapshot unlike the first one (the model's state shapes are fixed)")
        slab = self._take()
        host_conv, host_recurrent = self.layout.views(slab)
        for src, dst in ((conv, host_conv), (recurrent, host_recurrent)):
            for key, t in src.items():
                dst[key].copy_(t, non_blocking=self.pin)
        return host_conv, host_recurrent, slab

    def give_back(self, slab: torch.Tensor) -> None:
        """An evicted frontier's slab, for the next one (its copies are queued on the stream before any
        copy into it can be)."""
        with self._lock:
            self._free.append(slab)

    def restore(self, tensors: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Copies of a snapshot's tensors on the engine's device."""
        return {k: v.to(self.device, copy=True, non_blocking=self.pin) for k, v in tensors.items()}

    def _take(self) -> torch.Tensor:
        slab = self._pop()
        if slab is None and self._ahead is not None:
            self._ahead.join()  # a slab is being locked ahead: cheaper to wait for it than to lock another
            slab = self._pop()
        if slab is None:
            self._count_one()
            try:
                slab = self._make()
            except RuntimeError:
                self._count_one(-1)
                raise
        self._lock_ahead()
        return slab

    def _lock_ahead(self) -> None:
        """Start locking the next slab in a background thread, where none is free and the cap allows."""
        if self.pin and not self._free and self.created < self.cap and not (self._ahead and self._ahead.is_alive()):
            self._count_one()
            self._ahead = threading.Thread(target=self._make_ahead, daemon=True)
            self._ahead.start()

    def _pop(self) -> torch.Tensor | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def _count_one(self, change: int = 1) -> None:
        with self._lock:
            if change > 0 and self.created >= self.cap:
                raise RuntimeError(f"all {self.cap} snapshot slabs are held (more frontiers than the cap)")
            self.created += change

    def _make_ahead(self) -> None:
        try:
            with torch.cuda.device(self.device):  # this thread's CUDA calls on the engine's device, not device 0
                self.give_back(self._make())
        except RuntimeError:  # not now (out of host memory?): the next snapshot makes its own, or says why
            self._count_one(-1)

    def _make(self) -> torch.Tensor:
        slab = torch.empty(self.layout.nbytes, dtype=torch.uint8)
        if self.pin and slab.numel():
            pointer = slab.data_ptr()
            # portable: locked for every device's context, not only the one current in this (maybe background) thread
            error = int(torch.cuda.cudart().cudaHostRegister(pointer, slab.numel(), _PORTABLE))
            if error:  # still a snapshot, copied with a host wait (a locked-memory limit, e.g. ulimit -l)
                log.warning("a %.0f MiB frontier snapshot slab could not be page-locked (CUDA error %d): its copies "
                            "will wait for the GPU", slab.numel() / 2**20, error)
                return slab
            with self._lock:
                self._locked.append((pointer, slab))
        return slab


def _unlock(locked: list[tuple[int, torch.Tensor]]) -> None:
    """Unlock the slabs' pages before their memory is freed (copies still queued finish first)."""
    if locked and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        for pointer, _ in locked:
            torch.cuda.cudart().cudaHostUnregister(pointer)
    locked.clear()
