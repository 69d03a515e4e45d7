"""The L2 prefetch of a decode step's next weight (kernels/l2_prefetch.py) launches where it is on and
moves no byte of what it touches: results never depend on it. (Its PTX is checked on a CPU by
test_triton_compiles; what it buys is measured by tools/bench.py --ab-l2-prefetch.)"""

import pytest
import torch

triton = pytest.importorskip("triton")
from ninfer_run.kernels import l2_prefetch  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="inline PTX: a GPU")]


def test_prefetch_launches_and_writes_nothing(monkeypatch):
    a = torch.randint(0, 256, (5_000_011,), dtype=torch.uint8, device="cuda")  # not a whole number of lines
    b = torch.randn(333, 7, device="cuda").half()  # another dtype, a few lines
    before = a.clone(), b.clone()
    monkeypatch.setattr(l2_prefetch, "L2_PREFETCH", False)
    assert not l2_prefetch.prefetch(a, b)
    monkeypatch.setattr(l2_prefetch, "L2_PREFETCH", True)
    assert l2_prefetch.prefetch(a, b)
    torch.cuda.synchronize()
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])
