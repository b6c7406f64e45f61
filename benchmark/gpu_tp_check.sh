#!/usr/bin/env bash
# Tensor parallelism on two GPUs over NCCL (run through the device tool on nvidia-h200-x2):
# benchmark/gpu_tp_check.py serves a random-weight Qwen3-0.6B-shaped checkpoint at TP=1 and TP=2
# (overlap on and off) with the rank agreement check on, and compares greedy and seeded tokens.
# The machine lacks the server's HTTP/IPC packages: carry them as cp312 wheels in .carry_tp/whl
# (names and versions in docs/tp.md). Usage (repo root): bash benchmark/gpu_tp_check.sh [driver flags]
set -uo pipefail
OUT=${OUT:-/tmp/gpu_tp_check_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry_tp/whl/*.whl || exit 1
# NVLink multicast stays off on shared hosts.
export PYTHONPATH=/tmp/site:python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" 2>&1 | tee -a "$OUT/device.txt"
python3 benchmark/gpu_tp_check.py --device cuda --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/check.txt"
