#!/usr/bin/env bash
# The multi-GPU runs of issue 41 in one script (run through the device tool on nvidia-h100-x4 /
# nvidia-h200-x4, carry [".carry_engine"], made by benchmark/make_engine_carry.sh). Phases:
#   tp4-70b   - bench_serving_gpu.py --preset llama3.1-70b --dummy-weights --tp-size 4: a Llama-3.1-70B-shaped
#               bf16 model (random weights drawn at load; 140 GB are never written) at N = 1, 16, 64, 256 beside
#               the per-GPU weight-read floor (35 GB per GPU) measured in the same call
#   tp4-agree - gpu_tp_check.py --tp-size 4 --graphs-vs-eager on a two-layer Llama-3.1-70B-shaped fp32 checkpoint:
#               greedy and seeded+penalised tokens with CUDA graphs equal TP=4 eager
#   scaling   - the 0.6B-shaped bf16 checkpoint: --dp-size 1 / 2 at N = 256 and --dp-size 4 at N = 1024
#               (streamed clients), TP=1 / TP=2 at N = 1
#   fp8-70b-tp2 - the Llama-3.1-70B shape at --tp-size 2 in bf16 and with --quantization fp8 (quantised at
#               load from the dummy bf16 weights) at N = 1, 16, 64, 256 beside the per-GPU weight-read floor
#   moe       - the Qwen3-30B-A3B-shaped model (dummy weights) at TP=2 and TP=2 --ep-size 2, N = 1, 64, 256
# Usage (repo root): bash benchmark/gpu_multi_gpu_check.sh PHASE [PHASE ...]
# Everything printed also goes to $OUT/multi_gpu.txt (committed under docs/gpu/); result files and server logs
# come back packed in $OUT/multi_gpu.tgz.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: gpu_multi_gpu_check.sh tp4-70b|tp4-agree|scaling|fp8-70b-tp2|moe ..."; exit 2; }
OUT=${OUT:-/tmp/gpu_multi_gpu_out}
WORK=/tmp/multi_gpu
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/multi_gpu.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
# NVLink multicast stays off on shared hosts.
export PYTHONPATH=/tmp/site:python:test:. PYTHONUNBUFFERED=1 TQDM_DISABLE=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
status=0
bench() {  # bench TAG SECONDS ARGS...: one bench_serving_gpu.py run, records tagged
  local tag=$1 limit=$2
  shift 2
  echo "== $tag: $*"
  timeout "$limit" python3 benchmark/bench_serving_gpu.py --tokenizer .carry_engine/tokenizer --out-dir "$WORK" \
    --tag "multi_gpu_$tag" --client-procs 16 "$@" || status=1
  grep -E "^\| (ours|weight)|Weight-read floor|target" "$WORK/serving_gpu_multi_gpu_$tag.md" 2>/dev/null
}
for phase in "$@"; do
  case "$phase" in
    tp4-70b)
      bench tp4_llama70b 420 --preset llama3.1-70b --dummy-weights --checkpoint /tmp/llama70b --tp-size 4 \
        --systems ours weight_read_floor --concurrency 1 16 64 256 --rounds 1 --new-tokens 128 \
        --server-timeout-s 400 --time-budget-s 330
      ;;
    tp4-agree)
      timeout 400 python3 benchmark/gpu_tp_check.py --device cuda --dtype float32 --tp-size 4 \
        --shape llama3.1-70b-2layers --graphs-vs-eager --out-dir "$WORK/tp4_agree" || status=1
      ;;
    scaling)
      for dp in 1 2; do
        bench "dp${dp}_n256" 170 --systems ours --concurrency 256 --rounds 2 --new-tokens 256 --dp-size "$dp" --time-budget-s 120
      done
      bench dp4_n1024 200 --systems ours --concurrency 1024 --rounds 1 --new-tokens 256 --dp-size 4 --time-budget-s 150
      bench dp1_n1024 200 --systems ours --concurrency 1024 --rounds 1 --new-tokens 256 --time-budget-s 150
      for tp in 1 2; do
        bench "tp${tp}_n1" 120 --systems ours --concurrency 1 --rounds 3 --tp-size "$tp" --time-budget-s 90
      done
      ;;
    fp8-70b-tp2)
      bench fp8_llama70b_tp2 540 --preset llama3.1-70b --dummy-weights --checkpoint /tmp/llama70b --tp-size 2 \
        --systems ours ours_fp8_online weight_read_floor --concurrency 1 16 64 256 --rounds 1 --new-tokens 128 \
        --server-timeout-s 300 --time-budget-s 480
      ;;
    moe)
      for setup in "tp2:--tp-size 2" "tp2_ep2:--tp-size 2 --server-args --ep-size=2"; do
        bench "moe_${setup%%:*}" 240 --preset qwen3-30b-a3b --dummy-weights --checkpoint /tmp/qwen3_30b \
          --systems ours weight_read_floor --concurrency 1 64 256 --rounds 1 --time-budget-s 200 ${setup#*:}
      done
      ;;
    *) echo "unknown phase $phase"; status=2 ;;
  esac
done
tar czf "$OUT/multi_gpu.tgz" -C "$WORK" --exclude='*.safetensors' .
echo "exit status $status"
exit $status
