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
#   deepseek - DeepSeek-V3 (MLA, YaRN, MoE) in bf16 against float32 transformers: the MLA unit tests and
#             the MLA Triton kernels natively (decode kernel, wide-head extend, the tiny model through the
#             Triton backend), benchmark/bench_mla_decode.py (the MLA decode kernel at V3's shape: us and
#             latent-cache GB/s), then benchmark/gpu_deepseek_v3_check.py (decode/piecewise graphs on/off,
#             deterministic, each mode's per-step difference to eager, a V3-attention-shaped case)
#   fp8     - FP8 weights: test/kernels/test_fp8_gemm.py natively, then benchmark/gpu_fp8_check.py (kernels vs
#             reference and timed at Qwen3-8B's shapes, the GEMM rule's threshold; a Qwen3-8B-shaped block-FP8
#             checkpoint and --quantization fp8 against the dequantised bf16 twin)
#   fp8-bench - bench_serving_gpu.py on the Qwen3-8B-shaped twins: ours bf16 / FP8 checkpoint / --quantization fp8 at
#             N = 1, 64, 256, the weight-read floor and HF static + compile (reuses fp8's folders when still there)
#   window-softcap - sliding-window and soft-capping kernels against their references natively, then
#             benchmark/gpu_window_softcap_check.py (Gemma2, Gemma3, Mistral and Qwen2 with a window vs
#             transformers on CUDA, fp32 and bf16, default and deterministic, graphs on)
#   dp      - --dp-size 2, both replicas on GPU 0: benchmark/gpu_tp_check.py --tp-size 1 --dp-size 2 in bf16
#             (outputs against one replica), then bench_serving_gpu.py, ours at N=256 with --dp-size 1 and 2
#   sweep   - the FP8 GEMM and MoE kernels' tests natively, then benchmark/gpu_kernel_sweep.py (tile
#             sweeps on Qwen3-8B's linears and Qwen3-30B-A3B's experts, the MoE block's kernel profile)
#   dense   - benchmark/gpu_dense_families_check.py: Mistral, Phi-3 (LongRoPE, partial rotary), OLMo 2,
#             GLM-4 and a dynamic-RoPE Llama in bf16 on the GPU against transformers in bf16
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_engine_check.sh tests|cache      |      bash benchmark/gpu_engine_check.sh bench [bench args]
# Everything printed also goes to $OUT/gpu_engine_<phase>.txt (committed under docs/gpu/).
set -uo pipefail
phase=${1:?usage: gpu_engine_check.sh tests|cache|grammar|grammar-bench|bench|fp8|fp8-bench|sweep|window-softcap|dp|deepseek|dense [args]}
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
  fp8)
    timeout 120 python3 -m pytest -q -p no:cacheprovider test/kernels/test_fp8_gemm.py
    timeout 460 python3 benchmark/gpu_fp8_check.py --out "$OUT/fp8" --tokenizer .carry_engine/tokenizer "$@"
    ;;
  fp8-bench)
    timeout 580 python3 benchmark/bench_serving_gpu.py --out-dir "$OUT" --tokenizer .carry_engine/tokenizer \
      --preset qwen3-8b --checkpoint /tmp/qwen3-8b-bf16 --concurrency 1 64 256 --time-budget-s 500 --tag h100_fp8 \
      --systems ours ours_fp8 ours_fp8_online weight_read_floor hf_static_compiled "$@"
    ;;
  sweep)
    timeout 200 python3 -m pytest -q -p no:cacheprovider test/kernels/test_fp8_gemm.py test/kernels/test_fused_moe_triton.py \
      test/kernels/test_topk_softmax_triton.py test/models/test_moe_layer.py
    timeout 540 python3 benchmark/gpu_kernel_sweep.py --out "$OUT/sweep" "$@"
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
  deepseek)
    timeout 120 python3 -m pytest -q -p no:cacheprovider test/models/test_mla_units.py test/models/test_rope_yarn.py \
      test/kernels/test_mla_decode.py test/kernels/test_mla_triton_paths.py
    timeout 90 python3 benchmark/bench_mla_decode.py --out "$OUT/mla_decode"
    timeout 360 python3 benchmark/gpu_deepseek_v3_check.py --out "$OUT/deepseek_v3" "$@"
    ;;
  dense)
    timeout 540 python3 benchmark/gpu_dense_families_check.py --out-dir "$OUT/dense_families" "$@"
    ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
