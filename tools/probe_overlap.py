"""Where an overlapped decode step loses its time (issue 6, stop 38's overlap measured 1.3-3.3 ms a step
slower than the plain order on an H100, while the same run under torch.profiler was not).

    python tools/probe_overlap.py [--out DIR] [--concurrency 1 8] [--new-tokens 48] [--retire-runs 10]

The 27B (nvfp4, random weights) decoded through the engine in each order:
  plain       the host reads a step's tokens, then launches the next (overlap_steps=False)
  overlap     the next step launches before the host reads this one's (the engine's default)
  wait        overlap, but each replay waits for the step ahead to end first (its bookkeeping still hidden)
  two-graphs  overlap, with two graphs of each shape replayed in turn (no graph relaunched while in flight)
For each: tok/s and a step's wall time (the runs end after the timed steps); from CUDA events around every
replay, the graph's device time and the gap between one graph's end and the next one's start; the host's time
inside replay() (cudaGraphLaunch) and in a finished run's retirement.
JSON in --out, a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (tools/: builds the model, runs the engine as the benchmark does)

from ninfer_run.engine import EngineConfig, Request, build_engine  # noqa: E402
from ninfer_run.graphs import GraphedDecoder  # noqa: E402

ORDERS = ("plain", "overlap", "wait", "two-graphs")


class ReplayLog:
    """CUDA events before and after every graph replay, and the host's time inside it."""

    def __init__(self):
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.host_s: list[float] = []
        self.original = torch.cuda.CUDAGraph.replay
        log = self

        def replay(graph):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            log.original(graph)
            log.host_s.append(time.perf_counter() - t0)
            end.record()
            log.events.append((start, end))

        torch.cuda.CUDAGraph.replay = replay

    def clear(self) -> None:
        self.events.clear()
        self.host_s.clear()

    def summary(self) -> dict:
        torch.cuda.synchronize()
        graph = [s.elapsed_time(e) for s, e in self.events]
        gaps = [e0.elapsed_time(s1) for (_, e0), (s1, _) in zip(self.events, self.events[1:])]
        span = self.events[0][0].elapsed_time(self.events[-1][1]) / len(graph)  # device time a replay, gaps included
        return {"replays": len(graph), "span_ms": span,
                "graph_ms": statistics.median(graph), "graph_ms_max": max(graph),
                "gap_ms": statistics.median(gaps) if gaps else None, "gap_ms_max": max(gaps) if gaps else None,
                "launch_host_ms": 1000 * statistics.median(self.host_s)}


def two_graphs(decoder: GraphedDecoder) -> None:
    """Each decode shape captured a second time; replays alternate between the two captures."""
    step = decoder._step

    def alternating(tokens, states, q_len):
        bucket = decoder._bucket(len(states), q_len)
        if bucket.graph is None or q_len != 1:
            return step(tokens, states, q_len)
        if not hasattr(bucket, "pair"):
            saved = decoder.slab.gather(bucket.batch.state_slots) if decoder.slab is not None else None
            second = decoder._captured(lambda: decoder.model.forward_static(bucket.batch))
            if saved is not None:
                decoder.slab.scatter(bucket.batch.state_slots, saved)
            bucket.pair, bucket.turn = [(bucket.graph, bucket.out), second], 0
        bucket.graph, bucket.out = bucket.pair[bucket.turn]
        bucket.turn ^= 1
        return step(tokens, states, q_len)

    decoder._step = alternating


def waiting(decoder: GraphedDecoder) -> None:
    rows = decoder.decode_rows

    def after_the_step_ahead(tokens, states):
        torch.cuda.current_stream().synchronize()
        return rows(tokens, states)

    decoder.decode_rows = after_the_step_ahead


def timing_retirements(engine) -> list[float]:
    """From now on, the host time (ms) each of the engine's finished runs holds its loop in retirement (the
    frontier's GDN snapshot to the host, the GDN slot freed), appended to the list returned."""
    retire, times = engine._retire, []

    def timed(*a, **k):
        t = time.perf_counter()
        retire(*a, **k)
        times.append(1000 * (time.perf_counter() - t))

    engine._retire = timed
    return times


def run(model, order: str, concurrency: int, new_tokens: int, log: ReplayLog) -> dict:
    config = EngineConfig(max_context=concurrency * 1024, max_concurrency=concurrency, block_size=64,
                          prefill_chunk=4096, max_frontiers=1, overlap_steps=order != "plain")
    engine = build_engine(model, config)
    if order == "two-graphs":
        two_graphs(engine.graphs)
    if order == "wait":
        waiting(engine.graphs)
    results = [engine.submit(Request(bench._prompt(512, model.cfg.vocab_size, i), max_tokens=12 + new_tokens + 8,
                                     params=bench.GREEDY)) for i in range(concurrency)]
    bench._steps_until(engine, results, 12)
    engine.drain()
    torch.cuda.synchronize()
    log.clear()
    start, t0 = sum(len(r.tokens) for r in results), time.perf_counter()
    bench._steps_until(engine, results, 12 + new_tokens)
    engine.drain()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    made = sum(len(r.tokens) for r in results) - start
    row = {"order": order, "concurrency": concurrency, "tok_s": made / seconds,
           "step_ms": 1000 * seconds * concurrency / made, **log.summary()}
    retiring = timing_retirements(engine)
    engine.run_until_done()
    row["retire_ms"] = statistics.mean(retiring)
    row["retire_ms_first"], row["retire_ms_rest_max"] = retiring[0], max(retiring[1:], default=0)
    del engine
    return row


def retirements(model, runs: int, frontiers: int) -> dict:
    """One engine serving `runs` short requests one after another (as a server does): the host time each one's
    retirement holds the engine's loop - the first waits for the slab still being locked since the engine's build
    (the server's warm-up takes that wait), the rest take a slab locked ahead or, past `frontiers`, the evicted
    frontier's."""
    engine = build_engine(model, EngineConfig(max_context=1024, max_concurrency=1, block_size=64, prefill_chunk=4096,
                                              max_frontiers=frontiers))
    times = timing_retirements(engine)
    for i in range(runs):
        engine.submit(Request(bench._prompt(512, model.cfg.vocab_size, 100 + i), max_tokens=8, params=bench.GREEDY))
        engine.run_until_done()
        time.sleep(0.2)  # a client's think time: the slab locked ahead is ready by the next finish
    torch.cuda.synchronize()
    return {"runs": runs, "frontiers": frontiers, "retire_ms": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--orders", nargs="+", choices=ORDERS, default=list(ORDERS))
    parser.add_argument("--retire-runs", type=int, default=0,
                        help="also serve this many requests one after another, 4 frontiers kept, timing each retirement")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = bench.build_model("qwen3.8-27b", "nvfp4", "cuda", torch.bfloat16)[0]
    log = ReplayLog()
    if args.retire_runs:
        served = retirements(model, args.retire_runs, 4)
        (args.out / "probe_retire.json").write_text(json.dumps(served, indent=1))
        print("retirements one after another (ms):", " ".join(f"{t:.1f}" for t in served["retire_ms"]), flush=True)
    rows = []
    for c in args.concurrency:
        run(model, "plain", c, 8, log)  # compiles and captures, untimed
        for order in args.orders + args.orders[::-1]:  # each order twice, mirrored: drift shows as a difference
            rows.append(run(model, order, c, args.new_tokens, log))
            print(json.dumps(rows[-1]), flush=True)
            (args.out / "probe_overlap.json").write_text(json.dumps(rows, indent=1))
    print(f"{'order':>11} {'C':>2} {'tok/s':>7} {'step':>6} {'span':>6} {'graph':>6} {'max':>6} {'gap':>6} {'max':>6} "
          f"{'launch':>6} {'retire':>7}")
    for r in rows:
        print(f"{r['order']:>11} {r['concurrency']:>2} {r['tok_s']:7.1f} {r['step_ms']:6.2f} {r['span_ms']:6.2f} "
              f"{r['graph_ms']:6.2f} {r['graph_ms_max']:6.2f} {r['gap_ms'] or 0:6.3f} {r['gap_ms_max'] or 0:6.3f} "
              f"{r['launch_host_ms']:6.3f} {r['retire_ms']:7.1f}")

if __name__ == "__main__":
    main()
