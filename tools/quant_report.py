"""Per-tensor quantization error of a checkpoint under each profile: the numbers users compare profiles by.

    python tools/quant_report.py CHECKPOINT_DIR [--profiles nvfp4 int4 int4-asym int8] [--json out.json]

For every tensor the profile quantizes: relative RMS error ||dq - w|| / ||w|| and max |dq - w|.
Reads one tensor at a time (safetensors), so it runs on checkpoints of any size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ninfer_registry
from ninfer_format.rules import expand
from ninfer_pack.pack import ErrorStats
from ninfer_pack.quant import quantize_tensor
from ninfer_pack.source import open_checkpoint


def _model_id(config: dict) -> str:
    """The registered model whose required config this checkpoint satisfies."""
    from ninfer_pack.validate import check_config, normalize_config

    for model_id in ninfer_registry.ids(include_test_only=True):
        entry = ninfer_registry.load(model_id)
        if not check_config(normalize_config(dict(config), entry), entry):
            return model_id
    raise SystemExit("error: the checkpoint matches no registered model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--profiles", nargs="+", default=["nvfp4", "int4", "int4-asym", "int8"])
    parser.add_argument("--json", type=Path, help="also write the table as JSON")
    args = parser.parse_args()
    ckpt = open_checkpoint(args.checkpoint)
    entry = ninfer_registry.load(_model_id(ckpt.config))
    expected = expand(entry.resolved, ckpt.config, entry.available_parts)
    rows = []
    print(f"{entry.id}: {len(expected)} tensors")
    print(f"{'tensor':<64} {'profile':<10} {'rel RMS':>9} {'max abs':>10}")
    for name, t in expected.items():
        w = ckpt.loader(name)()
        for profile in args.profiles:
            scheme = ninfer_registry.scheme_classes(entry, profile)[t.tensor_class]
            if scheme["kind"] == "plain":
                continue
            stats = ErrorStats()
            stats.add(scheme, t.shape, quantize_tensor(scheme, w, name), w)
            rows.append({"tensor": name, "profile": profile, "rel_rms": stats.rel_rms, "max_abs": stats.max_abs})
            print(f"{name[-64:]:<64} {profile:<10} {stats.rel_rms:9.5f} {stats.max_abs:10.3g}")
    for profile in args.profiles:
        mine = [r for r in rows if r["profile"] == profile]
        if mine:
            print(f"{profile}: mean rel RMS {sum(r['rel_rms'] for r in mine) / len(mine):.5f} over {len(mine)} tensors")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
