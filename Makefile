# Two set-up commands: `make test` and `make serve` (see README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0

.PHONY: test serve bench venv

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# A CPU build of torch unless an NVIDIA GPU is present (an unpinned torch pulls CUDA).
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --quiet $(TORCH_CPU); fi

venv: $(PY)
	$(PY) -m pip install --quiet -e ".[test]"

test: venv
	$(PY) -m pytest -q test

bench: venv
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) benchmark/bench_sampler.py

serve: venv
	@echo "make serve arrives with the engine issue: it will start python -m sglang.launch_server on the embedded SmolLM2-135M-Instruct model."
