"""The sampler's cost a step (issue 6): the whole-vocabulary path, draw(probs(...)), against the top-k
candidates' (sampling.draw_sampled: on a GPU its draw after the top-k as one kernel, kernels/sample_draw.py,
and as torch's ops, sampling.FUSED_DRAW off), per batch size, on the 27B's vocabulary (248,320 logits a row).

    python tools/bench_sampling.py [--out DIR] [--rows 1 8] [--calls 50]

Per call, two figures: the host's time to issue it (a loop of calls, then one wait: what the engine's host
spends a sampled step) and, on a GPU, the device's, the sum of the call's kernel and copy durations under
torch.profiler (what a sampled step adds to the GPU's work when the host is ahead of it, as in the overlapped
engine). A stop-41 probe that queued calls behind a long device sleep mismeasured both: each call's pinned
uniforms then need a fresh pinned block, whose allocation waits for the device. Each row also checks that every
path draws the same tokens for the same seeds. JSON + PNG to --out; a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ninfer_run import sampling  # noqa: E402

from bench_common import gpu_tag, write_results  # noqa: E402

VOCAB = 248_320
PATHS = ("whole vocabulary", "top-k, one kernel", "top-k, torch ops")
SETTING = sampling.SamplingParams(temperature=0.6, top_p=0.95, top_k=20)  # Qwen's recommended thinking-mode sampling


def _generators(rows: int, seed: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + b) for b in range(rows)]


def _device_ms(call, calls: int) -> float:
    """The call's kernels and copies, summed, a call (torch.profiler's device times)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1000 / calls


def _torch_draw(logits: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """draw_sampled with its draw after the top-k in torch's ops (the kernel's reference)."""
    fused, sampling.FUSED_DRAW = sampling.FUSED_DRAW, False
    try:
        return sampling.draw_sampled(logits, SETTING, generators)
    finally:
        sampling.FUSED_DRAW = fused


def measure(rows: int, calls: int, device: str) -> dict:
    g = torch.Generator(device=device).manual_seed(rows)
    logits = (torch.randn(rows, VOCAB, device=device, generator=g) * 4).to(torch.bfloat16)
    paths = {"whole vocabulary": lambda gens: sampling.draw(sampling.probs(logits, SETTING), gens),
             "top-k, one kernel": lambda gens: sampling.draw_sampled(logits, SETTING, gens),
             "top-k, torch ops": lambda gens: _torch_draw(logits, gens)}
    row = {"rows": rows, "setting": dataclasses.asdict(SETTING)}
    row["same_tokens"] = all(len({tuple(path(_generators(rows, s)).tolist()) for path in paths.values()}) == 1
                             for s in range(20))
    for name, path in paths.items():
        gens = _generators(rows, 1000)
        for _ in range(5):  # warm-up: kernels chosen, pinned blocks cached
            path(gens)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            path(gens)
        host = (time.perf_counter() - t0) / calls
        if device == "cuda":
            torch.cuda.synchronize()
            row[f"{name} device_ms"] = _device_ms(lambda: path(gens), calls)
        row[f"{name} host_ms"] = 1000 * host
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [measure(n, args.calls if device == "cuda" else 3, device) for n in args.rows]
    name = f"bench_sampling_{gpu_tag()}" if device == "cuda" else "bench_sampling_cpu"
    figure = "device_ms" if device == "cuda" else "host_ms"
    write_results(args.out, name, {"vocab": VOCAB, "rows": rows},
                  bars={f"B={r['rows']} {path}": r[f"{path} {figure}"] for r in rows
                        for path in PATHS}, ylabel=f"ms a call ({figure})")
    print(f"{'rows':>4} {'path':<17} {'host ms':>8} {'device ms':>9} same tokens")
    for r in rows:
        for path in PATHS:
            print(f"{r['rows']:>4} {path:<17} {r[f'{path} host_ms']:8.3f} {r.get(f'{path} device_ms', float('nan')):9.3f} "
                  f"{r['same_tokens']}")


if __name__ == "__main__":
    main()
