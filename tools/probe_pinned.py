"""What a prefix frontier's GDN snapshot costs to put in page-locked host memory, each way (issue 6, stop 39).

    python tools/probe_pinned.py

The 27B's snapshot: 48 GDN layers x ([48, 128, 128] float32 recurrent state + [10240, 3] bf16 conv window) =
147 MiB. Times (host, then with the copies' end): a fresh torch-pinned tensor per state tensor (what
kv/prefix.py did until stop 39), one slab page-locked with cudaHostRegister (kv/host_slabs.py), the lock
alone on memory already touched, and the copies into a slab already locked (a reused one). Three runs each;
a table of lines (tools/results/probe_pinned_stop39_h100.log).
"""
import time

import torch

dev = torch.device("cuda")
rec = [torch.randn(48, 128, 128, device=dev) for _ in range(48)]
conv = [torch.randn(10240, 3, device=dev).bfloat16() for _ in range(48)]
srcs = rec + conv
nbytes = sum(t.numel() * t.element_size() for t in srcs)
print(f"snapshot {nbytes / 2**20:.1f} MiB")


def timed(label, fn, n=3):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        out.append((1000 * (t1 - t0), 1000 * (t2 - t0)))
        del r
    print(f"{label:48s} host " + " ".join(f"{a:7.1f}" for a, _ in out) + " | +sync " + " ".join(f"{b:7.1f}" for _, b in out))


keep = []


def per_tensor_pinned():
    res = []
    for t in srcs:
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t, non_blocking=True)
        res.append(h)
    keep.append(res)  # kept, as frontiers are: no reuse from the caching allocator
    return None


def slab_registered():
    slab = torch.empty(nbytes, dtype=torch.uint8)
    torch.cuda.cudart().cudaHostRegister(slab.data_ptr(), nbytes, 0)
    keep.append(slab)
    return slab


def slab_touched_then_registered():
    slab = torch.zeros(nbytes, dtype=torch.uint8)
    t0 = time.perf_counter()
    torch.cuda.cudart().cudaHostRegister(slab.data_ptr(), nbytes, 0)
    keep.append(slab)
    print(f"   register alone {1000 * (time.perf_counter() - t0):.1f} ms")
    return slab


def copy_into(slab):
    off = 0
    for t in srcs:
        n = t.numel() * t.element_size()
        slab[off:off + n].view(t.dtype).view(t.shape).copy_(t, non_blocking=True)
        off += n


timed("per tensor torch pinned (96 allocs) + copies", per_tensor_pinned)
timed("one slab empty + cudaHostRegister", slab_registered)
timed("one slab zeros + cudaHostRegister", slab_touched_then_registered)
s = keep[-1]
print("registered slab is_pinned:", s.is_pinned())
timed("copies into a registered slab (reuse)", lambda: copy_into(s))
pinned_slab = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
timed("copies into a torch-pinned slab (reuse)", lambda: copy_into(pinned_slab))
