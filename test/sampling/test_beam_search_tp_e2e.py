"""Beam search across server configurations: TP=2 (overlap schedule on) returns the beams of
TP=1 with the overlap schedule off, and both equal the reference beam search over
transformers' logits; a mixed batch (beams, a penalised beam, sampled rows) included."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from beam_reference import beam_search, hf_step
from engine_utils import generate
from family_utils import prompts, save_tiny, serving
from reliability_utils import wait_idle

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
SCORE_ATOL = 1e-4
REQUESTS = [
    {"beam_width": 3, "n": 3, "max_new_tokens": 6, "ignore_eos": True},
    {"beam_width": 2, "n": 2, "max_new_tokens": 5, "ignore_eos": True, "presence_penalty": 1.0},
    {"temperature": 1.0, "sampling_seed": 11, "max_new_tokens": 6, "ignore_eos": True},
    {"beam_width": 4, "n": 4, "max_new_tokens": 4, "ignore_eos": True},
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("llama"))
    return folder, save_tiny(folder, "LlamaConfig", "LlamaForCausalLM", **SHAPE)


def run_all(folder: str, gguf_path: str, *flags: str) -> list[dict]:
    with serving(folder, gguf_path, *flags) as server:
        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            responses = list(pool.map(
                lambda i: generate(server, prompts(len(REQUESTS))[i], sampling_params=REQUESTS[i]), range(len(REQUESTS))
            ))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        wait_idle(server)
        return [r.json() for r in responses]


def beams(result: dict) -> list[list[int]]:
    return [b["output_ids"] for b in result["meta_info"].get("beam_results", [])] or [result["output_ids"]]


def scores(result: dict) -> torch.Tensor:
    return torch.tensor([b["meta_info"]["sequence_score"] for b in result["meta_info"].get("beam_results", [])],
                        dtype=torch.float64)


def test_tp2_overlap_equals_tp1_without_overlap_and_the_reference(checkpoint, gguf_path: str) -> None:
    folder, model = checkpoint
    tp1 = run_all(folder, gguf_path, "--disable-overlap-schedule")
    tp2 = run_all(folder, gguf_path, "--tp-size", "2")
    for a, b in zip(tp1, tp2):
        assert beams(a) == beams(b)
        torch.testing.assert_close(scores(b), scores(a), atol=SCORE_ATOL, rtol=0)
    for i in (0, 3):
        params = REQUESTS[i]
        expected = beam_search(hf_step(model, prompts(len(REQUESTS))[i]), width=params["beam_width"],
                               max_new_tokens=params["max_new_tokens"], stop_ids=set())
        assert beams(tp1[i]) == [ids for ids, _, _ in expected]
