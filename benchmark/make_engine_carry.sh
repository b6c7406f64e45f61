#!/usr/bin/env bash
# Build .carry_engine/: what the server needs on the GPU machines beyond their image (which has
# torch, transformers, tokenizers, safetensors, numpy, jinja2, anyio, h11, click but no registry):
# cp312 manylinux wheels of the server's other dependencies (the grammar backends, and fla-core's
# Gated DeltaNet kernels, among them), and the embedded model's tokenizer files (for random-weight
# checkpoints). Run here, in the repo root, with the project venv made.
set -euo pipefail
DEST=.carry_engine
mkdir -p .git/info "$DEST/whl"
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DEST/whl" \
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing_extensions==4.16.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 \
  pyzmq==27.3.0 msgspec==0.22.0 orjson==3.13.0 dill==0.4.1 \
  xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 llguidance==1.9.1 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 \
  prometheus-client==0.26.0 fla-core==0.6.0 einops==0.8.2 py-spy==0.4.3
.venv/bin/python - <<PY
from sglang.srt.utils.embedded_model import embedded_model_path
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
get_tokenizer(embedded_model_path()).save_pretrained("$DEST/tokenizer")
PY
du -sh "$DEST"
