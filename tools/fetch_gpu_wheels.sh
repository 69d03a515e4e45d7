#!/usr/bin/env bash
# The wheels the GPU box lacks (it has torch, triton, transformers, safetensors, tokenizers, numpy, but no
# network), downloaded here into .whl/ (git-ignored) for the device tool to carry (`carry: [".whl"]`); gpu_check.sh
# installs them there. CPython 3.12, manylinux x86_64, no dependency resolution: the list is the closure
# that imports cleanly on the box (stop 30).   bash tools/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=("fla-core>=0.6,<0.7" einops zstandard xxhash fastapi starlette pydantic pydantic-core annotated-types
        typing-inspection typing-extensions annotated-doc opentelemetry-api anyio sniffio uvicorn h11 click
        prometheus-client typer shellingham rich markdown-it-py mdurl pygments)
for wheel in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$wheel" 2>&1 | grep -v "^WARNING: Location" || true
done
ls .whl | wc -l; du -sh .whl
