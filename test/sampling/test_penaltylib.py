"""penaltylib: exact logit arithmetic against a dense reference, lifecycle, filter/merge."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.sampling.penaltylib import (
    BatchedFrequencyPenalizer,
    BatchedMinNewTokensPenalizer,
    BatchedPenalizerOrchestrator,
    BatchedPresencePenalizer,
    BatchedRepetitionPenalizer,
    TokenCounts,
)
from sglang.srt.sampling.sampling_params import SamplingParams

V = 32
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
INF = float("-inf")


def exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0)


def make_req(
    prompt: Optional[list[int]] = None,
    output: Optional[list[int]] = None,
    eos_token_ids: Optional[set[int]] = None,
    tokenizer: Any = None,
    **params: Any,
) -> Req:
    req = Req("r", prompt or [], SamplingParams(**params), eos_token_ids=eos_token_ids, tokenizer=tokenizer)
    req.output_ids = list(output or [])
    return req


def orchestrate(
    reqs: list[Req], device: str = "cpu", **kw: Any
) -> tuple[BatchedPenalizerOrchestrator, ScheduleBatch]:
    batch = ScheduleBatch(reqs=reqs, device=device)  # returned so the weakref stays alive
    return BatchedPenalizerOrchestrator(V, batch, **kw), batch


def applied(orch: BatchedPenalizerOrchestrator, logits: torch.Tensor) -> torch.Tensor:
    out = logits.clone().to(orch.device)
    orch.apply(out)
    return out.cpu()


def dense_reference(reqs: list[Req], logits: torch.Tensor) -> torch.Tensor:
    """Penalised logits from the reqs' host histories, one element at a time."""
    out = logits.clone()
    for b, req in enumerate(reqs):
        sp = req.sampling_params
        generated = [t for t in req.output_ids if t >= 0]
        for t, c in Counter(generated).items():
            out[b, t] -= torch.tensor(sp.frequency_penalty, dtype=torch.float32) * c
        for t in set(generated):
            out[b, t] -= torch.tensor(sp.presence_penalty, dtype=torch.float32)
        if len(generated) < sp.min_new_tokens:
            for t in req.stop_token_ids():
                if 0 <= t < logits.shape[1]:
                    out[b, t] = INF
        p = torch.tensor(sp.repetition_penalty, dtype=torch.float32)
        for t in {t for t in req.origin_input_ids + generated if t >= 0}:
            x = out[b, t].clone()
            out[b, t] = x / p if x > 0 else x * p
    return out


def step(orch: BatchedPenalizerOrchestrator, reqs: list[Req], tokens: list[int]) -> None:
    """What the engine does after sampling: host history and orchestrator both learn the token."""
    for req, t in zip(reqs, tokens):
        if t >= 0:
            req.output_ids.append(t)
    orch.cumulate_output_tokens(torch.tensor(tokens, dtype=torch.int64, device=orch.device))


def token_counts_dense(tc: TokenCounts) -> torch.Tensor:
    dense = torch.zeros(len(tc), V + 1)
    dense.scatter_add_(1, torch.where(tc.ids >= 0, tc.ids, V).cpu(), tc.counts.cpu())
    return dense[:, :V]


def histories_dense(histories: list[list[int]]) -> torch.Tensor:
    dense = torch.zeros(len(histories), V)
    for b, h in enumerate(histories):
        for t in h:
            if t >= 0:
                dense[b, t] += 1
    return dense


# ---------------------------------------------------------------- TokenCounts


@pytest.mark.parametrize("device", DEVICES)
def test_token_counts_add_grows_and_ignores_negative_ids(device: str) -> None:
    rng = random.Random(0)
    histories = [[1, 1, 4], [], [-1, 7]]
    tc = TokenCounts.from_lists(histories, device)
    for _ in range(40):  # past the initial capacity, so the buffers double
        tokens = [rng.choice([-1, *range(V)]) for _ in histories]
        tc.add(torch.tensor(tokens, device=device))
        for h, t in zip(histories, tokens):
            h.append(t)
    exact(token_counts_dense(tc), histories_dense(histories))
    lengths = [len({t for t in h if t >= 0}) for h in histories]
    assert tc.lengths.flatten().tolist() == lengths
    for b, n in enumerate(lengths):  # left-packed: distinct ids first, then pads only
        assert (tc.ids[b, :n] >= 0).all() and (tc.ids[b, n:] == -1).all()
        assert (tc.counts[b, n:] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_token_counts_filter_and_merge(device: str) -> None:
    left = TokenCounts.from_lists([[1, 2, 2], [3]], device)
    right = TokenCounts.from_lists([list(range(20)), []], device)  # wider than left's capacity
    left.add(torch.tensor([2, 9], device=device))
    left.merge(right)
    left.add(torch.tensor([5, -1, 0, 6], device=device))
    exact(token_counts_dense(left), histories_dense([[1, 2, 2, 2, 5], [3, 9], [*range(20), 0], [6]]))
    left.filter(torch.tensor([3, 0], device=device))
    left.add(torch.tensor([6, 1], device=device))
    exact(token_counts_dense(left), histories_dense([[6, 6], [1, 2, 2, 2, 5, 1]]))


# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize("device", DEVICES)
def test_frequency_and_presence_spec_vector(device: str) -> None:
    orch, _ = orchestrate([make_req(output=[5], frequency_penalty=1.0, presence_penalty=0.5)], device)
    out = applied(orch, torch.zeros(1, V))
    expected = torch.zeros(1, V)
    expected[0, 5] = -1.5
    exact(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_additive_then_scaling_spec_vectors(device: str) -> None:
    reqs = [
        make_req(output=[3], presence_penalty=-0.5, frequency_penalty=0.25, repetition_penalty=1.3),
        make_req(prompt=[4], repetition_penalty=1.3),
    ]
    orch, _ = orchestrate(reqs, device)
    logits = torch.zeros(2, V)
    logits[0, 3] = -2.0
    logits[1, 4] = 2.6
    out = applied(orch, logits)
    torch.testing.assert_close(out[0, 3], torch.tensor(-2.275), rtol=1e-6, atol=0)
    torch.testing.assert_close(out[1, 4], torch.tensor(2.0), rtol=1e-6, atol=0)
    exact(out, dense_reference(reqs, logits))


@pytest.mark.parametrize("device", DEVICES)
def test_frequency_counts_every_occurrence_presence_only_once(device: str) -> None:
    reqs = [
        make_req(output=[2, 2, 2, 7], frequency_penalty=0.5),
        make_req(output=[2, 2, 2, 7], presence_penalty=0.75),
        make_req(output=[2, 2], frequency_penalty=-0.5, presence_penalty=-0.75),
    ]
    orch, _ = orchestrate(reqs, device)
    out = applied(orch, torch.ones(3, V))
    expected = torch.ones(3, V)
    expected[0, 2], expected[0, 7] = 1 - 1.5, 1 - 0.5
    expected[1, 2], expected[1, 7] = 1 - 0.75, 1 - 0.75
    expected[2, 2] = 1 + 1.0 + 0.75  # negative penalties reward
    exact(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_repetition_positive_negative_and_infinite_logits(device: str) -> None:
    reqs = [make_req(prompt=[0, 1, 2, 3], output=[1], repetition_penalty=2.0)]
    orch, _ = orchestrate(reqs, device)
    logits = torch.full((1, V), 3.0)
    logits[0, :4] = torch.tensor([4.0, -3.0, INF, 0.0])
    out = applied(orch, logits)
    expected = logits.clone()
    expected[0, :4] = torch.tensor([2.0, -6.0, INF, 0.0])
    exact(out, expected)
    assert not out.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_prompt_counts_for_repetition_only(device: str) -> None:
    reqs = [
        make_req(prompt=[6, 6, 8], frequency_penalty=1.0, presence_penalty=1.0),
        make_req(prompt=[6, 6, 8], repetition_penalty=1.5),
    ]
    orch, _ = orchestrate(reqs, device)
    out = applied(orch, torch.full((2, V), 3.0))
    expected = torch.full((2, V), 3.0)
    expected[1, 6] = expected[1, 8] = 2.0
    exact(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_negative_ids_are_ignored(device: str) -> None:
    reqs = [
        make_req(frequency_penalty=1.0, presence_penalty=1.0, repetition_penalty=1.5),
        make_req(min_new_tokens=2, stop_token_ids=[3]),
    ]
    orch, _ = orchestrate(reqs, device)
    orch.cumulate_output_tokens(torch.tensor([-1, -1], device=device))
    out = applied(orch, torch.ones(2, V))
    expected = torch.ones(2, V)
    expected[1, 3] = INF  # the invalid step did not count towards min_new_tokens
    exact(out, expected)
    step(orch, reqs, [4, 9])
    step(orch, reqs, [-1, 9])
    exact(applied(orch, torch.ones(2, V)), dense_reference(reqs, torch.ones(2, V)))


@pytest.mark.parametrize("device", DEVICES)
def test_min_new_tokens_masks_every_stop_id_until_reached(device: str) -> None:
    tokenizer = SimpleNamespace(eos_token_id=2, additional_stop_token_ids=[30])
    reqs = [
        make_req(stop_token_ids=[11, 12], eos_token_ids={20}, tokenizer=tokenizer, min_new_tokens=3),
        make_req(stop_token_ids=[11], min_new_tokens=1),
        make_req(stop_token_ids=[11]),
    ]
    orch, _ = orchestrate(reqs, device)
    stops = [[2, 11, 12, 20, 30], [11], []]
    for n in range(4):
        out = applied(orch, torch.zeros(3, V))
        expected = torch.zeros(3, V)
        for b, req in enumerate(reqs):
            if n < req.sampling_params.min_new_tokens:
                expected[b, stops[b]] = INF
        exact(out, expected)
        step(orch, reqs, [5, 5, 5])


def test_min_new_tokens_skips_ids_outside_vocab() -> None:
    reqs = [make_req(stop_token_ids=[V + 5, 1], min_new_tokens=1)]
    orch, _ = orchestrate(reqs)
    expected = torch.zeros(1, V)
    expected[0, 1] = INF
    exact(applied(orch, torch.zeros(1, V)), expected)


def test_apply_order_does_not_depend_on_the_given_order() -> None:
    params = dict(frequency_penalty=0.3, presence_penalty=0.7, repetition_penalty=1.7)
    reqs = [make_req(prompt=[1], output=[1, 1], **params)]
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0))
    classes = [BatchedRepetitionPenalizer, BatchedPresencePenalizer, BatchedFrequencyPenalizer]
    forward, _b1 = orchestrate(reqs, penalizers=classes)
    backward, _b2 = orchestrate(reqs, penalizers=classes[::-1])
    exact(applied(forward, logits), applied(backward, logits))
    exact(applied(forward, logits), dense_reference(reqs, logits))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits(dtype: torch.dtype) -> None:
    params = dict(frequency_penalty=0.5, repetition_penalty=2.0, min_new_tokens=5, stop_token_ids=[3])
    reqs = [make_req(prompt=[1], output=[2], **params)]
    orch, _ = orchestrate(reqs)
    logits = torch.full((1, V), 4.0, dtype=dtype)
    orch.apply(logits)
    assert logits.dtype == dtype
    assert logits[0, :4].float().tolist() == [4.0, 2.0, 1.75, INF]


# ---------------------------------------------------------------- lifecycle


def test_nothing_required_is_lazy_and_a_no_op() -> None:
    reqs = [make_req(prompt=[1, 2], output=[3], stop_token_ids=[4])]
    orch, _ = orchestrate(reqs)
    assert not orch.is_required
    assert not any(p.is_prepared() for p in orch.penalizers.values())
    logits = torch.randn(1, V)
    exact(applied(orch, logits), logits)
    orch.cumulate_output_tokens(torch.tensor([3]))
    assert not any(p.is_prepared() for p in orch.penalizers.values())


def test_only_required_penalizers_prepare() -> None:
    orch, _ = orchestrate([make_req(presence_penalty=0.1), make_req()])
    assert orch.is_required
    prepared = {cls for cls, p in orch.penalizers.items() if p.is_prepared()}
    assert prepared == {BatchedPresencePenalizer}


def test_prepare_after_some_steps_matches_incremental_state() -> None:
    params = dict(
        frequency_penalty=0.4, presence_penalty=-0.2, repetition_penalty=1.2,
        min_new_tokens=4, stop_token_ids=[9],
    )
    early = [make_req(prompt=[1, 9], **params)]
    orch, _ = orchestrate(early)
    for t in [1, 5, 5]:
        step(orch, early, [t])
    late, _ = orchestrate([make_req(prompt=[1, 9], output=[1, 5, 5], **params)])
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    exact(applied(orch, logits), applied(late, logits))
    exact(applied(orch, logits), dense_reference(early, logits))


def test_filter_tears_down_penalizers_no_longer_required() -> None:
    reqs = [make_req(output=[1], frequency_penalty=1.0), make_req(output=[1], repetition_penalty=2.0)]
    orch, batch = orchestrate(reqs)
    batch.reqs = [reqs[1]]
    orch.filter(torch.tensor([1]))
    assert not orch.penalizers[BatchedFrequencyPenalizer].is_prepared()
    assert orch.penalizers[BatchedRepetitionPenalizer].is_prepared()
    exact(applied(orch, torch.ones(1, V)), dense_reference(batch.reqs, torch.ones(1, V)))
    batch.reqs = []
    orch.filter(torch.tensor([], dtype=torch.int64))
    assert not orch.is_required and orch.batch is None and not orch.penalizers


def test_orchestrator_holds_batch_weakly() -> None:
    orch, batch = orchestrate([make_req(frequency_penalty=1.0)])
    assert orch.batch is batch
    del batch
    assert orch.batch is None
    with pytest.raises(RuntimeError):
        orch.reqs()


@pytest.mark.parametrize("device", DEVICES)
def test_merge_then_filter_keeps_each_rows_state(device: str) -> None:
    tok = SimpleNamespace(eos_token_id=0)
    left_reqs = [
        make_req(prompt=[1, 2], frequency_penalty=0.5, tokenizer=tok, min_new_tokens=6),
        make_req(prompt=[3], repetition_penalty=1.4, stop_token_ids=[7], min_new_tokens=3),
    ]
    right_reqs = [
        make_req(prompt=[4, 4], presence_penalty=0.25, repetition_penalty=0.8),
        make_req(prompt=[5], frequency_penalty=-0.5, presence_penalty=0.1, tokenizer=tok),
    ]
    left, left_batch = orchestrate(left_reqs, device)
    right, _right_batch = orchestrate(right_reqs, device)
    step(left, left_reqs, [1, 3])
    step(left, left_reqs, [8, 3])
    step(right, right_reqs, [4, 6])
    left.merge(right)
    left_batch.reqs = left_reqs + right_reqs
    step(left, left_batch.reqs, [1, 9, 4, 6])
    step(left, left_batch.reqs, [1, 3, 2, -1])

    left_batch.reqs = [left_batch.reqs[i] for i in (0, 2, 3)]
    left.filter(torch.tensor([0, 2, 3], device=device))
    step(left, left_batch.reqs, [2, 4, 5])

    fresh, _fresh_batch = orchestrate(left_batch.reqs, device)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(2))
    exact(applied(left, logits), applied(fresh, logits))
    exact(applied(left, logits), dense_reference(left_batch.reqs, logits))


@pytest.mark.parametrize("needing_side", ["left", "right"])
def test_merge_where_only_one_side_needs_a_penalizer(needing_side: str) -> None:
    needy = [make_req(prompt=[1], repetition_penalty=1.5)]
    plain = [make_req(prompt=[2], output=[3, 3])]
    left_reqs, right_reqs = (needy, plain) if needing_side == "left" else (plain, needy)
    left, left_batch = orchestrate(left_reqs)
    right, _right_batch = orchestrate(right_reqs)
    left.merge(right)
    left_batch.reqs = left_reqs + right_reqs
    assert left.is_required
    assert left.penalizers[BatchedRepetitionPenalizer].is_prepared()
    assert not left.penalizers[BatchedFrequencyPenalizer].is_prepared()
    step(left, left_batch.reqs, [2, 1])
    logits = torch.full((2, V), 2.0)
    exact(applied(left, logits), dense_reference(left_batch.reqs, logits))


def test_merge_with_a_penalizer_only_the_other_side_tracks() -> None:
    left_reqs = [make_req(output=[1], frequency_penalty=1.0)]
    right_reqs = [make_req(output=[2], min_new_tokens=2, stop_token_ids=[4])]
    left, left_batch = orchestrate(left_reqs, penalizers=[BatchedFrequencyPenalizer])
    right, _right_batch = orchestrate(right_reqs, penalizers=[BatchedMinNewTokensPenalizer])
    left.merge(right)
    left_batch.reqs = left_reqs + right_reqs
    assert list(left.penalizers) == [BatchedFrequencyPenalizer, BatchedMinNewTokensPenalizer]
    exact(applied(left, torch.zeros(2, V)), dense_reference(left_batch.reqs, torch.zeros(2, V)))


def test_merge_of_two_unrequired_sides_is_a_no_op() -> None:
    left, _b1 = orchestrate([make_req()])
    right, _b2 = orchestrate([make_req()])
    left.merge(right)
    assert not left.is_required


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_width_bound_retightens_on_cuda_without_a_sync() -> None:
    counts = TokenCounts.from_lists([[1, 2, 3, 4, 5], [1]], "cuda")
    for _ in range(10):
        counts.add(torch.tensor([-1, -1], device="cuda"))  # nothing new: only the bound grows
    assert counts.width == 15
    keep, token, first = (torch.tensor([x], device="cuda") for x in (1, 7, 0))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        counts.filter(keep)  # starts the read-back of max length 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    counts.add(token)
    counts.filter(first)  # adopts it: 1, plus one add since
    assert counts.width == 2 and counts.ids.tolist() == [[1, 7]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hot_path_does_not_sync_the_device() -> None:
    params = dict(
        frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.2,
        min_new_tokens=3, stop_token_ids=[4],
    )
    reqs = [make_req(prompt=[1, 2], **params) for _ in range(3)]
    orch, _ = orchestrate(reqs, "cuda")
    other, _b = orchestrate([make_req(prompt=[3], repetition_penalty=1.1, frequency_penalty=0.1)], "cuda")
    for p in other.penalizers.values():  # merge would otherwise prepare from host lists inside the check
        p.prepare()
    logits = torch.randn(3, V, device="cuda")
    tokens = torch.tensor([5, -1, 1], device="cuda")
    keep = torch.tensor([0, 2], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            orch.cumulate_output_tokens(tokens)
            orch.apply(logits)
        for p in orch.penalizers.values():
            p.filter(keep)
        for cls, p in orch.penalizers.items():
            p.merge(other.penalizers[cls])
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------- randomized


def random_req(rng: random.Random) -> Req:
    return make_req(
        prompt=[rng.randrange(V) for _ in range(rng.randrange(0, 12))],
        output=[rng.randrange(V) for _ in range(rng.randrange(0, 4))],
        frequency_penalty=rng.choice([0.0, 0.0, 0.3, -0.6, 1.25]),
        presence_penalty=rng.choice([0.0, 0.0, 0.5, -0.25]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.3, 0.7, 2.0]),
        min_new_tokens=rng.choice([0, 0, 2, 6]),
        stop_token_ids=[rng.randrange(V) for _ in range(rng.randrange(0, 3))],
        eos_token_ids={rng.choice([0, 1])},
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(16))
def test_random_steps_filters_and_merges_match_dense_reference(device: str, seed: int) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    reqs = [random_req(rng) for _ in range(rng.randrange(1, 5))]
    orch, batch = orchestrate(reqs, device)
    keep_alive = [batch]
    for _ in range(30):
        logits = torch.randn(len(batch.reqs), V, generator=gen) * 4
        logits[torch.rand(logits.shape, generator=gen) < 0.05] = INF
        exact(applied(orch, logits), dense_reference(batch.reqs, logits))
        step(orch, batch.reqs, [rng.choice([-1, *range(V)]) for _ in batch.reqs])
        event = rng.random()
        if event < 0.15 and len(batch.reqs) > 1:
            keep = sorted(rng.sample(range(len(batch.reqs)), rng.randrange(1, len(batch.reqs))))
            batch.reqs = [batch.reqs[i] for i in keep]
            orch.filter(torch.tensor(keep, device=device))
        elif event < 0.3:
            new_reqs = [random_req(rng) for _ in range(rng.randrange(1, 3))]
            other, other_batch = orchestrate(new_reqs, device)
            keep_alive.append(other_batch)
            orch.merge(other)
            batch.reqs = batch.reqs + new_reqs


def test_filter_retightens_the_width_bound():
    counts = TokenCounts.from_lists([[1, 2, 3], [4]], "cpu")
    for step in range(10):
        counts.add(torch.tensor([5, 6 + step]))  # row 0 repeats one token, row 1 gains a new one each step
    assert counts.width == 13  # a bound: 3 distinct at build + one per add
    counts.filter(torch.tensor([0]))
    assert counts.width == 4
    assert counts.ids.tolist() == [[1, 2, 3, 5]] and counts.counts.tolist() == [[1.0, 1.0, 1.0, 10.0]]
