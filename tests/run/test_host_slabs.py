"""Host slabs of frontier snapshots: exact layout, reuse after give-back, the cap (GPU: page-locked, no host wait)."""

import pytest
import torch

from ninfer_run.kv.host_slabs import HostSlabs, SnapshotLayout


def _state(device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    conv = {k: torch.randn(10, 3, generator=g).to(torch.bfloat16) for k in (0, 1, 2)}  # 60 B: not a 256 multiple
    recurrent = {k: torch.randn(2, 4, 5, generator=g) for k in (0, 1, 2)}
    return ({k: v.to(device) for k, v in conv.items()}, {k: v.to(device) for k, v in recurrent.items()})


def test_layout_places_every_tensor_apart_and_aligned():
    conv, recurrent = _state()
    layout = SnapshotLayout.of(conv, recurrent)
    spans = sorted((off, off + torch.Size(shape).numel() * dtype.itemsize)
                   for entries in (layout.conv, layout.recurrent) for _, shape, dtype, off in entries)
    assert all(a % 256 == 0 for a, _ in spans) and all(b <= c for (_, b), (c, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= layout.nbytes
    assert SnapshotLayout.of(dict(reversed(conv.items())), dict(reversed(recurrent.items()))) == layout
    slabs = HostSlabs(cap=2, device=torch.device("cpu"))
    host_conv, host_recurrent, _ = slabs.snapshot(conv, recurrent)
    for src, dst in ((conv, host_conv), (recurrent, host_recurrent)):
        assert src.keys() == dst.keys()
        for k in src:
            assert dst[k].dtype == src[k].dtype and torch.equal(dst[k], src[k])


def test_a_given_back_slab_is_reused_and_the_cap_holds():
    slabs = HostSlabs(cap=2, device=torch.device("cpu"))
    _, _, a = slabs.snapshot(*_state(seed=1))
    _, _, b = slabs.snapshot(*_state(seed=2))
    assert slabs.created == 2 and a.data_ptr() != b.data_ptr()
    with pytest.raises(RuntimeError, match="all 2 snapshot slabs"):
        slabs.snapshot(*_state(seed=3))
    slabs.give_back(a)
    conv, recurrent = _state(seed=4)
    host_conv, host_recurrent, c = slabs.snapshot(conv, recurrent)
    assert c.data_ptr() == a.data_ptr() and slabs.created == 2
    assert all(torch.equal(host_recurrent[k], recurrent[k]) for k in recurrent)


def test_a_snapshot_of_other_shapes_is_refused():
    slabs = HostSlabs(cap=4, device=torch.device("cpu"))
    conv, recurrent = _state()
    slabs.snapshot(conv, recurrent)
    recurrent[1] = torch.zeros(2, 4, 6)
    with pytest.raises(ValueError, match="unlike the first"):
        slabs.snapshot(conv, recurrent)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_snapshots_are_page_locked_queued_and_locked_ahead():
    conv, recurrent = _state("cuda", seed=5)
    slabs = HostSlabs(cap=3, device=torch.device("cuda"))
    torch.cuda.set_sync_debug_mode("error")  # a copy that waits for the GPU raises
    try:
        host_conv, host_recurrent, slab = slabs.snapshot(conv, recurrent)
        back = slabs.restore(host_recurrent)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert slab.is_pinned()
    assert all(torch.equal(back[k], recurrent[k]) for k in recurrent)
    slabs._ahead.join()  # the next slab was locked in the background
    assert slabs.created == 2 and len(slabs._free) == 1 and slabs._free[0].is_pinned()


def test_the_warm_up_lays_out_slabs_the_first_requests_find_free(tiny_model):
    from ninfer_run.engine import EngineConfig, build_engine
    from ninfer_run.warmup import warm_up

    model = tiny_model("tiny-qwen3.5")
    engine = build_engine(model, EngineConfig(max_context=1024, block_size=16))
    warm_up(engine, model.cfg.vocab_size)
    slabs = engine.cache.slabs
    assert not engine.cache.frontiers and slabs.created >= 1 and len(slabs._free) == slabs.created


def test_an_engine_lays_out_its_slabs_before_any_request_as_its_requests_fill_them(tiny_model):
    """The layout taken from the decode graphs' GDN slab is the one a finished request's state has (else the
    snapshot would be refused), whatever order the request's state was filled in."""
    from ninfer_run.engine import EngineConfig, Request, build_engine
    from ninfer_run.sampling import SamplingParams

    model = tiny_model("tiny-qwen3.5")
    engine = build_engine(model, EngineConfig(max_context=512, block_size=16, cuda_graphs=True))
    assert engine.cache.slabs.layout is not None and engine.cache.slabs.created == 0  # a CPU locks nothing ahead
    prepared = engine.cache.slabs.layout
    engine.submit(Request(list(range(1, 40)), max_tokens=4, params=SamplingParams()))
    engine.run_until_done()
    assert len(engine.cache.frontiers) == 1 and engine.cache.slabs.layout == prepared
    assert engine.cache.slabs.layout.nbytes >= sum(t.numel() * t.element_size() for f in engine.cache.frontiers
                                                   for t in (*f.conv.values(), *f.recurrent.values()))
