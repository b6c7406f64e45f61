#!/usr/bin/env bash
# Guidance (issue 37) on one GPU, by phase:
#   bench (default) - benchmark/bench_guidance.py at N=64 (and N=16) on a Qwen3-0.6B-shaped random
#             checkpoint, CUDA graphs on: the batch time of guided rows (cfg, mixture/kl_symmetry)
#             against unguided ones (target: at most 2.1x), and the check that cfg with weight 1
#             gives the unguided tokens exactly (guide rows replayed in the decode graphs)
#   graph   - guided rows inside the captured sampling graph (--sampling-backend triton): the
#             guided graph step captured and replayed natively against the eager step
#             (test/sampling/test_sampling_graph.py, test/sampling/test_guidance_graph.py), then
#             benchmark/gpu_sampling_graph_check.py --guidance (the server's guided and unguided
#             tokens with decode + sampling graphs equal --disable-cuda-graph's), then
#             bench_guidance.py at N=64 with the triton backend (guided steps no longer sample eagerly)
#   kl      - the kl_symmetry alpha kernel against its torch reference natively
#             (test/kernels/test_kl_alpha_triton.py) and the guided graph tests, then bench_guidance.py
#             at N=64 with the default (triton) sampling backend
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_guidance_check.sh [bench|graph|kl]
# Everything printed also goes to $OUT/gpu_guidance[_graph].txt; records in $OUT/guidance/.
set -uo pipefail
phase=${1:-bench}
OUT=${OUT:-/tmp/gpu_guidance_out}
mkdir -p "$OUT"
log=gpu_guidance
[ "$phase" = bench ] || log="gpu_guidance_$phase"
exec > >(tee "$OUT/$log.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
CKPT=/tmp/qwen3-0.6b
[ -f "$CKPT/config.json" ] || python3 benchmark/random_checkpoint.py "$CKPT" --tokenizer .carry_engine/tokenizer
if [ "$phase" = kl ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider test/kernels/test_kl_alpha_triton.py test/sampling/test_guidance.py \
    test/sampling/test_guidance_graph.py
  timeout 300 python3 benchmark/bench_guidance.py --n 64 --max-new-tokens 256 --tag gpu_n64_kl_kernel -- --model-path "$CKPT"
elif [ "$phase" = graph ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider test/sampling/test_sampling_graph.py test/sampling/test_guidance_graph.py
  timeout 400 python3 benchmark/gpu_sampling_graph_check.py --guidance --out-dir "$OUT/sampling_graph_guided"
  timeout 240 python3 benchmark/bench_guidance.py --n 64 --max-new-tokens 256 --tag gpu_n64_triton_graph \
    -- --model-path "$CKPT" --sampling-backend triton
else
  for n in 64 16; do
    timeout 240 python3 benchmark/bench_guidance.py --n "$n" --max-new-tokens 256 --tag "gpu_n$n" -- --model-path "$CKPT"
  done
fi
mkdir -p "$OUT/guidance" && cp benchmark/results/guidance/gpu_n*.json "$OUT/guidance/"
