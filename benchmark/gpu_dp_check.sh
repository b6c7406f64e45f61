#!/usr/bin/env bash
# --dp-size 2 with both replicas on one GPU (--gpu-id-step 0), run through the device tool from the
# repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   check - benchmark/gpu_tp_check.py --tp-size 1 --dp-size 2 --dtype bfloat16: greedy and seeded
#           requests on the random-weight Qwen3-0.6B-shaped checkpoint, two replicas against one
#   bench - benchmark/bench_serving_gpu.py, ours at N=256: --dp-size 1, then --dp-size 2
#   all   - both (default; about 9 minutes on an H100)
# Everything printed also goes to $OUT/gpu_dp_check_<phase>.txt; the bench JSON/markdown to $OUT.
set -uo pipefail
phase=${1:-all}
OUT=${OUT:-/tmp/gpu_dp_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_dp_check_$phase.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z')
if [[ $phase == check || $phase == all ]]; then
  timeout 240 python3 benchmark/gpu_tp_check.py --device cuda --tp-size 1 --dp-size 2 --dtype bfloat16 --out-dir "$OUT/check"
fi
if [[ $phase == bench || $phase == all ]]; then
  for dp in 1 2; do
    timeout 160 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT" --tokenizer .carry_engine/tokenizer --systems ours \
      --concurrency 256 --rounds 2 --dp-size "$dp" --server-args "--gpu-id-step 0" --time-budget-s 120 --tag "$tag-dp$dp"
  done
fi
