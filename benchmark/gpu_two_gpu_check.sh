#!/usr/bin/env bash
# Two-GPU runs in one script (run through the device tool on nvidia-h200-x2, carry [".carry_engine"],
# made by benchmark/make_engine_carry.sh):
#   check - TP=2 with CUDA graphs against TP=1 with graphs (benchmark/gpu_tp_check.py): greedy and
#           seeded+penalised tokens equal in float32, logprobs within tolerance in bfloat16; then
#           the deterministic mode's single / mixed / prefix checks served at TP=2
#   bench - benchmark/bench_serving_gpu.py (ours) at N = 1, 64, 256 for TP=1, TP=2 and --dp-size 2
#           on the bf16 Qwen3-0.6B-shaped checkpoint, one server after the other on the same machine
#           (records carry "device", "tp" and "dp"), then benchmark/gpu_allreduce_latency.py: what the
#           two all-reduces per layer cost a TP=2 decode step
#   allreduce - the one-shot all-reduce (custom_all_reduce.py): test/gpu/test_custom_all_reduce.py, its
#           latency beside NCCL's in a CUDA graph, TP=2 against TP=1 in float32 (graphs on), then
#           bench_serving_gpu.py at N = 1 for TP=1, TP=2 and TP=2 --disable-custom-all-reduce
# Usage (repo root): bash benchmark/gpu_two_gpu_check.sh check|bench|allreduce
# Everything printed also goes to $OUT/two_gpu_<phase>.txt (committed under docs/gpu/); result files and
# server logs come back packed in $OUT/two_gpu_<phase>.tgz (the device tool returns at most 8 files).
set -uo pipefail
phase=${1:?usage: gpu_two_gpu_check.sh check|bench|allreduce}
OUT=${OUT:-/tmp/gpu_two_gpu_out}
WORK=/tmp/two_gpu_$phase
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/two_gpu_$phase.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
# NVLink multicast stays off on shared hosts.
export PYTHONPATH=/tmp/site:python:test:. PYTHONUNBUFFERED=1 TQDM_DISABLE=1 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
git log -1 --format='commit %h %s' 2>/dev/null || true
status=0
case "$phase" in
  check)
    echo "== TP=2 vs TP=1, float32, CUDA graphs on"
    timeout 200 python3 benchmark/gpu_tp_check.py --device cuda --dtype float32 --out-dir "$WORK/tp_fp32" || status=1
    echo "== TP=2 vs TP=1, bfloat16 logprobs"
    timeout 160 python3 benchmark/gpu_tp_check.py --device cuda --dtype bfloat16 --out-dir "$WORK/tp_bf16" || status=1
    echo "== deterministic mode at TP=2"
    timeout 200 python3 benchmark/gpu_deterministic_check.py --tp-size 2 --out "$WORK/deterministic_tp2" \
      --tokenizer .carry_engine/tokenizer || status=1
    ;;
  bench)
    for setup in "tp1:--tp-size 1" "tp2:--tp-size 2" "dp2:--dp-size 2"; do
      tag=${setup%%:*}
      echo "== $tag (${setup#*:})"
      timeout 170 python3 benchmark/bench_serving_gpu.py --systems ours --concurrency 1 64 256 --rounds 3 \
        --new-tokens 256 --client-procs 16 \
        --tokenizer .carry_engine/tokenizer --out-dir "$WORK" --tag "two_gpu_$tag" --time-budget-s 120 ${setup#*:} || status=1
    done
    timeout 120 python3 benchmark/gpu_allreduce_latency.py --hidden 1024 --layers 28 --out "$WORK/allreduce.json" || status=1
    ;;
  allreduce)
    timeout 150 python3 -m pytest -q -x test/gpu/test_custom_all_reduce.py || status=1
    timeout 120 python3 benchmark/gpu_allreduce_latency.py --hidden 1024 --layers 28 --rows 1 64 256 \
      --out "$WORK/allreduce.json" || status=1
    timeout 200 python3 benchmark/gpu_tp_check.py --device cuda --dtype float32 --out-dir "$WORK/tp_fp32" || status=1
    for setup in "tp1:--tp-size 1" "tp2:--tp-size 2" "tp2_nccl:--tp-size 2 --server-args=--disable-custom-all-reduce"; do
      tag=${setup%%:*}
      echo "== $tag (${setup#*:})"
      timeout 120 python3 benchmark/bench_serving_gpu.py --systems ours --concurrency 1 --rounds 3 --new-tokens 256 \
        --tokenizer .carry_engine/tokenizer --out-dir "$WORK" --tag "two_gpu_$tag" --time-budget-s 80 ${setup#*:} || status=1
      grep -E "^ours N=1" "$WORK/serving_gpu_two_gpu_$tag.md" 2>/dev/null
    done
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
tar czf "$OUT/two_gpu_$phase.tgz" -C "$WORK" .
echo "exit status $status"
exit $status
