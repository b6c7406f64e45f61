#!/usr/bin/env bash
# The MoE layer and families on a GPU in one script:
#   tests - the MoE Triton kernels' unit tests natively on CUDA, then benchmark/gpu_moe_check.py
#           (kernels vs reference at Qwen3-30B-A3B shapes in bf16 with timings, a CUDA graph of the
#           MoE block, Qwen3-MoE and Mixtral served in bf16 against transformers on CUDA)
#   bench - benchmark/bench_serving_gpu.py --preset qwen3-30b-a3b --dummy-weights: a Qwen3-30B-A3B-shaped
#           model (config.json only, random weights drawn at load: 61 GB would not fit the disk) served
#           at N = 1, 64, 256 with the active-weight read floor measured in the same call (extra args
#           go to bench_serving_gpu.py)
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_moe_check.sh tests      |      bash benchmark/gpu_moe_check.sh bench [bench args]
# Everything printed also goes to $OUT/gpu_moe_<phase>.txt.
set -uo pipefail
phase=${1:?usage: gpu_moe_check.sh tests|bench [args]}
shift
OUT=${OUT:-/tmp/gpu_moe_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_moe_$phase.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
git log -1 --format='commit %h %s' 2>/dev/null || true
case "$phase" in
  tests)
    timeout 200 python3 -m pytest -q -p no:cacheprovider test/kernels/test_fused_moe_triton.py test/models/test_moe_layer.py
    timeout 360 python3 benchmark/gpu_moe_check.py --out "$OUT" --tokenizer .carry_engine/tokenizer "$@"
    ;;
  bench)
    timeout 580 python3 benchmark/bench_serving_gpu.py --preset qwen3-30b-a3b --dummy-weights --systems ours weight_read_floor \
      --concurrency 1 64 256 --rounds 1 --time-budget-s 400 --server-timeout-s 400 --out-dir "$OUT" \
      --tokenizer .carry_engine/tokenizer --tag qwen3-30b-a3b "$@"
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
