"""Shared by the scaling tests (data parallel, multi-node, sglang-router): a tiny random Qwen3 with
SmolLM2's vocabulary, so text prompts, completions and chat all work and a step costs little."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
import transformers

from sglang.test.server_process import ServerProcess

EXIT_WAIT_S = 30
TINY_FULL_VOCAB = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, tie_word_embeddings=True,
)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", "1, 2, 3, 4,"]


def save_tiny_full_vocab(folder: str) -> None:
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY_FULL_VOCAB)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # default init leaves norms at 1 and logits flat
    model.save_pretrained(folder, safe_serialization=True)


def model_flags(model_path: str, tokenizer_path: str) -> list[str]:
    # --enable-watermark: test_tp's comparable requests include a watermarked row.
    return ["--model-path", model_path, "--tokenizer-path", tokenizer_path, "--max-running-requests", "16",
            "--max-total-tokens", "16384", "--enable-watermark"]


def wait_exit(server: ServerProcess, seconds: float = EXIT_WAIT_S) -> int:
    """The process's exit code; it must exit on its own within `seconds`."""
    try:
        server.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {seconds:.0f} s later:\n{server.output}")
    server.stop()  # collects the rest of its output
    return server.proc.returncode


def scheduler_pid(server: ServerProcess, label: str) -> int:
    """The pid a scheduler logged, by its log prefix ('0', 'dp1 tp0', ...)."""
    return int(re.search(rf"\[scheduler {label}\] INFO TP rank \d+ of \d+: pid (\d+)", server.output).group(1))
