"""The sampler on CUDA (skipped elsewhere; run by benchmark/gpu_check.sh): distributions for every
CUDA backend, seeded rows equal to the CPU's, and no host-device synchronisation in a step."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from sampling_utils import assert_matches_distribution, make_info, sample
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_params import SamplingParams
from test_sampler import BASE, CASES, DRAWS, _expected

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def _flashinfer_importable() -> bool:
    try:
        importlib.import_module("flashinfer.sampling")
    except ImportError:
        return False
    return True


BACKENDS = ["pytorch"] + (["flashinfer"] if _flashinfer_importable() else [])


def _logits(rows: int) -> torch.Tensor:
    return torch.tensor([BASE] * rows, dtype=torch.float32, device="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_distribution(backend, name):
    case = CASES[name]
    sampler = Sampler(backend, generator=torch.Generator(device="cuda").manual_seed(3))
    ids, _ = sample(sampler, _logits(DRAWS), [SamplingParams(**case) for _ in range(DRAWS)])
    assert_matches_distribution(ids, _expected(case))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_seeded_rows_equal_cpu(backend, name):
    case = CASES[name]
    n = 2000
    params = [SamplingParams(sampling_seed=s, **case) for s in range(n)]
    positions = torch.arange(n)
    on_cpu, _ = sample(Sampler("pytorch"), _logits(n).cpu(), params, positions=positions)
    on_gpu, _ = sample(Sampler(backend), _logits(n), params, positions=positions)
    assert torch.equal(on_cpu, on_gpu.cpu())


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_never_synchronises(backend):
    vocab = 151936
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
        SamplingParams(temperature=0.8, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.0, sampling_seed=7, top_k=20),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.2, repetition_penalty=1.1, min_new_tokens=4),
        SamplingParams(logit_bias={"11": 5.0}, top_k=10**6),
    ]
    info = make_info(params, vocab, device="cuda", prompts=[[1, 2, 3]] * len(params))
    sampler = Sampler(backend)
    logits = torch.randn(len(params), vocab, device="cuda")
    positions = torch.arange(len(params), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step_logits = logits.clone()
            info.apply_logits_bias(step_logits)
            out = LogitsProcessorOutput(next_token_logits=step_logits)
            ids = sampler(out, info, return_logprob=True, top_logprobs_nums=[2] * len(params), positions=positions)
            info.update_penalties(ids)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ids.shape == (len(params),) and not out.invalid_rows.any().item()
    assert np.all(ids.cpu().numpy() >= 0)
