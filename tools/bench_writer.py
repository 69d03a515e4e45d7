"""Writer memory: stream a multi-GiB artifact through ArtifactWriter and record peak RSS.

    python tools/bench_writer.py [--out out/bench] [--work /tmp/ninfer-bench]

Writes the text part of `bench-qwen3.8-4layer` in the bf16 profile (~8 GB, every tensor
generated just before it is written, then dropped). Peak RSS must stay near the baseline plus the
largest tensor, whatever the file size.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import psutil
import torch

from ninfer_format.rules import expand
from ninfer_pack.pack import pack
from ninfer_registry import load

from bench_common import write_results

MODEL = "bench-qwen3.8-4layer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/ninfer-bench"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    entry = load(MODEL)
    config = entry.expected_config()
    tensors = expand(entry.resolved, config, ("text",))
    largest = max(2 * torch.Size(t.shape).numel() for t in tensors.values())
    proc = psutil.Process()
    baseline = proc.memory_info().rss
    samples = []

    def make(name):
        def load_one():
            samples.append(proc.memory_info().rss)
            t = torch.empty(tensors[name].shape, dtype=torch.bfloat16)
            t.view(-1).normal_(0.0, 0.02)  # filled in place: no float32 temporary
            return t
        return load_one

    out = args.work / "writer.ninfer"
    start = time.perf_counter()
    pack(entry, config, {n: make(n) for n in tensors}, {n: torch.bfloat16 for n in tensors}, out, profile="bf16",
         target="sm_90a", parts=("text",), blobs={}, provenance={}, overwrite=True, measure_error=False)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = out.stat().st_size
    results = {"file_bytes": size, "seconds": seconds, "baseline_rss_bytes": baseline, "peak_rss_bytes": peak,
               "peak_minus_baseline_bytes": peak - baseline, "largest_tensor_bytes": largest,
               "max_sampled_rss_bytes": max(samples)}
    print(f"wrote {size / 2**30:.2f} GiB in {seconds:.1f} s; RSS baseline {baseline / 2**30:.2f} GiB, peak "
          f"{peak / 2**30:.2f} GiB (+{(peak - baseline) / 2**30:.2f} GiB; largest tensor {largest / 2**30:.2f} GiB)")
    out.unlink()
    write_results(args.out, "bench_writer", results)


if __name__ == "__main__":
    main()
