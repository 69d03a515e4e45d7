"""Shared bits of the benchmark tools: where results go (JSON + PNG) and the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch


def machine() -> dict:
    info = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def gpu_tag() -> str:
    """The card's short name for result files ("h200", "h100"): the box lends either, and a file named for
    the wrong card has already misled a reader."""
    name = torch.cuda.get_device_name().lower() if torch.cuda.is_available() else "cpu"
    return next((tag for tag in ("h200", "h100", "b200", "rtx 5090") if tag in name), "gpu").replace(" ", "")


def write_results(out_dir: Path, name: str, results: dict, bars: dict[str, float] | None = None, ylabel: str = "") -> Path:
    """results -> OUT/name.json; bars (label -> value) -> OUT/name.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=1))
    if bars:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(6, len(bars) * 1.2), 4))
        ax.bar(list(bars), list(bars.values()), color="#4a7bb7")
        for i, v in enumerate(bars.values()):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        plt.xticks(rotation=20, ha="right", fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=110)
        plt.close(fig)
    return path
