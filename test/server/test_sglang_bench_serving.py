"""SGLang's own benchmark client, `python -m sglang.bench_serving --backend sglang`, against this
server on the embedded model: every request succeeds and it reports the output tokens it asked
for. It sends SGLang 0.5.23's /generate fields (lora_path, return_routed_experts,
logprob_start_len, ...) and reads the streamed chunks as SGLang's server sends them.

The client is the release from the registry (`pip install --no-deps sglang==0.5.23`) in a venv of
its own, cached under ~/.cache (or $SGLANG_TEST_CACHE) so a run pays for it once; the venv sees
this interpreter's packages (numpy, aiohttp, transformers, ...) through a .pth line, and the
release's GPU-runtime imports that bench_serving does not use are stubbed by
sglang_release_launcher.py. Skipped when the registry is unreachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SGLANG_RELEASE = "0.5.23"
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 16, 8
LAUNCHER = Path(__file__).resolve().parents[1] / "sglang_release_launcher.py"


def _site_packages(python: Path) -> str:
    return subprocess.check_output([str(python), "-c", "import site; print(site.getsitepackages()[0])"], text=True).strip()


@pytest.fixture(scope="session")
def sglang_release_python() -> Path:
    """The interpreter of a venv holding SGLang's release (made once, then reused), which sees this
    interpreter's packages (SGLang's dependencies) through a .pth file rewritten on every run: the
    cache outlives the checkout whose venv it first pointed at."""
    cache = Path(os.environ.get("SGLANG_TEST_CACHE", Path.home() / ".cache" / "sglang-test"))
    venv = cache / f"sglang-{SGLANG_RELEASE}-client"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", f"sglang=={SGLANG_RELEASE}"],
            capture_output=True, text=True, timeout=600,
        )
        if install.returncode != 0:
            pytest.skip(f"sglang=={SGLANG_RELEASE} could not be installed (registry unreachable?): {install.stderr[-500:]}")
        (venv / ".complete").write_text(SGLANG_RELEASE)
    Path(_site_packages(python), "zz_test_interpreter.pth").write_text(_site_packages(Path(sys.executable)) + "\n")
    return python


def _hf_tokenizer(gguf_path: str) -> str:
    """An HF tokenizer folder of the embedded GGUF (the client reads it with AutoTokenizer)."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer, hf_tokenizer_folder

    get_tokenizer(gguf_path)  # converts and caches the GGUF's tokenizer once
    return hf_tokenizer_folder(gguf_path)


def test_bench_serving_random_ids_reports_the_tokens_it_asked_for(
    smollm_server, gguf_path, sglang_release_python, tmp_path
) -> None:
    tokenizer = _hf_tokenizer(gguf_path)
    assert os.path.isdir(tokenizer)
    output = tmp_path / "bench.jsonl"
    argv = [
        str(sglang_release_python), str(LAUNCHER), "sglang.bench_serving",
        "--backend", "sglang", "--base-url", smollm_server.url, "--tokenizer", tokenizer,
        "--dataset-name", "random-ids", "--num-prompts", str(NUM_PROMPTS),
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1",
        "--output-file", str(output), "--seed", "1",
    ]
    # Run outside this repository, so that its own `sglang` package is not the one imported.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(output.read_text().strip().splitlines()[-1])
    assert result["completed"] == NUM_PROMPTS, run.stdout[-3000:]
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert result["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
