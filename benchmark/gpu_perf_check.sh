#!/usr/bin/env bash
# Issue 40 (GPU serving past parity) in one script, phases in the order given:
#   kernels   - the skinny-matmul, paged-attention and fused layer kernels against their references, natively
#   kernels-all - every kernel and sampling test natively (every kernel launches with PDL on Hopper)
#   gemv      - benchmark/bench_gemv.py: the library GEMM against gemv_triton on Qwen3-0.6B's and Qwen3-8B's linears
#   engine    - benchmark/gpu_engine_check.py: bf16 graphs vs eager, deterministic mode, decode step times
#   profile   - benchmark/gpu_decode_profile.py: the captured decode step kernel by kernel at bs 1 / 64
#               (launch gaps, time by kind), the linears alone against the copy bandwidth
#   profile-models - the same at bs 1 on dummy-weight Qwen3-30B-A3B (MoE), Qwen3-8B bf16 and Qwen3-8B online FP8
#   attention - benchmark/bench_attention.py: decode attention GB/s against the copy bandwidth, tile
#               sweep on three shapes, the default tile on the rest
#   host      - benchmark/gpu_profile_server.py at N=1: where the scheduler's host time goes
#   n1        - bench_serving_gpu.py, ours at N=1 (256 new tokens) and the weight-read floor
#   cliff     - bench_serving_gpu.py against one server with default flags: N=512 x 512, N=1024 x 256 and
#               N=256 x 2048 tokens; then N=1024 x 256 with --cuda-graph-max-bs 256 (chunked replay)
#   cliff-workers - N=512 x 512 and N=1024 x 256 with four tokenizer workers and two detokenizers
#   frontend-profile - that server at N=1024 x 256, py-spy over every server process (profile_processes.py)
#   anchor    - bench_serving_gpu.py, ours beside HF static cache + compile and the floor, N = 1, 64, 256
# Run through the device tool from the repo root with carry [".carry_engine"]:
#   bash benchmark/gpu_perf_check.sh profile attention n1
# Everything printed also goes to $OUT/gpu_perf.txt (committed under docs/gpu/).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_perf_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_perf.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:. PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log -1 --format='commit %h %s' 2>/dev/null || true
CKPT=/tmp/qwen3-0.6b-random
[ -f $CKPT/config.json ] || python3 -c "import sys; sys.path.insert(0, 'benchmark'); from random_checkpoint import \
write_qwen3_checkpoint; write_qwen3_checkpoint('$CKPT', '.carry_engine/tokenizer', device='cuda')"
for phase in "$@"; do
  echo "=== $phase ($(date -u +%H:%M:%S))"
  case "$phase" in
    kernels)
      timeout 300 python3 -m pytest -q -p no:cacheprovider test/kernels/test_gemv_triton.py \
        test/kernels/test_paged_attention.py test/kernels/test_fused_layer_kernels.py \
        test/kernels/test_cuda_graph_runner.py test/sampling/test_sampling_graph.py test/models/test_fused_norm_linear.py \
        test/kernels/test_pdl.py
      ;;
    kernels-all)
      timeout 420 python3 -m pytest -q -p no:cacheprovider -m "not e2e" test/kernels test/sampling
      ;;
    gemv)
      timeout 200 python3 benchmark/bench_gemv.py --out-dir "$OUT"
      timeout 200 python3 benchmark/bench_gemv.py --out-dir "$OUT" --tag qwen3_8b --rows 1 2 \
        --shapes 6144x4096 4096x4096 24576x4096:silu 4096x12288
      ;;
    engine)
      timeout 300 python3 benchmark/gpu_engine_check.py --out "$OUT" --checkpoint $CKPT --tokenizer .carry_engine/tokenizer \
        --checks bf16 deterministic timing
      ;;
    profile)
      timeout 300 python3 benchmark/gpu_decode_profile.py --out "$OUT" --checkpoint $CKPT \
        --tokenizer .carry_engine/tokenizer --bs 1 64
      ;;
    profile-models)
      for run in "qwen3-30b-a3b _moe" "qwen3-8b _8b" "qwen3-8b _8b_fp8 --quantization fp8"; do
        read -r preset tag extra <<< "$run"
        timeout 240 python3 benchmark/gpu_decode_profile.py --out "$OUT" --checkpoint /tmp/$preset-dummy \
          --tokenizer .carry_engine/tokenizer --bs 1 --preset $preset --linear-rows --tag $tag $extra
      done
      ;;
    attention)
      timeout 300 python3 benchmark/bench_attention.py --out-dir "$OUT" --sweep --shapes 1x4096 64x1024 256x2048
      timeout 120 python3 benchmark/bench_attention.py --out-dir "$OUT" --tag default \
        --shapes 1x256 16x1024 256x512 512x512 1024x256
      ;;
    host)
      timeout 200 python3 benchmark/gpu_profile_server.py --out-dir "$OUT/host" --tokenizer .carry_engine/tokenizer \
        --run off= --n 1 --seconds 10 --top 40
      ;;
    n1)
      timeout 300 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT/serving" --tokenizer .carry_engine/tokenizer \
        --checkpoint $CKPT --systems ours weight_read_floor --concurrency 1 --new-tokens 256 --rounds 2 --tag n1
      ;;
    cliff|cliff-workers|frontend-profile)
      # One server per flag set, every workload against it (--url). cliff: default flags (graphs up
      # to the max running requests), then --cuda-graph-max-bs 256 (batches above 256 replay in
      # chunks); cliff-workers: four HTTP/tokenizer workers and two detokenizer processes;
      # frontend-profile: that server at N=1024 x 256 for three rounds, with py-spy over the whole
      # server for 10 s of them (how busy each process is: benchmark/profile_processes.py).
      workers="--tokenizer-worker-num 4 --detokenizer-mode process --detokenizer-worker-num 2"
      if [ $phase = cliff ]; then sets=("" "--cuda-graph-max-bs 256"); else sets=("$workers"); fi
      for args in "${sets[@]}"; do
        port=$((30000 + RANDOM % 20000)) tag=$(echo "$args" | tr -dc 'a-z0-9' | cut -c1-24)
        python3 -m sglang.launch_server --model-path $CKPT --port $port --log-level info $args \
          > "$OUT/server_${phase}_$tag.log" 2>&1 &
        pid=$!
        for _ in $(seq 600); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
        grep -h "CUDA graphs" "$OUT/server_${phase}_$tag.log"
        workloads="512x512 1024x256" rounds=1
        [ "$phase" = cliff ] && { [ -n "$args" ] && workloads="1024x256" || workloads="512x512 1024x256 256x2048"; }
        if [ "$phase" = frontend-profile ]; then
          workloads="1024x256" rounds=3
          (sleep 20; py-spy record --pid $pid --subprocesses --duration 10 --rate 100 --format raw --nonblocking \
            --output "$OUT/frontend_profile.collapsed" > /dev/null) &
          spy=$!
        fi
        for w in $workloads; do
          timeout 300 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT/serving" --url http://127.0.0.1:$port \
            --checkpoint $CKPT --systems ours --concurrency ${w%x*} --new-tokens ${w#*x} --rounds $rounds --client-procs 16 \
            --tag "${phase}_${tag}_$w"
        done
        if [ "$phase" = frontend-profile ]; then
          wait $spy
          python3 benchmark/profile_processes.py "$OUT/frontend_profile.collapsed" --seconds 10 --rate 100
        fi
        kill $pid; wait $pid
      done
      ;;
    anchor)
      timeout 300 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT/serving" --tokenizer .carry_engine/tokenizer \
        --checkpoint $CKPT --systems ours hf_static_compiled weight_read_floor --concurrency 1 64 256 \
        --new-tokens 256 --rounds 1 --time-budget-s 250 --tag anchor
      ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
