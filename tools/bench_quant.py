"""Quantize throughput for one 5120 x 17408 bf16 weight (a qwen3.8-27b MLP matrix), NVFP4 and int4-g128.

    python tools/bench_quant.py [--out out/bench] [--device cpu|cuda]

CPU: MB of bf16 input per second with 1 thread (= per core) and with all threads. CUDA: GB/s, with
the device-to-device copy bandwidth measured in the same run as the roofline; NVFP4 runs the
Triton kernel (ninfer_pack/quant/nvfp4_triton.py), int4 eager torch (quantization reads
2 B/element and writes ~0.56 B (NVFP4) / 0.53 B (int4) per element).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from ninfer_pack.quant import quantize_int, quantize_nvfp4

from bench_common import write_results

N, K = 17408, 5120
CASES = {"nvfp4": lambda w: quantize_nvfp4(w), "int4-g128": lambda w: quantize_int(w, 4, 128, True)}



def _peers() -> dict:
    """The reference implementations, timed on the same weight (when installed): the peer ratio."""
    peers = {}
    try:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

        peers["nvfp4"] = ("ModelOpt NVFP4QTensor.quantize", lambda w: NVFP4QTensor.quantize(w, 16))
    except ImportError:
        pass
    try:
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
        from compressed_tensors.quantization.utils.helpers import calculate_qparams

        args = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=128, symmetric=True)
        scheme = QuantizationScheme(targets=["Linear"], weights=args)

        def ct_int4(w):
            g = w.unflatten(-1, (w.shape[1] // 128, 128))
            scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
            return PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)

        peers["int4-g128"] = ("compressed-tensors pack-quantized", ct_int4)
    except ImportError:
        pass
    return peers


def _time_cpu(fn, w, repeats: int) -> float:
    fn(w)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(w)
        best = min(best, time.perf_counter() - t)
    return best


def _time_cuda(fn, w, repeats: int) -> float:
    fn(w)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(w)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/bench")))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    w = (torch.randn(N, K) * 0.02).to(torch.bfloat16)
    nbytes = w.numel() * 2
    results, bars = {"shape": [N, K], "input_bytes": nbytes, "device": args.device, "cases": {}}, {}
    if args.device == "cpu":
        threads = sorted({1, os.cpu_count() or 1})
        for name, fn in CASES.items():
            for t in threads:
                torch.set_num_threads(t)
                s = _time_cpu(fn, w, args.repeats)
                mbps = nbytes / s / 1e6
                results["cases"][f"{name}/{t}thr"] = {"seconds": s, "MB_per_s": mbps, "MB_per_s_per_core": mbps / t}
                bars[f"{name} {t} thr (MB/s/core)"] = mbps / t
                print(f"{name:<10} {t} thread(s): {s:.3f} s  {mbps:7.0f} MB/s  {mbps / t:7.0f} MB/s per core")
        torch.set_num_threads(1)
        for name, (label, fn) in _peers().items():
            s = _time_cpu(fn, w, 1)
            ours = results["cases"][f"{name}/1thr"]["seconds"]
            results["cases"][f"{name}/peer"] = {"peer": label, "seconds": s, "MB_per_s": nbytes / s / 1e6, "speedup_vs_peer": s / ours}
            print(f"{name:<10} peer {label}, 1 thread: {s:.3f} s  ({s / ours:.1f}x slower than ours)")
    else:
        wd = w.to(args.device)
        buf = torch.empty(256 << 20, dtype=torch.uint8, device=args.device)
        dst = torch.empty_like(buf)
        copy = _time_cuda(lambda _: dst.copy_(buf), None, 20)
        copy_gbps = 2 * buf.numel() / copy / 1e9
        results["copy_GB_per_s"] = copy_gbps
        print(f"device copy (read + write): {copy_gbps:.0f} GB/s")
        for name, fn in CASES.items():
            ref = fn(w)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = fn(wd)
            torch.cuda.synchronize()
            results.setdefault("first_call_seconds", {})[name] = time.perf_counter() - t0  # includes compilation
            ref, got = (ref[:2], got[:2]) if isinstance(ref, tuple) else (list(ref.values()), list(got.values()))
            exact = all(torch.equal(a.reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8)) for a, b in zip(ref, got))
            results.setdefault("cuda_bytes_equal_cpu", {})[name] = exact
            print(f"{name}: CUDA bytes equal CPU bytes: {exact} (first call, with compile: "
                  f"{results['first_call_seconds'][name]:.1f} s)")
        for name, fn in CASES.items():
            s = _time_cuda(fn, wd, max(args.repeats, 10))
            gbps = nbytes / s / 1e9
            moved = nbytes * (1 + (0.5625 if name == "nvfp4" else 0.53) / 2)
            results["cases"][name] = {"seconds": s, "GB_per_s_input": gbps, "fraction_of_copy_roofline": moved / s / 1e9 / copy_gbps}
            bars[f"{name} (GB/s of bf16 input)"] = gbps
            print(f"{name:<10} {s * 1e3:7.2f} ms  {gbps:6.1f} GB/s of bf16 input  ({moved / s / 1e9 / copy_gbps:.1%} of copy bandwidth)")
    path = write_results(args.out, f"bench_quant_{args.device}", results, bars, "MB/s per core" if args.device == "cpu" else "GB/s")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
