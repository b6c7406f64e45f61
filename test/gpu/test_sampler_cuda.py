"""The sampler on CUDA (skipped elsewhere; run by benchmark/gpu_check.sh): distributions for every
CUDA backend, seeded rows equal to the CPU's, no host-device synchronisation in a step, and the
sampling reports (supports, behaviour logprobs, entropy) equal to the CPU's."""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import pytest
import torch

from sampling_utils import BASE, CASES, DRAWS, assert_matches_distribution, expected_distribution, make_info, sample
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.sampling_params import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
def _flashinfer_importable() -> bool:
    try:
        importlib.import_module("flashinfer.sampling")
    except ImportError:
        return False
    return True


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


BACKENDS = ["pytorch"] + (["flashinfer"] if _flashinfer_importable() else []) + (["triton"] if _triton_importable() else [])


def _logits(rows: int) -> torch.Tensor:
    return torch.tensor([BASE] * rows, dtype=torch.float32, device="cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_distribution(backend, name):
    case = CASES[name]
    sampler = Sampler(backend, generator=torch.Generator(device="cuda").manual_seed(3))
    ids, _ = sample(sampler, _logits(DRAWS), [SamplingParams(**case) for _ in range(DRAWS)])
    assert_matches_distribution(ids, expected_distribution(case))


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


@pytest.mark.skipif(not _triton_importable(), reason="needs triton")
def test_triton_step_replays_in_cuda_graph_with_new_seeds_and_params():
    """apply_logits_bias + Sampler.forward captured once; replays with new logits, seeds,
    temperatures, top_k / top_p / min_p written into the same tensors equal the CPU pytorch path."""
    vocab = 151936
    penalties = dict(frequency_penalty=0.4, presence_penalty=0.3, repetition_penalty=1.2, logit_bias={"5": 3.0})

    def params(step: int) -> list[SamplingParams]:
        return [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.7 + 0.1 * step, top_k=50 - step, top_p=0.9, sampling_seed=11 + step),
            SamplingParams(temperature=0.8, top_p=0.8 - 0.1 * step, min_p=0.05 * (step + 1), sampling_seed=7 * step),
            SamplingParams(temperature=1.0, top_k=20 + step, sampling_seed=3 + step, **penalties),
        ]

    prompts = [[1, 2, 3, 5]] * 4
    info = make_info(params(0), vocab, device="cuda", prompts=prompts)
    sampler = Sampler("triton")
    logits = torch.empty(4, vocab, device="cuda")  # [B, V] the graph's input
    positions = torch.zeros(4, dtype=torch.int64, device="cuda")

    def step() -> torch.Tensor:
        info.apply_logits_bias(logits)
        return sampler(LogitsProcessorOutput(next_token_logits=logits), info, positions=positions)

    logits.normal_()
    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids = step()
    for n in range(3):
        fresh = torch.randn(4, vocab, generator=torch.Generator().manual_seed(n)) * 3
        new = make_info(params(n), vocab, prompts=prompts)
        for name in ("temperatures", "top_ks", "top_ps", "min_ps", "sampling_seed"):
            getattr(info, name).copy_(getattr(new, name))
        logits.copy_(fresh)
        positions.fill_(100 + n)
        graph.replay()
        cpu_logits = fresh.clone()
        new.apply_logits_bias(cpu_logits)
        want, _ = sample(Sampler("pytorch"), cpu_logits, params(n), positions=torch.full((4,), 100 + n))
        assert torch.equal(ids.cpu(), want), n


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_report_on_cuda_holds_the_drawn_token_and_never_synchronises(backend):
    """Rows asking for their support / behaviour logprobs / entropy (return_sampling_mask,
    return_entropy) beside one that does not: the step runs without a host sync, every drawn token
    lies in its reported support, and the supports and logprobs equal the CPU's for the same logits."""
    from sampling_utils import make_batch
    from sglang.srt.layers.sampler import SamplerInput
    from sglang.srt.layers.sampling_report import ReportAsk, report_rows
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    vocab = 151936
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
        SamplingParams(temperature=0.8, top_k=64, min_p=0.05),
        SamplingParams(temperature=1.0, sampling_seed=7, top_k=20),
        SamplingParams(temperature=0.9, top_p=0.95),
    ]
    asks = [ReportAsk(True, True, True)] * 4 + [None]
    logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(3)) * 3.0

    def run(device: str, sync_check: bool):
        batch = make_batch(params, prompts=[[1, 2, 3]] * len(params), device=device)
        for req, ask in zip(batch.reqs, asks):
            req.sampling_report = ask
        info = SamplingBatchInfo.from_schedule_batch(batch, vocab)
        batch.sampling_info = info
        sampler = Sampler(backend if device == "cuda" else "pytorch", generator=torch.Generator(device).manual_seed(1))
        inp = SamplerInput(logits.clone().to(device), info, torch.arange(len(params), device=device), batch.reqs)
        if sync_check:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            out = sampler.sample_step(inp)
        finally:
            if sync_check:
                torch.cuda.set_sync_debug_mode(0)
        return out.next_ids.cpu().tolist(), report_rows(out.report, len(params))

    gpu_ids, gpu = run("cuda", True)
    _, cpu = run("cpu", False)
    assert gpu[4] is None
    for row in range(4):
        assert gpu_ids[row] in gpu[row].support
        assert set(gpu[row].support) == set(cpu[row].support), row
        want = dict(zip(cpu[row].support, cpu[row].logprobs))
        assert np.allclose(gpu[row].logprobs, [want[t] for t in gpu[row].support], atol=1e-4)
        assert abs(gpu[row].entropy - cpu[row].entropy) < 1e-3
