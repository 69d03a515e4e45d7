"""Pack throughput and peak memory on a synthetic checkpoint with real qwen3.8-27b shapes (4 layers).

    python tools/bench_pack.py [--out out/bench] [--work /tmp/ninfer-bench] [--profiles nvfp4 int4]

Builds (once) a bf16 safetensors checkpoint of the test-only `bench-qwen3.8-4layer` entry (real
layer, vocab, MTP and vision shapes; ~10 GB), then runs `ninfer-pack` under `/usr/bin/time -v` with
1 and all CPU threads: MB/s of bf16 input per core, and peak RSS against the target
(<= 2 GiB + the largest tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ninfer_format.rules import expand
from ninfer_registry import load

from bench_common import write_results

MODEL = "bench-qwen3.8-4layer"


def build_checkpoint(root: Path, shard_bytes: int = 2 << 30) -> int:
    """Random bf16 weights in ~2 GiB shards + index; returns the largest tensor's size in bytes."""
    entry = load(MODEL)
    config = entry.expected_config()
    config["architectures"] = list(entry.hf_architectures)
    tensors = expand(entry.resolved, config, entry.available_parts)
    largest = max(2 * torch.Size(t.shape).numel() for t in tensors.values())
    if (root / "model.safetensors.index.json").exists():
        return largest
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    weight_map, shard, size, n = {}, {}, 0, 0
    names = list(tensors)
    g = torch.Generator().manual_seed(0)
    for i, name in enumerate(names):
        t = tensors[name]
        shard[name] = (torch.randn(t.shape, generator=g) * 0.02).to(torch.bfloat16)
        size += 2 * shard[name].numel()
        if size >= shard_bytes or i == len(names) - 1:
            n += 1
            file = f"model-{n:05d}.safetensors"
            save_file(shard, root / file, metadata={"format": "pt"})
            weight_map.update({k: file for k in shard})
            shard, size = {}, 0
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return largest


def run_pack(src: Path, out: Path, profile: str, threads: int) -> dict:
    exe = shutil.which("ninfer-pack", path=str(Path(sys.executable).parent))
    cmd = ["/usr/bin/time", "-v", exe, MODEL, "--profile", profile, "--source", str(src), "-o", str(out), "--force", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    summary = json.loads(r.stdout)
    return {"threads": threads, "seconds": summary["seconds"], "MB_per_s": summary["mb_per_s"],
            "MB_per_s_per_core": summary["mb_per_s"] / threads, "peak_rss_bytes": rss_kib * 1024,
            "file_bytes": summary["file_bytes"], "bf16_bytes": summary["bf16_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/ninfer-bench"))
    parser.add_argument("--profiles", nargs="+", default=["nvfp4", "int4"])
    args = parser.parse_args()
    src = args.work / "checkpoint"
    largest = build_checkpoint(src)
    budget = (2 << 30) + largest
    results, bars = {"model": MODEL, "largest_tensor_bytes": largest, "rss_budget_bytes": budget, "runs": []}, {}
    for profile in args.profiles:
        for threads in sorted({1, os.cpu_count() or 1}):
            r = run_pack(src, args.work / f"{profile}.ninfer", profile, threads)
            r["profile"] = profile
            results["runs"].append(r)
            bars[f"{profile} {threads} thr"] = r["MB_per_s_per_core"]
            print(f"{profile:<6} {threads} thr: {r['bf16_bytes'] / 1e9:.2f} GB bf16 in {r['seconds']:.1f} s = "
                  f"{r['MB_per_s']:.0f} MB/s ({r['MB_per_s_per_core']:.0f} MB/s/core), peak RSS "
                  f"{r['peak_rss_bytes'] / 2**30:.2f} GiB (budget {budget / 2**30:.2f} GiB), out {r['file_bytes'] / 2**30:.2f} GiB")
    print(f"wrote {write_results(args.out, 'bench_pack', results, bars, 'MB/s of bf16 input per core')}")


if __name__ == "__main__":
    main()
