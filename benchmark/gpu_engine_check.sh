#!/usr/bin/env bash
# The GPU engine's checks in one script (issue: CUDA-graph decode, paged attention kernels):
#   tests   - every Triton kernel against its torch reference natively, the CUDA sampler suite,
#             the graph runner's unit tests, then benchmark/gpu_engine_check.py (graphs on/off,
#             solo vs batched, deterministic mode with graphs, bf16 tolerance, decode step times,
#             the sampling step's share), then benchmark/gpu_sampling_graph_check.py (the server's
#             tokens with decode + sampling graphs equal its eager tokens)
#   cache   - the radix cache's unit tests, benchmark/gpu_prefix_cache_check.py (cached against
#             --disable-radix-cache through the server) and gpu_sampling_graph_check.py
#   grammar - structured outputs: the bitmask kernel against its reference and the CUDA sampler suite,
#             benchmark/gpu_grammar_check.py (grammar rows through the server: valid outputs, rows
#             independent, overlap on = off, llguidance, pytorch sampler, tok/s)
#   grammar-bench - benchmark/bench_grammar.py --device cuda (mask fill + apply per step at V=151936)
#   bench   - benchmark/bench_serving_gpu.py: ours vs HF generate (eager, static cache + compile)
#   window-softcap - sliding-window and soft-capping kernels against their references natively, then
#             benchmark/gpu_window_softcap_check.py (Gemma2, Gemma3, Mistral and Qwen2 with a window vs
#             transformers on CUDA, fp32 and bf16, default and deterministic, graphs on)
#   dp      - --dp-size 2, both replicas on GPU 0: benchmark/gpu_tp_check.py --tp-size 1 --dp-size 2 in bf16
#             (outputs against one replica), then bench_serving_gpu.py, ours at N=256 with --dp-size 1 and 2
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_engine_check.sh tests|cache      |      bash benchmark/gpu_engine_check.sh bench [bench args]
# Everything printed also goes to $OUT/gpu_engine_<phase>.txt (committed under docs/gpu/).
set -uo pipefail
phase=${1:?usage: gpu_engine_check.sh tests|cache|grammar|grammar-bench|bench|window-softcap|dp [args]}
shift
OUT=${OUT:-/tmp/gpu_engine_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_engine_$phase.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
git log -1 --format='commit %h %s' 2>/dev/null || true
case "$phase" in
  tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=5 \
      test/kernels/test_paged_attention.py test/kernels/test_fused_layer_kernels.py test/kernels/test_decode_attention.py \
      test/kernels/test_sgl_kernel_ext.py test/gpu/test_sampler_cuda.py test/sampling/test_hash.py test/sampling/test_penaltylib.py \
      test/kernels/test_cuda_graph_runner.py test/sampling/test_sampling_graph.py
    timeout 420 python3 benchmark/gpu_engine_check.py --out "$OUT" --tokenizer .carry_engine/tokenizer "$@"
    timeout 300 python3 benchmark/gpu_sampling_graph_check.py --out-dir "$OUT/sampling_graph"
    ;;
  cache)
    timeout 60 python3 -m pytest -q -p no:cacheprovider test/engine/test_radix_cache.py
    timeout 330 python3 benchmark/gpu_prefix_cache_check.py --out-dir "$OUT/prefix_cache"
    timeout 200 python3 benchmark/gpu_sampling_graph_check.py --out-dir "$OUT/sampling_graph"
    ;;
  grammar)
    timeout 200 python3 -m pytest -q -p no:cacheprovider test/grammar/test_structured_outputs_units.py \
      test/sampling/test_sampling_batch_info.py test/gpu/test_sampler_cuda.py test/sampling/test_sampling_graph.py
    timeout 480 python3 benchmark/gpu_grammar_check.py --tokenizer .carry_engine/tokenizer --out-dir "$OUT/grammar"
    ;;
  grammar-bench)
    timeout 540 python3 benchmark/bench_grammar.py --device cuda --vocab 151936 --out-dir "$OUT" "$@"
    ;;
  bench)
    timeout 560 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT" --tokenizer .carry_engine/tokenizer "$@"
    ;;
  window-softcap)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -k "window or cap" \
      test/kernels/test_paged_attention.py test/kernels/test_decode_attention.py
    timeout 480 python3 benchmark/gpu_window_softcap_check.py --out-dir "$OUT/window_softcap" "$@"
    ;;
  dp)
    timeout 240 python3 benchmark/gpu_tp_check.py --device cuda --tp-size 1 --dp-size 2 --dtype bfloat16 --out-dir "$OUT/dp_check"
    tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z')
    for dp in 1 2; do
      timeout 160 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT" --tokenizer .carry_engine/tokenizer --systems ours \
        --concurrency 256 --rounds 2 --dp-size "$dp" --server-args "--gpu-id-step 0" --time-budget-s 120 --tag "$tag-dp$dp" "$@"
    done
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
