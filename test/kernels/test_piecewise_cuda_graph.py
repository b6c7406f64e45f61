"""Piecewise CUDA graphs for extend steps: token-count choice, padding, and the attention split
hook (CPU: the logic; the capture and replay are checked on a GPU by benchmark/gpu_engine_check.py,
graphs vs eager token for token)."""

from __future__ import annotations

import pytest
import torch

from runner_utils import Driver
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.piecewise_cuda_graph_runner import (
    TokenInputBuffers,
    capture_token_counts,
    padded_token_count,
)


def test_default_token_counts_follow_the_grid_up_to_max() -> None:
    counts = capture_token_counts(8192)
    assert counts[:3] == [16, 32, 48] and counts[-1] == 8192 and len(counts) == len(set(counts))
    steps = {b - a for a, b in zip(counts, counts[1:])}
    assert steps == {16, 64, 256, 512}
    # Past 256 tokens the padding of a step is at most one grid step: under 25% there, ~12% past 512.
    assert all((b - a) / b <= 0.25 for a, b in zip(counts, counts[1:]) if a >= 256)
    assert capture_token_counts(100)[-1] == 100 and capture_token_counts(5) == [5]


def test_explicit_token_counts_sorted_and_validated() -> None:
    assert capture_token_counts(4096, [64, 8, 64]) == [8, 64]
    with pytest.raises(ValueError, match="piecewise-cuda-graph-tokens"):
        capture_token_counts(4096, [0])
    with pytest.raises(ValueError, match="piecewise-cuda-graph-max-tokens"):
        capture_token_counts(0)


@pytest.mark.parametrize("n,want", [(1, 16), (16, 16), (17, 32), (257, 320), (4097, 4608), (8193, None)])
def test_padded_token_count_is_smallest_that_fits(n: int, want) -> None:
    assert padded_token_count(n, capture_token_counts(8192)) == want


def test_token_buffers_pad_with_position_zero_and_the_padding_slot() -> None:
    buffers = TokenInputBuffers(8, pad_write_slot=99, device=torch.device("cpu"))
    big = ForwardBatch.init_new(ForwardMode.EXTEND, [5] * 6, [0, 1], [0, 2], [4, 2], torch.arange(10, 16), "cpu")
    buffers.load(big, 8)
    small = ForwardBatch.init_new(ForwardMode.EXTEND, [7, 8, 9], [3], [4], [3], torch.tensor([20, 21, 22]), "cpu")
    buffers.load(small, 4)  # rows [3, 4) held the larger step's values
    assert buffers.input_ids[:3].tolist() == [7, 8, 9]
    assert buffers.positions[:4].tolist() == [4, 5, 6, 0]
    assert buffers.out_cache_loc[:4].tolist() == [20, 21, 22, 99]


def test_split_forward_equals_plain_forward(gguf_path: str) -> None:
    """The attention split hook: a forward whose attention calls go through attention_split (here
    running the real attention, as a replay does between pieces) gives the plain forward's logits."""
    runner = ModelRunner(gguf_path, max_total_tokens=256, max_running_requests=4)
    driver = Driver(runner)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    plain = driver.extend([driver.new_req(), driver.new_req()], prompts).next_token_logits

    calls = []

    def split(layer, q):
        calls.append(layer.layer_id)
        return batch.attn_backend.forward(q, layer, batch)

    split_driver = Driver(runner)
    reqs = [split_driver.new_req(), split_driver.new_req()]
    batch = split_driver.forward_batch(reqs, prompts)
    batch.attention_split = split
    got = runner.forward(batch).next_token_logits
    assert calls == list(range(runner.model_config.num_hidden_layers))
    assert torch.equal(got, plain)
