#!/usr/bin/env bash
# Qwen3-Next on one GPU in one command: the Gated DeltaNet reference tests, then
# benchmark/gpu_qwen3_next_check.py eager (bf16/fp32 vs transformers, decode tok/s at N = 1 and 64 on
# a Qwen3-Next-80B-A3B-shaped checkpoint of a few layers), then the same with decode CUDA graphs.
# flash-linear-attention is used where `pip install fla-core` succeeds (the GPU machines have no
# registry: carry its wheel in .carry_engine/whl to use it); otherwise the torch reference runs.
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_qwen3_next_check.sh [extra args of gpu_qwen3_next_check.py]
# Everything printed also goes to $OUT/gpu_qwen3_next.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_qwen3_next_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_qwen3_next.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
python3 -m pip install -q --target /tmp/site fla-core 2>&1 | tail -1 || true
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
timeout 120 python3 -m pytest -q -p no:cacheprovider test/kernels/test_gated_delta_rule.py
timeout 400 python3 benchmark/gpu_qwen3_next_check.py --out "$OUT" "$@"
# Decode graphs capture the MoE experts only with a capturable experts kernel: a failure is reported, not fatal.
timeout 150 python3 benchmark/gpu_qwen3_next_check.py --out "$OUT" --phase throughput --cuda-graphs "$@" \
  || echo "CUDA-graph run failed (exit $?)"
