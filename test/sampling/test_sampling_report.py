"""The sampler's report of a draw (return_sampling_mask / sampling_logprobs_mode / return_entropy):
every returned support equals the set a plain-torch reference of the filters keeps (penalties, bias,
grammar mask, top-k, top-p, min-p), the behaviour logprobs are the scaled logprobs renormalised over
it, the entropy is the scaled softmax's, and asking changes no token of any row."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from sampling_utils import make_batch
from sglang.srt.layers.sampler import Sampler, SamplerInput
from sglang.srt.layers.sampling_report import ReportAsk, report_rows
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

V = 64
ALLOWED = [3, 4, 5, 7, 9, 11, 20, 33]
ASK = ReportAsk(support=True, support_logprobs=True, entropy=True)


class _Grammar:
    """Allows ALLOWED next tokens."""

    def is_terminated(self) -> bool:
        return False

    @classmethod
    def fill_vocab_masks(cls, grammars, bitmask: torch.Tensor, rows: list[int], parallel: bool) -> None:
        for row in rows:
            bitmask[row] = 0
            for t in ALLOWED:
                bitmask[row, t // 32] |= 1 << (t % 32)


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.7),
    SamplingParams(temperature=0.6, top_k=12, min_p=0.2),
    SamplingParams(temperature=1.0, top_p=0.9, top_k=40, sampling_seed=11),
    SamplingParams(temperature=0.9, top_p=0.95),  # does not ask
    SamplingParams(temperature=1.1, top_k=6, logit_bias={"2": 5.0, "8": -100.0}, presence_penalty=0.7),
    SamplingParams(temperature=0.7, top_p=0.9),  # grammar row
]


def reference_kept(scaled: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[V] bool: finite, within top-k (ties kept), top-p by the strictly-larger mass (on the full
    softmax), and min-p (p >= min_p * p_max, in logit space)."""
    keep = torch.isfinite(scaled)
    if p.top_k < V:
        keep &= scaled >= torch.sort(scaled, descending=True).values[p.top_k - 1]
    if p.top_p < 1.0:
        probs = torch.softmax(scaled, dim=-1).double()
        greater = (scaled.unsqueeze(0) > scaled.unsqueeze(1)).double()  # [i, j]: s_j > s_i
        keep &= greater @ probs < p.top_p
    if p.min_p > 0.0:
        keep &= scaled >= scaled.max() + math.log(p.min_p)
    return keep


def _batch(asks: list, gen: torch.Generator):
    batch = make_batch([copy.deepcopy(p) for p in PARAMS], prompts=[[1, 2, 3]] * len(PARAMS))
    for req, ask in zip(batch.reqs, asks):
        req.sampling_report = ask
    batch.reqs[6].output_ids.extend([9, 9])
    batch.reqs[7].grammar = _Grammar()
    info = SamplingBatchInfo.from_schedule_batch(batch, V)
    batch.sampling_info = info
    return batch, info


def _processed(logits: torch.Tensor, info: SamplingBatchInfo, batch) -> torch.Tensor:
    """The processed logits (penalties, bias, grammar mask) by the sampler's own first stages."""
    from sglang.srt.layers.sampler_stages import apply_penalties_bias_and_mask

    x = logits.clone()
    apply_penalties_bias_and_mask(x, info, batch.reqs)
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_support_logprobs_and_entropy_equal_the_torch_reference(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    asks = [ASK] * 5 + [None] + [ASK, ReportAsk(support=True)]
    batch, info = _batch(asks, gen)
    plain_batch, plain_info = _batch([None] * len(PARAMS), gen)
    asking, plain = Sampler(generator=torch.Generator().manual_seed(seed)), Sampler(generator=torch.Generator().manual_seed(seed))
    logits = torch.randn(len(PARAMS), V, generator=gen) * 2.5
    positions = torch.arange(len(PARAMS)) + 7
    processed = _processed(logits, info, batch)
    out = asking.sample_step(SamplerInput(logits.clone(), info, positions, batch.reqs))
    base = plain.sample_step(SamplerInput(logits.clone(), plain_info, positions, plain_batch.reqs))
    assert torch.equal(out.next_ids, base.next_ids)  # asking changes no token
    reports = report_rows(out.report, len(PARAMS))
    assert reports[5] is None and base.report is None
    for row, (p, ask, report) in enumerate(zip(PARAMS, asks, reports)):
        if ask is None:
            continue
        token = int(out.next_ids[row])
        if p.top_k <= 1:  # greedy: the argmax alone, logprob 0
            assert report.support == [token] and report.logprobs == [0.0]
            scaled = processed[row]
        else:
            scaled = processed[row] / p.temperature
            kept = reference_kept(scaled, p)
            assert set(report.support) == set(torch.nonzero(kept).flatten().tolist()), row
            assert token in report.support
            want = torch.log_softmax(scaled.masked_fill(~kept, float("-inf")), dim=-1)
            if ask.support_logprobs:
                assert torch.allclose(torch.tensor(report.logprobs), want[report.support], atol=1e-5)
                assert report.logprobs == sorted(report.logprobs, reverse=True)
            else:
                assert report.logprobs == pytest.approx(float(want[token]), abs=1e-5)
        if ask.entropy:
            probs = torch.softmax(scaled, dim=-1)
            want_entropy = float(-(probs * torch.log_softmax(scaled, dim=-1)).nan_to_num().sum())
            assert report.entropy == pytest.approx(want_entropy, abs=1e-4)
        else:
            assert report.entropy is None
    assert set(reports[7].support) <= set(ALLOWED)


def test_entropy_only_rows_return_no_support() -> None:
    gen = torch.Generator().manual_seed(5)
    asks = [ReportAsk(entropy=True)] + [None] * (len(PARAMS) - 1)
    batch, info = _batch(asks, gen)
    out = Sampler(generator=torch.Generator().manual_seed(1)).sample_step(
        SamplerInput(torch.randn(len(PARAMS), V, generator=gen), info, torch.arange(len(PARAMS)), batch.reqs)
    )
    report = report_rows(out.report, len(PARAMS))[0]
    assert report.support is None and report.logprobs is None and report.entropy >= 0.0


def test_no_report_asked_keeps_the_common_path() -> None:
    gen = torch.Generator().manual_seed(6)
    batch, info = _batch([None] * len(PARAMS), gen)
    out = Sampler(generator=torch.Generator().manual_seed(1)).sample_step(
        SamplerInput(torch.randn(len(PARAMS), V, generator=gen), info, torch.arange(len(PARAMS)), batch.reqs)
    )
    assert out.report is None and report_rows(out.report, len(PARAMS)) == [None] * len(PARAMS)
