#!/usr/bin/env bash
# Speculative decoding (issue 36) on CUDA, CUDA graphs on, in two stages (each fits one device call):
#   check      benchmark/gpu_spec_check.py: spec off against NGRAM, STANDALONE with a self-draft and
#              with a 2-layer draft, token for token on greedy, penalised, seeded and
#              min_new_tokens/logit_bias rows (float32 Qwen3-0.6B-shaped random checkpoint).
#              Exit status 1 on a difference.
#   check-tp2  the same at --tp-size 2 (STANDALONE self-draft, NGRAM; two GPUs, NCCL) against spec
#              off at TP=1, with the rank agreement check on.
#   check-tp2-bisect  what separated the NGRAM failure at TP=2 (docs/speculative.md, "Fixed"):
#              NGRAM at TP=1 with graphs off (eager sampling, as TP=2 samples), also without the
#              overlap schedule; at TP=2 with the overlap schedule off, as in check-tp2, and without
#              the agreement check (the sampling graphs then run; two GPUs).
#   bench  benchmark/bench_speculative.py --gpu: tok/s and acceptance of spec off, STANDALONE
#          (self-draft, 2-layer draft) and NGRAM at N = 1, 16, 64; records in $OUT/spec/gpu.json.
#   profile  benchmark/gpu_profile_server.py: py-spy over the scheduler process at N=1, spec off
#          and NGRAM on one repeated token (every draft accepted); summaries in the output.
# Run through the device tool from the repo root with carry [".carry_engine"] (benchmark/make_engine_carry.sh):
#   bash benchmark/gpu_spec_check.sh check
#   bash benchmark/gpu_spec_check.sh check-tp2  (kind nvidia-h200-x2)
#   bash benchmark/gpu_spec_check.sh bench
# Everything printed also goes to $OUT/gpu_spec_<stage>.txt.
set -uo pipefail
STAGE=${1:-check}
OUT=${OUT:-/tmp/gpu_spec_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_spec_$STAGE.txt") 2>&1
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:python:test:.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
case "$STAGE" in
  check)
    timeout 570 python3 benchmark/gpu_spec_check.py --out-dir "$OUT/spec_check" \
      --runs ngram standalone_self standalone_2layer
    ;;
  check-tp2)
    timeout 570 python3 benchmark/gpu_spec_check.py --out-dir "$OUT/spec_check_tp2" --runs standalone_self_tp2 ngram_tp2
    ;;
  check-tp2-bisect)
    timeout 570 python3 benchmark/gpu_spec_check.py --out-dir "$OUT/spec_check_tp2_bisect" \
      --runs ngram_eager ngram_eager_no_overlap ngram_tp2_no_overlap ngram_tp2 ngram_tp2_unchecked
    ;;
  bench)
    timeout 570 python3 benchmark/bench_speculative.py --gpu --tokenizer .carry_engine/tokenizer --out-dir "$OUT/spec"
    ;;
  profile)
    PATH=/tmp/site/bin:$PATH timeout 570 python3 benchmark/gpu_profile_server.py --out-dir "$OUT/profile" \
      --tokenizer .carry_engine/tokenizer --bias constant --top 30 --run off= \
      --run ngram="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"
    ;;
  *)
    echo "unknown stage $STAGE: check, check-tp2, check-tp2-bisect, bench or profile" >&2
    exit 2
    ;;
esac
