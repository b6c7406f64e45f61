#!/usr/bin/env bash
# Qwen3-Next on one GPU, two phases of one command each (each within a 10-minute call):
#   check - (about 4 minutes) the Gated DeltaNet reference tests; benchmark/gpu_qwen3_next_check.py: a
#           small Qwen3-Next in fp32 and bf16 against transformers on the GPU, then ModelRunner decode
#           tok/s at N = 1 and 64 with decode CUDA graphs (captured for those two sizes only) on a
#           Qwen3-Next-80B-A3B-shaped checkpoint of LAYERS layers (random_checkpoint.py --preset
#           qwen3-next-80b-a3b, about 14 GB at 4 layers, written to /tmp once per machine)
#   bench - benchmark/bench_serving_gpu.py --preset qwen3-next-80b-a3b: that checkpoint served over HTTP at
#           N = 1 and 64, with the active-weight read floor (same warm machine: the checkpoint is reused)
# Each step prints its seconds. Eager decode tok/s: gpu_qwen3_next_check.py --phase throughput without
# --cuda-graphs.
set -uo pipefail
phase=${1:?usage: gpu_qwen3_next_check.sh check|bench [layers]}
LAYERS=${2:-4}
OUT=${OUT:-/tmp/gpu_qwen3_next_out}
CKPT=/tmp/qwen3-next-random-${LAYERS}l
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_qwen3_next_$phase.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
step() { local start=$SECONDS; "$@"; local rc=$?; echo "[$((SECONDS - start)) s, exit $rc] $*"; return $rc; }
[ -f "$CKPT/config.json" ] || step python3 benchmark/random_checkpoint.py "$CKPT" --preset qwen3-next-80b-a3b \
  --layers "$LAYERS" --tokenizer .carry_engine/tokenizer
case "$phase" in
  check)
    step timeout 60 python3 -m pytest -q -p no:cacheprovider test/kernels/test_gated_delta_rule.py
    step timeout 90 python3 benchmark/gpu_qwen3_next_check.py --out "$OUT" --phase correctness
    step timeout 120 python3 benchmark/gpu_qwen3_next_check.py --out "$OUT" --checkpoint "$CKPT" --layers "$LAYERS" \
      --phase throughput --cuda-graphs --steps 32
    ;;
  bench)
    timeout 420 python3 benchmark/bench_serving_gpu.py --preset qwen3-next-80b-a3b --checkpoint "$CKPT" --layers "$LAYERS" \
      --systems ours weight_read_floor --concurrency 1 64 --rounds 2 --new-tokens 128 --time-budget-s 300 \
      --out-dir "$OUT" --tag qwen3next
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
