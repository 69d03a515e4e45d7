"""Regenerate the golden .ninfer vectors in formats/golden/ (and their expected decoded contents).

    python tools/gen_golden.py            # rewrite formats/golden/*
    python tools/gen_golden.py --check    # exit 1 if regenerating would change a byte

Weights come from an integer LCG (no torch RNG), so the bytes depend only on our code: a changed
golden file means the format or a quantizer changed, which needs a version decision.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import zlib
from pathlib import Path

import torch

from ninfer_format import Artifact
from ninfer_format.rules import expand
from ninfer_pack.pack import pack
from ninfer_registry import load

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "formats" / "golden"
MODEL = "golden-qwen3"
CASES = {  # file stem -> (profile, target)
    "golden-bf16-linear": ("bf16", "linear"),
    "golden-nvfp4-sm_120a": ("nvfp4", "sm_120a"),
    "golden-int4-asym-sm_90a": ("int4-asym", "sm_90a"),
}
BLOBS = {
    "tokenizer_config.json": b'{"model_max_length": 256}',
    "chat_template.jinja": b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
}
PROVENANCE = {"ninfer_version": "golden", "created_utc": "2026-01-01T00:00:00Z", "source": "tools/gen_golden.py",
              "source_files": []}


def lcg_tensor(name: str, shape: tuple[int, ...], scale: float) -> torch.Tensor:
    """Deterministic pseudo-random bf16 tensor: 32-bit LCG seeded by crc32(name), exact in float64."""
    n = 1
    for d in shape:
        n *= d
    state = zlib.crc32(name.encode())
    out = torch.empty(n, dtype=torch.float64)
    for i in range(n):
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        out[i] = (state / 2**32 - 0.5) * 2 * scale
    return out.view(shape).to(torch.bfloat16)


def build(stem: str, out_dir: Path) -> Path:
    profile, target = CASES[stem]
    entry = load(MODEL)
    config = entry.expected_config()
    expected = expand(entry.resolved, config, ("text",))
    weights = {n: lcg_tensor(n, t.shape, 1.0 if t.tensor_class == "norm" else 0.05) for n, t in expected.items()}
    path = out_dir / f"{stem}.ninfer"
    pack(entry, config, {n: (lambda w=w: w) for n, w in weights.items()}, {n: torch.bfloat16 for n in weights}, path,
         profile=profile, target=target, parts=("text",), blobs=BLOBS, provenance=PROVENANCE, overwrite=True,
         measure_error=False, compress_blobs=False)
    return path


def describe(path: Path) -> dict:
    """The decoded contents a reader must produce: part hashes, dequantized-value hashes, blobs."""
    with Artifact(path) as a:
        m = a.manifest
        tensors = []
        for t in m.tensors:
            values = a.dequantized(t.name, check=True)
            tensors.append({
                "name": t.name, "scheme": t.scheme, "logical_shape": list(t.logical_shape),
                "parts": [{"role": p.role, "dtype": p.dtype, "shape": list(p.shape), "layout": p.layout,
                           "sha256": hashlib.sha256(bytes(a.part(p).reshape(-1).view(torch.uint8).numpy())).hexdigest()}
                          for p in t.parts],
                "dequantized_sha256": hashlib.sha256(values.contiguous().numpy().tobytes()).hexdigest(),
                "first_values": [float(v) for v in values.reshape(-1)[:4]],
            })
        return {
            "format_version": m.format_version, "registry_id": m.registry_id, "profile": m.quantization["profile"],
            "target": m.target, "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "blobs": {b.name: hashlib.sha256(a.blob(b.name)).hexdigest() for b in m.blobs}, "tensors": tensors,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    changed = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem in CASES:
            fresh = build(stem, Path(tmp))
            target = GOLDEN_DIR / fresh.name
            expected = json.dumps(describe(fresh), indent=1, sort_keys=True) + "\n"
            expected_path = GOLDEN_DIR / f"{stem}.expected.json"
            same = target.exists() and target.read_bytes() == fresh.read_bytes() and \
                expected_path.exists() and expected_path.read_text() == expected
            if not same:
                changed.append(stem)
                if not args.check:
                    target.write_bytes(fresh.read_bytes())
                    expected_path.write_text(expected)
    for stem in changed:
        print(f"{'differs' if args.check else 'rewrote'}: {stem}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
