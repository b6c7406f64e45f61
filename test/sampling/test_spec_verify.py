"""Sampler.verify_step against decoding: over a toy model whose logits are a function of the
token history, verifying drafts gives the very tokens and logprobs that decoding one token at a
time gives, for every sampling knob, and unseeded draws keep the target's distribution."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sampling_utils import make_batch
from sglang.srt.layers.sampler import Sampler, SamplerInput
from sglang.srt.layers.sampler_verify import VerifyInput
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, register_custom_logit_processor
from sglang.srt.sampling.logits_processor import BUILT_IN_LOGITS_PROCESSORS, LoadedLogitsProcessors
from sglang.srt.sampling.penaltylib import BatchedPenalizerOrchestrator
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

V = 24
PROMPT = [3, 1, 4, 1, 5]
STEPS = 12


def toy_logits(history: list[int]) -> torch.Tensor:
    """[V] float32: a fixed function of the last two tokens (distinct histories, distinct rows)."""
    key = (history[-1] * 131 + (history[-2] if len(history) > 1 else 7) * 17) % 100_003
    return torch.randn(V, generator=torch.Generator().manual_seed(key)) * 2.5


class _Parity:
    """A grammar: after an even token only odd ones, after an odd token anything but 0."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def _allowed(self) -> list[int]:
        if self.tokens and self.tokens[-1] % 2 == 0:
            return [t for t in range(V) if t % 2 == 1]
        return list(range(1, V))

    def accept_token(self, token: int) -> bool:
        if token not in self._allowed():
            return False
        self.tokens.append(token)
        return True

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n :]

    def is_terminated(self) -> bool:
        return False

    @classmethod
    def fill_vocab_masks(cls, grammars, bitmask: torch.Tensor, rows: list[int], parallel: bool) -> None:
        for grammar, row in zip(grammars, rows):
            bits = sum(1 << t for t in grammar._allowed())
            bitmask[row, 0] = bits - (1 << 32) if bits >= 1 << 31 else bits


class _BanLast(CustomLogitProcessor):
    """Reads the request's host history: bans its last output token."""

    def __call__(self, logits: torch.Tensor, custom_param_list=None) -> torch.Tensor:
        for row, params in enumerate(custom_param_list):
            logits[row, params["__req__"].output_ids[-1]] = float("-inf")
        return logits


KNOBS = {
    "greedy": dict(temperature=0.0),
    "penalties": dict(temperature=0.0, frequency_penalty=0.7, presence_penalty=0.4, repetition_penalty=1.3),
    "seeded_penalties": dict(temperature=0.9, frequency_penalty=0.5, repetition_penalty=1.2, sampling_seed=11),
    "logit_bias": dict(temperature=0.8, logit_bias={"2": 3.0, "5": -4.0}, sampling_seed=3),
    "min_new_tokens": dict(temperature=0.7, min_new_tokens=9, stop_token_ids=[4, 6], sampling_seed=8),
    "top_k_top_p_min_p": dict(temperature=1.2, top_k=6, top_p=0.85, min_p=0.05, sampling_seed=21),
    "grammar": dict(temperature=1.0, sampling_seed=4),
    "custom_processor": dict(temperature=1.0, sampling_seed=9, custom_params={}),
    # Batch-level processors: an incremental n-gram index (state that drafts must not leave
    # behind) and a stateless allow-list.
    "no_repeat_ngram": dict(temperature=0.0, no_repeat_ngram_size=1),
    "no_repeat_ngram_seeded": dict(temperature=1.0, no_repeat_ngram_size=2, sampling_seed=13),
    "allowed_token_ids": dict(temperature=1.0, allowed_token_ids=list(range(1, V, 3)), sampling_seed=6),
}
BUILT_INS = LoadedLogitsProcessors(BUILT_IN_LOGITS_PROCESSORS, SimpleNamespace(logits_processors=None,
                                                                              skip_tokenizer_init=True), "cpu")


def _batch(knobs: list[str], logprobs: bool = True):
    register_custom_logit_processor("test_ban_last", _BanLast)
    params = [SamplingParams(**KNOBS[k]) for k in knobs]
    processors = ['{"name": "test_ban_last"}' if k == "custom_processor" else None for k in knobs]
    batch = make_batch(params, prompts=[PROMPT] * len(knobs), processors=processors, enable_processors=True)
    batch.loaded_logits_processors = BUILT_INS
    for k, req in zip(knobs, batch.reqs):
        req.logprob = LogprobRequest(top_logprobs_num=3) if logprobs else None
        if k == "grammar":
            req.grammar = _Parity()
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, V)
    return batch


def _append(req, token: int) -> None:
    if req.grammar is not None:
        assert req.grammar.accept_token(token)
    req.output_ids.append(token)


def _decode(knobs: list[str], steps: int, logprobs_on: bool = True):
    """The reference: one sample_step per token; (tokens, logprobs) per request."""
    batch = _batch(knobs, logprobs_on)
    sampler = Sampler(generator=torch.Generator().manual_seed(0))
    logprobs = [[] for _ in knobs]
    for _ in range(steps):
        reqs = batch.reqs
        logits = torch.stack([toy_logits(r.origin_input_ids + r.output_ids) for r in reqs])
        positions = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs])
        out = sampler.sample_step(SamplerInput(logits, batch.sampling_info, positions, reqs))
        for i, (req, token) in enumerate(zip(reqs, out.next_ids.tolist())):
            _append(req, token)
            if logprobs_on:
                logprobs[i].append((out.logprobs.next_token_logprobs[i].item(), out.logprobs.next_token_top_logprobs_idx[i].tolist()))
    return [r.output_ids for r in batch.reqs], logprobs


def _speculate(knobs: list[str], steps: int, draft_for, logprobs_on: bool = True):
    """Verify steps whose drafts come from `draft_for(row, req)`, until every request has `steps` tokens."""
    batch = _batch(knobs, logprobs_on)
    sampler = Sampler(generator=torch.Generator().manual_seed(0))
    logprobs = [[] for _ in knobs]
    while min(len(r.output_ids) for r in batch.reqs) < steps:
        reqs = batch.reqs
        drafts = [draft_for(i, r) for i, r in enumerate(reqs)]
        rows, starts = [], []
        for req, d in zip(reqs, drafts):
            starts.append(len(rows))
            history = req.origin_input_ids + req.output_ids
            rows += [toy_logits(history + d[:j]) for j in range(len(d) + 1)]
        positions = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs])
        asks = [r.logprob for r in reqs]
        out = sampler.verify_step(VerifyInput(torch.stack(rows), batch.sampling_info, reqs, drafts, starts, positions, asks))
        for i, (req, tokens) in enumerate(zip(reqs, out.tokens)):
            assert tokens[: out.accepted[i]] == drafts[i][: out.accepted[i]]
            for j, token in enumerate(tokens):
                _append(req, token)
                lp = out.position_logprobs[j]
                if lp is not None:
                    logprobs[i].append((lp.next_token_logprobs[i].item(), lp.next_token_top_logprobs_idx[i].tolist()))
        # The scheduler's rebuild of the penalty state from the host history after a verify.
        if batch.sampling_info.penalizer_orchestrator is not None:
            batch.sampling_info.penalizer_orchestrator = BatchedPenalizerOrchestrator(V, batch)
    return [r.output_ids[:steps] for r in batch.reqs], [lp[:steps] for lp in logprobs]


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_verify_equals_decode_for_every_knob(knob):
    """Drafts from the reference itself (accepted), with wrong tokens spliced in (rejected) and
    varying lengths: the same tokens and logprobs as decoding, bit for bit."""
    knobs = [knob, "greedy", "seeded_penalties"]
    want_tokens, want_lp = _decode(knobs, STEPS + 6)
    rng = np.random.default_rng(5)

    def draft_for(row, req):
        n = len(req.output_ids)
        d = list(want_tokens[row][n : n + int(rng.integers(0, 5))])
        if d and rng.random() < 0.4:
            d[int(rng.integers(0, len(d)))] = int(rng.integers(0, V))  # a wrong draft somewhere
        return d

    got_tokens, got_lp = _speculate(knobs, STEPS, draft_for)
    for row in range(len(knobs)):
        assert got_tokens[row] == want_tokens[row][:STEPS], knobs[row]
        assert got_lp[row] == want_lp[row][:STEPS], knobs[row]


@pytest.mark.parametrize("logprobs_on", [False, True])
def test_positions_sampled_in_one_pass_equal_decode(monkeypatch, logprobs_on):
    """Without penalties or host-reading stages, all positions are sampled in one pass (each row
    keyed by its position): the same tokens and logprobs as decoding."""
    from sglang.srt.layers import sampler_verify

    passes = []
    one_pass = sampler_verify._sample_all_positions
    monkeypatch.setattr(sampler_verify, "_sample_all_positions", lambda *a: passes.append(1) or one_pass(*a))
    knobs = ["greedy", "logit_bias", "top_k_top_p_min_p"]
    want_tokens, want_lp = _decode(knobs, STEPS + 6, logprobs_on=logprobs_on)
    rng = np.random.default_rng(8)

    def draft_for(row, req):
        n = len(req.output_ids)
        d = list(want_tokens[row][n : n + int(rng.integers(0, 5))])
        if d and rng.random() < 0.4:
            d[int(rng.integers(0, len(d)))] = int(rng.integers(0, V))
        return d

    got_tokens, got_lp = _speculate(knobs, STEPS, draft_for, logprobs_on=logprobs_on)
    assert got_tokens == [t[:STEPS] for t in want_tokens]
    assert got_lp == [lp[:STEPS] for lp in want_lp]
    assert passes


def test_a_row_with_no_drafts_beside_long_ones_is_a_decode_step():
    knobs = ["seeded_penalties", "grammar", "logit_bias"]
    want_tokens, _ = _decode(knobs, STEPS + 6)

    def draft_for(row, req):
        n = len(req.output_ids)
        return [] if row == 1 else list(want_tokens[row][n : n + 4])

    got_tokens, _ = _speculate(knobs, STEPS, draft_for)
    assert got_tokens == [t[:STEPS] for t in want_tokens]


@pytest.mark.parametrize("knob", ["no_repeat_ngram", "no_repeat_ngram_seeded"])
def test_batch_processors_forget_rejected_drafts(knob):
    """Every verify rejects its first draft; the drafts after it are the tokens the reference
    emits next. A processor state that kept the rejected drafts (an n-gram index over them)
    would ban exactly those tokens at the next steps."""
    knobs = [knob, "greedy"]
    want_tokens, want_lp = _decode(knobs, STEPS + 6)

    def draft_for(row, req):
        n = len(req.output_ids)
        return [(want_tokens[row][n] + 1) % V] + list(want_tokens[row][n + 1 : n + 4])

    got_tokens, got_lp = _speculate(knobs, STEPS, draft_for)
    assert got_tokens == [t[:STEPS] for t in want_tokens]
    assert got_lp == [lp[:STEPS] for lp in want_lp]


def test_host_state_is_put_back_after_the_verify():
    batch = _batch(["grammar", "custom_processor"])
    for req in batch.reqs:
        _append(req, 1)
    before = [(list(r.output_ids), list(r.grammar.tokens) if r.grammar else None) for r in batch.reqs]
    drafts = [[2, 3, 4], [5]]
    rows = [toy_logits([1] * (j + 2)) for j in range(4)] + [toy_logits([2] * (j + 2)) for j in range(2)]
    Sampler(generator=torch.Generator().manual_seed(0)).verify_step(
        VerifyInput(torch.stack(rows), batch.sampling_info, batch.reqs, drafts, [0, 4], torch.tensor([5, 5]), [None, None])
    )
    assert [(list(r.output_ids), list(r.grammar.tokens) if r.grammar else None) for r in batch.reqs] == before


def _law(logits: torch.Tensor) -> np.ndarray:
    p = torch.softmax(logits.double(), 0).numpy()
    return p / p.sum()


def test_unseeded_rows_keep_the_target_distribution():
    """20000 identical unseeded rows, the draft always the first position's mode: the first
    emitted token follows the target's law, a second one is emitted exactly when the draft was
    drawn, and it follows the target's law after the draft (chi-square and total variation at the
    sampler tests' bounds)."""
    from sampling_utils import assert_matches_distribution

    small = 6
    rows_n = 20_000
    first = torch.tensor([1.0, 0.5, 0.0, -0.5, 0.3, -1.0])
    second = {t: torch.randn(small, generator=torch.Generator().manual_seed(40 + t)) for t in range(small)}
    draft = int(first.argmax())
    batch = make_batch([SamplingParams(temperature=1.0)] * rows_n, prompts=[[1]] * rows_n)
    for req in batch.reqs:
        req.output_ids.append(0)
    info = SamplingBatchInfo.from_schedule_batch(batch, small)
    logits = torch.stack([first, second[draft]] * rows_n)  # [2 * rows, small]
    out = Sampler(generator=torch.Generator().manual_seed(1)).verify_step(
        VerifyInput(logits, info, batch.reqs, [[draft]] * rows_n, list(range(0, 2 * rows_n, 2)),
                    torch.zeros(rows_n, dtype=torch.int64), [None] * rows_n)
    )
    firsts = torch.tensor([t[0] for t in out.tokens])
    assert_matches_distribution(firsts, _law(first))
    seconds = torch.tensor([t[1] for t in out.tokens if len(t) == 2])
    assert all((len(t) == 2) == (t[0] == draft) for t in out.tokens)
    assert_matches_distribution(seconds, _law(second[draft]))
