#!/usr/bin/env bash
# Every GPU check of the project in one call (run through the device tool on an H100):
# FlashInfer from the carried bundle; the sgl_kernel_ext Triton kernels against their references
# (natively, JIT-compiled here); the CUDA sampler tests (every backend's distributions, seeded rows
# equal to the CPU's, a step without host sync, the triton step replayed from a CUDA graph with
# new seeds and parameters) and the batch-invariant decode attention; then the CUDA sampler
# benchmark; then, when .carry_engine/ is carried too, --enable-deterministic-inference through the
# real server (benchmark/gpu_deterministic_check.py). Everything printed also goes to
# $OUT/gpu_check.txt (committed under docs/gpu/).
# Usage (repo root, with .carry/ from ../shared/tools/flashinfer-device/make-bundle.sh plus
# .carry/whl/{dill,orjson}*.whl and .carry/load_flashinfer_sampling.py, and .carry_engine/ from
# benchmark/make_engine_carry.sh): run with carry [".carry", ".carry_engine"]: bash benchmark/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.txt") 2>&1
export TQDM_DISABLE=1
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
export PYTHONPATH=/tmp/boot:/tmp/site:python:test:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton, flashinfer.sampling as s; print('torch', torch.__version__, 'triton', triton.__version__, 'flashinfer sampling ok')" 2>&1 | tee -a "$OUT/device.txt"
# Bounded, so that a hung test still leaves the benchmark its time. GPU_CHECK_TESTS narrows the
# pytest arguments for a focused iteration.
TESTS=${GPU_CHECK_TESTS:-"test/kernels/test_sgl_kernel_ext.py test/gpu/test_sampler_cuda.py test/sampling/test_hash.py test/sampling/test_penaltylib.py test/kernels/test_decode_attention.py"}
# shellcheck disable=SC2086  # TESTS is a word list
timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=5 $TESTS
python3 benchmark/bench_sampler.py --device cuda --no-hf --cases greedy topk_topp topp minp penalties --out-dir "$OUT" "$@"
if [ -d .carry_engine ]; then
  python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
  timeout 400 python3 benchmark/gpu_deterministic_check.py --out "$OUT" --tokenizer .carry_engine/tokenizer
fi
