#!/usr/bin/env bash
# Watermarking (issue 38) on one GPU: the Triton kernels against their torch references natively
# (test/kernels/test_watermark_triton.py), the sampler's CUDA suite and the sampling graphs (watermarked
# variant captured and replayed against the eager triton step), then bench_watermark.py
# (the sampler step alone at N=64, V=151936, with each contender's kernels profiled), then
# bench_watermark_serving.py (whole serving at N=64 on a Qwen3-0.6B-shaped random checkpoint,
# plain against watermarked; the target is at most 5% overhead).
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_watermark_check.sh
# Everything printed also goes to $OUT/gpu_watermark.txt; records in $OUT/watermark/.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_watermark_out}
mkdir -p "$OUT/watermark"
exec > >(tee "$OUT/gpu_watermark.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
CKPT=/tmp/qwen3-0.6b
[ -f "$CKPT/config.json" ] || python3 benchmark/random_checkpoint.py "$CKPT" --tokenizer .carry_engine/tokenizer
timeout 200 python3 -m pytest -q -p no:cacheprovider test/kernels/test_watermark_triton.py test/gpu/test_sampler_cuda.py \
  test/sampling/test_sampling_graph.py
timeout 120 python3 benchmark/bench_watermark.py --device cuda --n 64 --profile --out "$OUT/watermark/bench_watermark_gpu.json"
timeout 300 python3 benchmark/bench_watermark_serving.py --n 64 --max-new-tokens 256 --tag serving_gpu_n64 \
  -- --model-path "$CKPT"
cp benchmark/results/watermark/serving_gpu_n64.json "$OUT/watermark/"
