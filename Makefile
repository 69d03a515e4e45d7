# Two commands on a fresh machine: `make install`, then `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test golden

install:
	$(PY) -m venv $(VENV)
	# CPU torch first (the local wheel), so no dependency can pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# ModelOpt (the NVFP4 reference) declares CUDA-only dependencies; its quantizer runs without them.
	$(BIN)/pip install -q --no-deps 'nvidia-modelopt==0.47.*'

test:
	$(BIN)/ruff check formats registry ninfer_pack ninfer_run tools tests
	$(BIN)/python -m pytest -q --durations=10
	# the `gpu` tests of the Triton kernels and the runtime: in Triton's interpreter on a CPU (those that
	# need CUDA itself skip), compiled on a GPU
	$(BIN)/python -m pytest -q -m gpu tests/kernels tests/run

golden:
	$(BIN)/python tools/gen_golden.py
