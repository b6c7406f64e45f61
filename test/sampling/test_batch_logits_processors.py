"""Unit tests of the batch-level logits-processor API (sglang.srt.sampling.logits_processor):
BatchUpdate semantics, the builder over random filter/merge sequences, the per-batch pipeline
through SamplingBatchInfo (row check, failure isolation, greedy skipping), the four built-ins
against brute-force references, the adapter, the loader, and the parameters' validation."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from sampling_utils import make_batch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.sampling.logits_processor import (
    AdapterLogitsProcessor,
    BatchUpdate,
    BatchUpdateBuilder,
    BUILT_IN_LOGITS_PROCESSORS,
    LoadedLogitsProcessors,
    LogitsProcessor,
    MoveDirectionality,
    apply_batch_update,
)
from sglang.srt.sampling.logits_processor import thinking_budget
from sglang.srt.sampling.logits_processor.allowed_token_ids import AllowedTokenIdsLogitsProcessor
from sglang.srt.sampling.logits_processor.bad_words import BadWordsLogitsProcessor
from sglang.srt.sampling.logits_processor.loader import load_processor_class
from sglang.srt.sampling.logits_processor.no_repeat_ngram import NoRepeatNGramLogitsProcessor
from sglang.srt.sampling.logits_processor.thinking_budget import ThinkingBudgetLogitsProcessor
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

SERVER_ARGS = SimpleNamespace(logits_processors=None, skip_tokenizer_init=True)
NEG = float("-inf")


class Row:
    def __init__(self, name: str) -> None:
        self.params, self.prompt_ids, self.output_ids = name, [len(name)], []


# ---------------------------------------------------------------------- BatchUpdate and the builder


def test_apply_batch_update_removes_then_adds_then_moves():
    states = {0: "A", 1: "B", 2: "C"}
    update = BatchUpdate(3, removed=[0], added=[(0, "D", [], [])], moved=[(2, 1, MoveDirectionality.SWAP)])
    assert apply_batch_update(states, update, lambda p, prompt, out: p)
    assert states == {0: "D", 1: "C", 2: "B"}
    update = BatchUpdate(2, removed=[0], added=[], moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)])
    apply_batch_update(states, update, lambda p, prompt, out: p)
    assert states == {0: "B", 1: "C"}
    assert not apply_batch_update(states, None, lambda p, prompt, out: p)


def test_builder_describes_every_random_filter_and_merge_sequence():
    """A processor that applies each update by the rules holds exactly the current rows, through
    1000 random steps of filters, merges, both, and index reuse."""
    rng = random.Random(0)
    counter = iter(range(10**6))
    seen: list[Row] = []
    states: dict[int, str] = {}
    current: list[Row] = []
    for _ in range(1000):
        if current and rng.random() < 0.6:
            current = [row for row in current if rng.random() < 0.7]
        if rng.random() < 0.6:
            current = current + [Row(f"r{next(counter)}") for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.2:
            rng.shuffle(current)  # any order, not only filter/merge's
        update = BatchUpdateBuilder.build(seen, current)
        if update is not None:
            assert update.batch_size == len(current)
            added_at = [index for index, *_ in update.added]
            assert len(set(added_at)) == len(added_at)
        apply_batch_update(states, update, lambda p, prompt, out: p)
        seen = list(current)
        assert states == {i: row.params for i, row in enumerate(current)}


def test_builder_unchanged_rows_give_none():
    rows = [Row("a"), Row("b")]
    assert BatchUpdateBuilder.build(rows, list(rows)) is None
    full = BatchUpdateBuilder.full(rows)
    assert [(i, p) for i, p, _, _ in full.added] == [(0, "a"), (1, "b")] and not full.removed and not full.moved


# ---------------------------------------------------------------------- the pipeline


class Recorder(LogitsProcessor):
    """Keeps (prompt, output) per row; argmax-invariant when built by InvariantRecorder."""

    applied = 0

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple] = {}

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        apply_batch_update(self.rows, batch_update, lambda p, prompt, out: (prompt, out))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        type(self).applied += 1
        return logits

    def is_argmax_invariant(self) -> bool:
        return False

    def row_views(self):
        return self.rows


class InvariantRecorder(Recorder):
    applied = 0

    def is_argmax_invariant(self) -> bool:
        return True


class IgnoresMoves(Recorder):
    """Seed 004's class of bug: state keyed by arrival, moves ignored."""

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if batch_update is not None:
            batch_update = BatchUpdate(batch_update.batch_size, batch_update.removed, batch_update.added, [])
        super().update_state(batch_update)


class Raises(Recorder):
    @classmethod
    def acts_on(cls, params: SamplingParams) -> bool:
        return bool((params.custom_params or {}).get("raise"))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")


def batch_info(classes, params: list[SamplingParams], prompts: list[list[int]]) -> tuple[Any, SamplingBatchInfo]:
    batch = make_batch(params, prompts=prompts)
    batch.loaded_logits_processors = LoadedLogitsProcessors(classes, SERVER_ARGS, "cpu")
    info = SamplingBatchInfo.from_schedule_batch(batch, 32)
    return batch, info


def step(batch, info, all_greedy: bool = False) -> dict[int, str]:
    return info.logits_processors.run(torch.zeros(len(batch.reqs), 32), info.rows, all_greedy, batch.reqs)


def filter_rows(batch, info, keep: list[int]) -> None:
    batch.reqs = [batch.reqs[i] for i in keep]
    info.filter_batch(keep)


def merge_rows(batch, info, other_batch, other_info) -> None:
    info.merge_batch(other_info)
    batch.reqs = batch.reqs + other_batch.reqs


def test_pipeline_views_follow_filter_merge_and_the_row_check_names_a_wrong_processor():
    params = [SamplingParams() for _ in range(4)]
    batch, info = batch_info([Recorder, IgnoresMoves], params, [[1], [2, 2], [3, 3, 3], [4]])
    assert step(batch, info) == {}
    for req in batch.reqs:
        req.output_ids.append(7)
    filter_rows(batch, info, [0, 2, 3])  # request r1 leaves: r2, r3 move up
    other_batch, other_info = batch_info([Recorder, IgnoresMoves], [SamplingParams()], [[5, 5]])
    other_batch.reqs[0].rid = "r9"
    merge_rows(batch, info, other_batch, other_info)
    errors = step(batch, info)
    recorder = info.logits_processors.instances[Recorder]
    assert {row: (list(p), len(o)) for row, (p, o) in recorder.rows.items()} == {0: ([1], 1), 1: ([3, 3, 3], 1), 2: ([4], 1), 3: ([5, 5], 0)}
    # r9 took the free slot 1 and r2 moved there from 2: IgnoresMoves still sees r9 at row 1. It
    # acts on every row, so every row fails.
    assert set(errors) == {0, 1, 2, 3}
    message = errors[1]
    assert "IgnoresMoves" in message and "row 1 is request r2" in message and "prompt of r9" in message


def test_failing_processor_fails_only_its_rows_and_restarts_next_step():
    params = [SamplingParams(custom_params={"raise": i == 1}) for i in range(3)]
    batch, info = batch_info([Recorder, Raises], params, [[1], [2], [3]])
    errors = step(batch, info)
    assert list(errors) == [1] and "Raises failed: RuntimeError: boom" in errors[1]
    assert Raises not in info.logits_processors.instances
    filter_rows(batch, info, [0, 2])  # the failed request leaves
    assert step(batch, info) == {}
    assert info.logits_processors.classes == [Recorder]


def test_argmax_invariant_processors_update_but_do_not_apply_in_all_greedy_batches():
    batch, info = batch_info([InvariantRecorder], [SamplingParams(temperature=0.0)] * 2, [[1], [2]])
    before = InvariantRecorder.applied
    assert step(batch, info, all_greedy=True) == {}
    assert InvariantRecorder.applied == before
    assert info.logits_processors.instances[InvariantRecorder].rows  # it was told about the rows
    step(batch, info, all_greedy=False)
    assert InvariantRecorder.applied == before + 1


def test_no_pipeline_without_an_acting_processor():
    batch, info = batch_info(list(BUILT_IN_LOGITS_PROCESSORS), [SamplingParams()] * 3, [[1], [2], [3]])
    assert info.logits_processors is None
    other_batch, other_info = batch_info(list(BUILT_IN_LOGITS_PROCESSORS), [SamplingParams(no_repeat_ngram_size=1)], [[4]])
    merge_rows(batch, info, other_batch, other_info)
    assert info.logits_processors.classes == [NoRepeatNGramLogitsProcessor]
    filter_rows(batch, info, [0, 1])
    assert info.logits_processors is None


def test_greedy_rows_take_the_argmax_after_non_invariant_processors():
    params = [SamplingParams(temperature=0.0, allowed_token_ids=[3, 9]), SamplingParams(temperature=0.0)]
    batch, info = batch_info(list(BUILT_IN_LOGITS_PROCESSORS), params, [[1], [2]])
    logits = torch.arange(32, dtype=torch.float32).repeat(2, 1)  # argmax 31 on both rows
    errors = info.logits_processors.run(logits, info.rows, info.is_all_greedy, None)
    ids = Sampler("pytorch")(LogitsProcessorOutput(next_token_logits=logits), info, positions=torch.zeros(2, dtype=torch.int64), row_errors=errors)
    assert ids.tolist() == [9, 31]


def test_sampler_flags_rows_failed_before_it():
    _, info = batch_info([], [SamplingParams(temperature=0.0)] * 3, [[1], [2], [3]])
    out = LogitsProcessorOutput(next_token_logits=torch.randn(3, 32))
    ids = Sampler("pytorch")(out, info, positions=torch.zeros(3, dtype=torch.int64), row_errors={1: "failed"})
    assert ids[1].item() == -1 and ids[0].item() >= 0 and out.row_errors == {1: "failed"}


# ---------------------------------------------------------------------- built-ins


def run_builtin(cls, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]], vocab: int = 32) -> torch.Tensor:
    processor = cls(SERVER_ARGS, torch.device("cpu"), False)
    rows = [SimpleNamespace(params=p, prompt_ids=pr, output_ids=o) for p, pr, o in zip(params, prompts, outputs)]
    processor.update_state(BatchUpdateBuilder.full(rows))
    return processor.apply(torch.zeros(len(rows), vocab))


def test_allowed_token_ids_masks_each_row_to_its_own_list():
    logits = run_builtin(AllowedTokenIdsLogitsProcessor, [SamplingParams(allowed_token_ids=[1, 5]), SamplingParams(), SamplingParams(allowed_token_ids=[0])], [[1]] * 3, [[]] * 3)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [1, 5]
    assert torch.isfinite(logits[1]).all()
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == [0]


def test_bad_words_ban_the_last_token_after_the_prefix():
    p = SamplingParams()
    p.bad_words_token_ids = [[4], [7, 8, 9], [3, 9]]
    logits = run_builtin(BadWordsLogitsProcessor, [p, p, p, SamplingParams()], [[1]] * 4, [[7, 8], [1, 7], [2, 3], [7, 8]])
    banned = [sorted((logits[r] == NEG).nonzero().flatten().tolist()) for r in range(4)]
    assert banned == [[4, 9], [4], [4, 9], []]


def brute_force_ngram_bans(seq: list[int], n: int) -> set[int]:
    tail = seq[len(seq) - n + 1 :] if n > 1 else []
    return {seq[e] for e in range(n - 1, len(seq)) if seq[e - n + 1 : e] == tail}


def test_no_repeat_ngram_matches_brute_force_as_the_output_grows():
    rng = random.Random(1)
    for n in (1, 2, 3, 4):
        prompt = [rng.randrange(6) for _ in range(9)]
        output: list[int] = []
        processor = NoRepeatNGramLogitsProcessor(SERVER_ARGS, torch.device("cpu"), False)
        row = SimpleNamespace(params=SamplingParams(no_repeat_ngram_size=n), prompt_ids=prompt, output_ids=output)
        processor.update_state(BatchUpdateBuilder.full([row]))
        for _ in range(30):
            processor.update_state(None)
            logits = processor.apply(torch.zeros(1, 8))
            assert set((logits[0] == NEG).nonzero().flatten().tolist()) == brute_force_ngram_bans(prompt + output, n)
            output.append(rng.randrange(8))


@pytest.fixture
def think_markers(monkeypatch):
    def use(start: list[int], end: list[int]) -> None:
        monkeypatch.setattr(thinking_budget, "think_markers", lambda server_args: (start, end))
    return use


def forced(processor, output: list[int]) -> Optional[int]:
    processor.update_state(None)
    logits = processor.apply(torch.zeros(1, 32))
    finite = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    return finite[0] if len(finite) == 1 else None


@pytest.mark.parametrize("start,end", [([20], [21]), ([20, 22], [21, 23, 24])], ids=["one-token", "multi-token"])
def test_thinking_budget_forces_the_end_marker_after_the_budget(think_markers, start, end):
    think_markers(start, end)
    processor = ThinkingBudgetLogitsProcessor(SERVER_ARGS, torch.device("cpu"), False)
    output: list[int] = []
    prompt = [1, 2] + start + [5]  # the prompt opens the think section and holds one thinking token
    row = SimpleNamespace(params=SamplingParams(thinking_token_budget=4), prompt_ids=prompt, output_ids=output)
    processor.update_state(BatchUpdateBuilder.full([row]))
    for _ in range(3):
        assert forced(processor, output) is None
        output.append(7)
    for token in end:
        assert forced(processor, output) == token
        output.append(token)
    for _ in range(3):  # the answer is free
        assert forced(processor, output) is None
        output.append(8)


def test_thinking_budget_ignores_rows_outside_a_think_section_and_counts_a_new_one(think_markers):
    think_markers([20], [21])
    processor = ThinkingBudgetLogitsProcessor(SERVER_ARGS, torch.device("cpu"), False)
    output = [9, 9]
    row = SimpleNamespace(params=SamplingParams(thinking_token_budget=0), prompt_ids=[1, 20, 5, 21], output_ids=output)
    processor.update_state(BatchUpdateBuilder.full([row]))
    assert forced(processor, output) is None  # the prompt's section is closed
    output.append(20)
    assert forced(processor, output) == 21  # budget 0: the end at once


# ---------------------------------------------------------------------- adapter and loader


class DoubleRow(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: Any):
        scale = (params.custom_params or {}).get("scale")
        if scale is None:
            return None
        if scale == "prompt":
            return lambda prompt_ids, output_ids, row: row + len(prompt_ids)
        return lambda output_ids, row: row * scale + len(output_ids)


def test_adapter_calls_two_and_three_argument_callables_on_their_rows():
    params = [SamplingParams(custom_params={"scale": 2.0}), SamplingParams(), SamplingParams(custom_params={"scale": "prompt"})]
    logits = run_builtin(DoubleRow, params, [[1], [1], [1, 2, 3]], [[5], [], []])
    assert logits[:, 0].tolist() == [1.0, 0.0, 3.0]


def test_load_processor_class_forms():
    assert load_processor_class("test_batch_logits_processors:Recorder") is Recorder
    for spec, message in [
        ("test_batch_logits_processors.Recorder", "one colon"),
        ("a:b:c", "one colon"),
        ("no_such_module_xyz:Thing", "cannot load"),
        ("test_batch_logits_processors:Row", "not a subclass"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_processor_class(spec)


def test_validate_params_error_names_the_processor():
    class Strict(Recorder):
        @classmethod
        def validate_params(cls, params):
            if (params.custom_params or {}).get("k", 0) < 0:
                raise ValueError("custom_params.k must be >= 0")

    loaded = LoadedLogitsProcessors([Strict], SERVER_ARGS, "cpu")
    loaded.validate(SamplingParams(custom_params={"k": 1}))
    with pytest.raises(ValueError, match="logits processor .*Strict: custom_params.k must be >= 0"):
        loaded.validate(SamplingParams(custom_params={"k": -1}))


# ---------------------------------------------------------------------- parameters


class Tokenizer:
    """Words to ids: a word alone is one id, with a leading space another."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1000 + len(text.strip()) + (500 if text.startswith(" ") else 0)] * len(text.split())


@pytest.mark.parametrize("params,message", [
    ({"allowed_token_ids": []}, "allowed_token_ids must be a non-empty list"),
    ({"allowed_token_ids": [1, 50]}, r"allowed_token_ids contains out-of-vocab token id 50; valid range is \[0, 40\)"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be a non-negative integer"),
    ({"thinking_token_budget": -2}, "thinking_token_budget must be a non-negative integer, or -1"),
])
def test_verify_messages_name_the_parameter(params, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**params).verify(40)


@pytest.mark.parametrize("value", [1.5, True, "3"])
def test_wrong_json_types_are_refused(value):
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams.from_dict({"thinking_token_budget": value})


def test_thinking_budget_minus_one_is_no_limit():
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None


def test_bad_words_tokenized_with_and_without_a_leading_space_and_bounded():
    p = SamplingParams(bad_words=["hello", " hello", "big dog"])
    p.normalize(Tokenizer())
    assert p.bad_words_token_ids == [[1005], [1505], [1007, 1007], [1507, 1507]]
    too_many = SamplingParams(bad_words=[f"w{'x' * i}" for i in range(65)])
    with pytest.raises(ValueError, match="130 token sequences.*at most 128"):
        too_many.normalize(Tokenizer())
    with pytest.raises(ValueError, match="bad_words must not contain empty strings"):
        SamplingParams(bad_words=["ok", " "]).normalize(Tokenizer())
    with pytest.raises(ValueError, match="bad_words is unavailable when skip_tokenizer_init"):
        SamplingParams(bad_words=["ok"]).normalize(None)


def test_allowed_token_ids_when_a_row_without_a_list_joins():
    """All rows allowed-listed (one fill of the whole batch), then a plain row joins: it stays finite."""
    processor = AllowedTokenIdsLogitsProcessor(SERVER_ARGS, torch.device("cpu"), False)
    rows = [SimpleNamespace(params=SamplingParams(allowed_token_ids=[2]), prompt_ids=[1], output_ids=[])]
    processor.update_state(BatchUpdateBuilder.full(rows))
    assert torch.isfinite(processor.apply(torch.zeros(1, 8))).sum() == 1
    grown = rows + [SimpleNamespace(params=SamplingParams(), prompt_ids=[2], output_ids=[])]
    processor.update_state(BatchUpdateBuilder.build(rows, grown))
    logits = processor.apply(torch.zeros(2, 8))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [2] and torch.isfinite(logits[1]).all()
