#!/usr/bin/env bash
# Every GPU check of the project in one call (run through the device tool on an H100):
# FlashInfer from the carried bundle, the CUDA sampler tests, then the CUDA sampler benchmark.
# Usage (repo root, with .carry/ from ../shared/tools/flashinfer-device/make-bundle.sh plus
# .carry/whl/{dill,orjson}*.whl and .carry/load_flashinfer_sampling.py): bash benchmark/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
# Unpack once here: setup() runs pip, which would re-enter a sitecustomize that unpacks.
python3 -c "import sys; sys.path.insert(0, '.carry'); import load_flashinfer_sampling as l; l.setup('.carry')" || exit 1
mkdir -p /tmp/boot
cat > /tmp/boot/sitecustomize.py <<'PY'
import sys
sys.path.insert(0, ".carry")
import load_flashinfer_sampling
load_flashinfer_sampling.setup(".carry")  # already unpacked: only registers the package
PY
export PYTHONPATH=/tmp/boot:/tmp/site:python:test PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, flashinfer.sampling as s; print('torch', torch.__version__, 'flashinfer sampling ok')" 2>&1 | tee -a "$OUT/device.txt"
python3 -m pytest -q -p no:cacheprovider test/test_sampler_cuda.py test/test_hash.py test/test_penaltylib.py 2>&1 | tee "$OUT/tests.txt"
python3 benchmark/bench_sampler.py --device cuda --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/bench.txt"
