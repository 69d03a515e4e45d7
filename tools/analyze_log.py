"""Analyze ninfer-run's per-request log: where the work goes, TTFT and decode speed, prefix reuse.

    python tools/analyze_log.py server.log [--buckets 50000,100000,160000] [--out DIR]

Reads the engine's per-request lines (`<id> prompt=N cached=N ttft=Xs prefill=Ntok/s decode=Ntok/s
accept=A out=N finish=R`, anywhere in a line, so timestamps and logger names may precede them) and
prints the seed engine's tables: the prefill share of the work, TTFT and decode distributions, and
reuse (full reset vs cache hit) by prompt-size bucket. Writes analysis.json and analysis.png to --out.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LINE = re.compile(r"(?P<id>\S+) prompt=(?P<prompt>\d+) cached=(?P<cached>\d+) ttft=(?P<ttft>[\d.]+)s "
                  r"prefill=(?P<prefill>[\d.]+)tok/s decode=(?P<decode>[\d.]+)tok/s accept=(?P<accept>[\d.]+|-) "
                  r"out=(?P<out>\d+) finish=(?P<finish>\w+)")


@dataclass(frozen=True)
class Record:
    id: str
    prompt: int
    cached: int
    ttft: float
    prefill: float
    decode: float
    accept: float | None
    out: int
    finish: str


def parse(lines) -> list[Record]:
    records = []
    for line in lines:
        m = LINE.search(line)
        if m:
            g = m.groupdict()
            records.append(Record(g["id"], int(g["prompt"]), int(g["cached"]), float(g["ttft"]), float(g["prefill"]),
                                  float(g["decode"]), None if g["accept"] == "-" else float(g["accept"]),
                                  int(g["out"]), g["finish"]))
    return records


def _dist(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return {"n": len(values), "min": min(values), "median": statistics.median(values), "p90": q[8],
            "max": max(values), "mean": statistics.fmean(values)}


def _bucket_names(edges: list[int]) -> list[str]:
    bounds = [0, *edges]
    names = [f"{lo // 1000}-{hi // 1000}K" for lo, hi in zip(bounds, edges)]
    return [f"<{edges[0] // 1000}K", *names[1:], f">={edges[-1] // 1000}K"]


def analyze(records: list[Record], edges: list[int]) -> dict:
    done = [r for r in records if r.finish in ("stop", "length")]
    prompt = sum(r.prompt for r in records)
    generated = sum(r.out for r in records)
    names = _bucket_names(edges)
    buckets = {name: [] for name in names}
    for r in records:
        buckets[names[sum(r.prompt >= e for e in edges)]].append(r)
    reuse = {}
    for name, rs in buckets.items():
        if rs:
            resets = sum(1 for r in rs if r.cached == 0)
            reuse[name] = {"requests": len(rs), "full_reset": resets / len(rs), "hit": 1 - resets / len(rs),
                           "cached_share": sum(r.cached for r in rs) / max(1, sum(r.prompt for r in rs)),
                           "ttft": _dist([r.ttft for r in rs if r.finish in ("stop", "length")])}
    drafted = [r.accept for r in done if r.accept is not None]
    return {
        "requests": len(records), "finished": {f: sum(1 for r in records if r.finish == f)
                                               for f in sorted({r.finish for r in records})},
        "prompt_tokens": prompt, "cached_tokens": sum(r.cached for r in records), "generated_tokens": generated,
        "prefill_share_of_work": prompt / max(1, prompt + generated),
        "computed_prefill_share": (prompt - sum(r.cached for r in records)) /
                                  max(1, prompt - sum(r.cached for r in records) + generated),
        "ttft_s": _dist([r.ttft for r in done]), "decode_tok_s": _dist([r.decode for r in done if r.out > 1]),
        "prefill_tok_s": _dist([r.prefill for r in done if r.prompt > r.cached]),
        "acceptance": _dist(drafted), "reuse_by_prompt_size": reuse,
    }


def report(a: dict) -> str:
    out = [f"{a['requests']} requests ({', '.join(f'{k} {v}' for k, v in a['finished'].items())})",
           f"prompt tokens {a['prompt_tokens']:,} (cached {a['cached_tokens']:,}) vs generated "
           f"{a['generated_tokens']:,}: prefill is {a['prefill_share_of_work']:.1%} of the tokens "
           f"({a['computed_prefill_share']:.1%} of those computed)"]
    for key, unit in (("ttft_s", "s"), ("decode_tok_s", "tok/s"), ("prefill_tok_s", "tok/s"), ("acceptance", "")):
        d = a[key]
        if d["n"]:
            out.append(f"{key:14s} min {d['min']:.2f}{unit}  median {d['median']:.2f}{unit}  p90 {d['p90']:.2f}{unit}"
                       f"  max {d['max']:.2f}{unit}  (n={d['n']})")
    out.append(f"{'prompt size':12s}{'requests':>9s}{'full reset':>12s}{'hit':>7s}{'cached':>8s}{'TTFT median':>13s}")
    for name, b in a["reuse_by_prompt_size"].items():
        ttft = f"{b['ttft']['median']:.2f}s" if b["ttft"]["n"] else "-"
        out.append(f"{name:12s}{b['requests']:9d}{b['full_reset']:12.0%}{b['hit']:7.0%}{b['cached_share']:8.0%}"
                   f"{ttft:>13s}")
    return "\n".join(out)


def plot(records: list[Record], a: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    done = [r for r in records if r.finish in ("stop", "length")]
    colors = ["tab:red" if r.cached == 0 else "tab:green" for r in done]
    axes[0].scatter([r.prompt for r in done], [r.ttft for r in done], s=8, c=colors)
    axes[0].set(xlabel="prompt tokens", ylabel="TTFT (s)", title="TTFT (red: full reset, green: cache hit)")
    axes[1].hist([r.decode for r in done if r.out > 1], bins=30, color="tab:blue")
    axes[1].set(xlabel="decode tok/s per request", ylabel="requests", title="decode speed")
    names = list(a["reuse_by_prompt_size"])
    hits = [a["reuse_by_prompt_size"][n]["hit"] * 100 for n in names]
    resets = [a["reuse_by_prompt_size"][n]["full_reset"] * 100 for n in names]
    axes[2].bar(names, resets, color="tab:red", label="full reset")
    axes[2].bar(names, hits, bottom=resets, color="tab:green", label="hit")
    axes[2].set(ylabel="% of requests", title="prefix reuse by prompt size")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the server's log (the engine's per-request lines)")
    parser.add_argument("--buckets", default="50000,100000,160000", help="prompt-size bucket edges, tokens")
    parser.add_argument("--out", type=Path, default=None, help="write analysis.json and analysis.png here")
    args = parser.parse_args(argv)
    edges = sorted(int(x) for x in args.buckets.split(","))
    with args.log.open(errors="replace") as f:
        records = parse(f)
    if not records:
        print(f"error: no per-request lines in {args.log}", file=sys.stderr)
        return 1
    a = analyze(records, edges)
    print(report(a))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "analysis.json").write_text(json.dumps({"analysis": a, "records": [asdict(r) for r in records]},
                                                           indent=1))
        plot(records, a, args.out / "analysis.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
