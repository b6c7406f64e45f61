"""Sampler.sample_step: every logits stage of a step in the documented order, the same tokens as the
stages run by hand, the ids stored, and the graph-or-eager choice made once per batch composition."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from sampling_utils import make_batch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import GRAPH_STEP, Sampler, SamplerInput
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, register_custom_logit_processor
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors, LogitsProcessor
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

V = 16
ALLOWED = [3, 4, 5, 7, 9]
NEG = float("-inf")


class _Grammar:
    """Allows ALLOWED next tokens."""

    def is_terminated(self) -> bool:
        return False

    @classmethod
    def fill_vocab_masks(cls, grammars, bitmask: torch.Tensor, rows: list[int], parallel: bool) -> None:
        for row in rows:
            bitmask[row] = sum(1 << t for t in ALLOWED)


class _Double(LogitsProcessor):
    """A batch-level processor: doubles every logit of the batch."""

    def __init__(self, server_args, device, is_pin_memory) -> None:
        pass

    def update_state(self, batch_update) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.mul_(2.0)

    def is_argmax_invariant(self) -> bool:
        return False

    @classmethod
    def acts_on(cls, params: SamplingParams) -> bool:
        return True


class _AddHalf(CustomLogitProcessor):
    def __call__(self, logits: torch.Tensor, custom_param_list=None) -> torch.Tensor:
        return logits + 0.5


def _row_with_every_stage():
    """One greedy request that a penalty, a bias, a grammar, a batch processor and a custom
    processor all act on."""
    register_custom_logit_processor("test_add_half", _AddHalf)
    params = SamplingParams(temperature=0.0, frequency_penalty=0.5, repetition_penalty=2.0, logit_bias={"3": 1.5, "7": -2.0})
    batch = make_batch([params], prompts=[[3, 4]], processors=['{"name": "test_add_half"}'], enable_processors=True)
    req = batch.reqs[0]
    req.output_ids.extend([5, 5])
    req.grammar = _Grammar()
    batch.loaded_logits_processors = LoadedLogitsProcessors([_Double], SimpleNamespace(logits_processors=None), "cpu")
    info = SamplingBatchInfo.from_schedule_batch(batch, V)
    batch.sampling_info = info
    return batch, info


def _by_hand(base: torch.Tensor) -> torch.Tensor:
    x = base.clone()
    x[5] -= 0.5 * 2  # frequency: token 5 generated twice
    for t in (3, 4, 5):  # repetition: prompt and output tokens
        x[t] = x[t] / 2.0 if x[t] > 0 else x[t] * 2.0
    x[3] += 1.5  # logit_bias
    x[7] += -2.0
    masked = torch.full_like(x, NEG)
    masked[ALLOWED] = x[ALLOWED]  # grammar mask
    return masked * 2.0 + 0.5  # batch-level processor, then the custom processor


def test_every_stage_acts_in_the_documented_order():
    """penalties -> logit_bias -> grammar mask -> batch processors -> custom processors: each pair
    of neighbouring stages gives other logits in the other order (division vs addition, doubling vs
    adding), so only that order gives the logits computed by hand."""
    batch, info = _row_with_every_stage()
    base = torch.tensor([0.3, -1.0, 2.0, 1.0, -0.5, 0.8, 0.1, 1.9, -2.0, 0.4, 0.0, 0.2, -0.1, 0.6, 0.7, 1.2])
    logits = base.clone().unsqueeze(0)  # [1, V]
    store = torch.full((4,), -7, dtype=torch.int64)
    out = Sampler(device="cpu").sample_step(
        SamplerInput(logits, info, torch.tensor([2]), batch.reqs, token_store=(store, torch.tensor([1])))
    )
    want = _by_hand(base)
    assert torch.equal(logits[0], want)  # processed in place, greedy rows are never scaled
    assert out.next_ids.tolist() == [int(want.argmax())] and out.row_errors == {}
    assert store.tolist() == [-7, int(want.argmax()), -7, -7]
    assert out.logprobs is None and out.strategy == "cpu_grouped"


def test_sample_step_equals_the_stages_run_by_hand():
    """A mixed batch over several steps: sample_step's tokens, penalty state and logprobs equal
    apply_logits_bias + Sampler.forward + update_penalties."""
    params = [
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.1),
        SamplingParams(temperature=0.0, presence_penalty=0.4),
        SamplingParams(temperature=0.9, min_p=0.05, frequency_penalty=0.3, sampling_seed=5),
    ]
    prompts = [[1, 2, 3], [4, 5], [6]]
    mine, theirs = make_batch(params, prompts=prompts), make_batch(params, prompts=prompts)
    mine.reqs[2].logprob = LogprobRequest(top_logprobs_num=2)
    info_mine = SamplingBatchInfo.from_schedule_batch(mine, 64)
    info_theirs = SamplingBatchInfo.from_schedule_batch(theirs, 64)
    s_mine, s_theirs = Sampler(generator=torch.Generator().manual_seed(3)), Sampler(generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(9)
    for step in range(5):
        logits = torch.randn(3, 64, generator=gen) * 3.0
        positions = torch.arange(3) + 10 + step
        out = s_mine.sample_step(SamplerInput(logits.clone(), info_mine, positions, mine.reqs))
        lp = LogitsProcessorOutput(next_token_logits=logits.clone())
        info_theirs.apply_logits_bias(lp.next_token_logits)
        want = s_theirs(lp, info_theirs, True, [0, 0, 2], [None, None, None], positions)
        info_theirs.update_penalties(want)
        assert torch.equal(out.next_ids, want), step
        assert torch.equal(out.logprobs.next_token_logprobs, lp.next_token_logprobs)
        assert out.asks[2].top_logprobs_num == 2 and out.asks[0] is None
        for batch, ids in ((mine, out.next_ids), (theirs, want)):
            for req, token in zip(batch.reqs, ids.tolist()):
                req.output_ids.append(token)


class _Graph:
    """A GraphSampling that records its replays and samples token `token` (None: cannot)."""

    def __init__(self, token: Optional[int]) -> None:
        self.token, self.replays = token, 0

    def replay_sampling(self, info, bs, generator):
        self.replays += 1
        return None if self.token is None else torch.full((bs,), self.token, dtype=torch.int64)


def _graph_input(batch, info) -> SamplerInput:
    rows = len(batch.reqs)
    return SamplerInput(torch.zeros(rows, V), info, torch.zeros(rows, dtype=torch.int64), batch.reqs, graph_rows=rows)


def test_graph_or_eager_is_chosen_once_per_batch_composition():
    batch = make_batch([SamplingParams(temperature=0.0)] * 3)
    info = SamplingBatchInfo.from_schedule_batch(batch, V)
    sampler, graph = Sampler(device="cpu"), _Graph(token=6)
    sampler.attach_graph(graph)
    decisions = []
    decide = sampler.graph_step_applies
    sampler.graph_step_applies = lambda *args: decisions.append(args) or decide(*args)
    for _ in range(3):
        out = sampler.sample_step(_graph_input(batch, info))
        assert out.strategy == GRAPH_STEP and out.next_ids.tolist() == [6, 6, 6]
    assert len(decisions) == 1 and graph.replays == 3
    batch.reqs = batch.reqs[:2]
    info.filter_batch([0, 1])  # the composition changed: decided again
    assert sampler.sample_step(_graph_input(batch, info)).strategy == GRAPH_STEP
    assert len(decisions) == 2
    eager = sampler.sample_step(SamplerInput(torch.zeros(2, V), info, torch.zeros(2, dtype=torch.int64), batch.reqs))
    assert eager.strategy == "cpu_grouped" and len(decisions) == 2  # not a replayed decode: eager


def test_a_batch_the_graph_cannot_sample_runs_eagerly():
    batch = make_batch([SamplingParams(temperature=0.0)] * 2)
    batch.reqs[1].logprob = LogprobRequest()
    info = SamplingBatchInfo.from_schedule_batch(batch, V)
    sampler, graph = Sampler(device="cpu"), _Graph(token=6)
    sampler.attach_graph(graph)
    out = sampler.sample_step(_graph_input(batch, info))
    assert out.strategy == "cpu_grouped" and graph.replays == 0 and out.next_ids.tolist() == [0, 0]
    fallback = _Graph(token=None)  # e.g. a penalizer without a fused representation
    sampler = Sampler(device="cpu")
    sampler.attach_graph(fallback)
    plain = make_batch([SamplingParams(temperature=0.0)] * 2)
    out = sampler.sample_step(_graph_input(plain, SamplingBatchInfo.from_schedule_batch(plain, V)))
    assert out.strategy == "cpu_grouped" and fallback.replays == 1
