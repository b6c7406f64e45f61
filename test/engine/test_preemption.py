"""Priority preemption on its own (no model, no server): which running requests are retracted for
a waiting one, what a retraction frees and requeues, and the re-prefill over prompt plus output."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import torch

from sglang.srt.managers.preemption import Preemption
from sglang.srt.managers.running_batch import RunningBatch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.managers.step_builder import StepBuilder
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

VOCAB = 100
MAX_NEW = 4
HIGH_FIRST = -1  # request_extras.priority_sign without --schedule-low-priority-values-first


def _req(rid: str, prompt: list[int], priority: int = 0, logprob: LogprobRequest | None = None) -> Req:
    params = SamplingParams(max_new_tokens=MAX_NEW)
    params.normalize(None)
    params.verify(VOCAB)
    req = Req(rid, prompt, params, logprob=logprob)
    req.priority = priority
    return req


def _budget(req: Req) -> int:
    return len(req.origin_input_ids) + req.sampling_params.max_new_tokens


def _setup(max_running: int = 4, slots: int = 64, sign: int = HIGH_FIRST, threshold: int = 10):
    cache = RadixCache(ReqToTokenPool(8, 64, "cpu"), TokenToKVPoolAllocator(slots))
    policy = SchedulePolicy("fcfs", 64, False, cache, cache.req_to_token_pool, max_running, _budget, sign)
    args = ServerArgs(chunked_prefill_size=64)
    processors = LoadedLogitsProcessors.from_server_args(args, torch.device("cpu"))
    builder = StepBuilder(args, policy, cache, cache.req_to_token_pool, torch.device("cpu"), VOCAB, processors)
    return cache, builder, Preemption(policy, threshold, sign)


def _run(builder: StepBuilder, reqs: list[Req], decoded: int = 2) -> RunningBatch:
    """Admit and prefill `reqs`, then `decoded` decode steps, each giving every request a token as
    the result processor would: a running batch in the state the scheduler keeps."""
    step, chunked = builder.prefill_step(None, deque(reqs), [])
    assert chunked is None and len(step.sampled_batch.reqs) == len(reqs)
    running = RunningBatch()
    running.batch = step.sampled_batch
    for i in range(decoded + 1):
        for req in reqs:
            req.output_ids.append(50 + i)
        if i < decoded:
            builder.decode_step(running.batch)
    return running


def test_the_lowest_priority_then_the_latest_arrival_is_retracted_for_a_free_slot():
    _, builder, preemption = _setup(max_running=4)
    running = [_req(name, [i + 1, i + 2], priority) for i, (name, priority) in enumerate([("a", 0), ("b", 5), ("c", 0), ("d", 20)])]
    batch = _run(builder, running)
    high = _req("high", [9, 9], priority=30)
    assert [r.rid for r in preemption.victims(deque([high]), batch.batch.reqs, batch.reqs())] == ["c"]
    # Two waiting requests need two slots: the next least urgent is "a" (priority 0, earlier arrival).
    two = deque([high, _req("high2", [8, 8], priority=30)])
    assert [r.rid for r in preemption.victims(two, batch.batch.reqs, batch.reqs())] == ["c", "a"]


def test_the_priority_gap_must_exceed_the_threshold_in_the_configured_direction():
    _, builder, preemption = _setup(max_running=1)
    batch = _run(builder, [_req("low", [1, 2], priority=0)])
    assert preemption.victims(deque([_req("w", [3], priority=10)]), batch.batch.reqs, batch.reqs()) == []
    assert [r.rid for r in preemption.victims(deque([_req("w", [3], priority=11)]), batch.batch.reqs, batch.reqs())] == ["low"]
    _, builder, low_first = _setup(max_running=1, sign=1)  # --schedule-low-priority-values-first
    batch = _run(builder, [_req("late", [1, 2], priority=20)])
    assert [r.rid for r in low_first.victims(deque([_req("w", [3], priority=9)]), batch.batch.reqs, batch.reqs())] == ["late"]
    assert low_first.victims(deque([_req("w", [3], priority=10)]), batch.batch.reqs, batch.reqs()) == []


def test_nothing_is_retracted_when_the_waiting_request_fits_or_cannot_be_made_room_for():
    _, builder, preemption = _setup(max_running=2, slots=24)
    batch = _run(builder, [_req("low", [1, 2, 3], priority=0)])
    # A free slot and KV for it: no retraction.
    assert preemption.victims(deque([_req("fits", [4, 5], priority=99)]), batch.batch.reqs, batch.reqs()) == []
    # 21 prompt tokens + 4 = 25 > the 24 slots even with "low" (budget 7) gone: it is left running.
    big = _req("big", list(range(10, 31)), priority=99)
    assert preemption.victims(deque([big]), batch.batch.reqs, batch.reqs()) == []
    # 20 + 4 = 24: all 24 slots once "low" is gone (17 free beside its reservation, 7 of its own).
    big = _req("big", list(range(10, 30)), priority=99)
    assert preemption.victims(deque([big]), batch.batch.reqs, batch.reqs()) == [batch.batch.reqs[0]]
    big.priority = 10  # a gap of 10 does not exceed the threshold
    assert preemption.victims(deque([big]), batch.batch.reqs, batch.reqs()) == []


def test_beam_guided_and_finished_rows_are_never_retracted():
    _, builder, preemption = _setup(max_running=3)
    reqs = [_req("beam", [1, 2]), _req("guided", [3, 4]), _req("done", [5, 6])]
    batch = _run(builder, reqs)
    reqs[0].beam, reqs[1].guide = object(), object()
    reqs[2].finished_reason = {"type": "length", "length": MAX_NEW}
    assert preemption.victims(deque([_req("high", [7], priority=99)]), batch.batch.reqs, batch.reqs()) == []


def test_a_retraction_frees_the_row_caches_the_sequence_and_requeues_the_request():
    cache, builder, preemption = _setup(max_running=2)
    keep, victim = _req("keep", [1, 2, 3], priority=50), _req("victim", [4, 5, 6], priority=0)
    batch = _run(builder, [keep, victim])
    rows_free = cache.req_to_token_pool.available_size()
    waiting: deque[Req] = deque([_req("high", [7, 8], priority=99)])
    preemption.retract([victim], batch, waiting)
    assert batch.batch.reqs == [keep] and batch.batch.sampling_info.temperatures.shape[0] == 1
    assert victim.req_pool_idx is None and victim.kv_len == 0 and victim.retraction_count == 1
    assert list(waiting)[-1] is victim and cache.req_to_token_pool.available_size() == rows_free + 1
    # Its prompt and the outputs whose K/V were computed stay cached: 3 prompt + 2 decoded tokens.
    assert cache.match_len(victim, len(victim.fill_ids)) == 5


def test_the_re_prefill_runs_over_the_prompt_and_the_output_so_far():
    cache, builder, preemption = _setup(max_running=1)
    victim = _req("victim", [4, 5, 6], priority=0, logprob=LogprobRequest(logprob_start_len=0, top_logprobs_num=0))
    batch = _run(builder, [victim])
    assert victim.output_ids == [50, 51, 52]
    waiting: deque[Req] = deque()
    preemption.retract([victim], batch, waiting)
    assert batch.batch is None
    step, chunked = builder.prefill_step(None, waiting, [])
    assert chunked is None and step.reqs == [victim] and step.sample_rows == [0]
    # Cached: prompt + the two outputs decoded before; computed: the last output, sampled at position 5.
    assert victim.cached_tokens == 5 and step.forward_batch.extend_seq_lens_cpu == [1]
    assert step.forward_batch.input_ids.tolist() == [52] and step.positions.tolist() == [5] and victim.kv_len == 6
    assert step.input_logprob_spans == []  # its prompt logprobs went out with its first prefill


def test_without_the_cache_the_re_prefill_computes_the_whole_sequence():
    _, builder, preemption = _setup(max_running=1)
    builder.served.tree_cache.disable = True
    victim = _req("victim", [4, 5, 6], priority=0)
    batch = _run(builder, [victim], decoded=1)
    waiting: deque[Req] = deque()
    preemption.retract([victim], batch, waiting)
    step, _ = builder.prefill_step(None, waiting, [])
    assert step.forward_batch.input_ids.tolist() == [4, 5, 6, 50, 51] and step.positions.tolist() == [4]


def test_run_reads_the_in_flight_step_only_when_it_retracts():
    _, builder, preemption = _setup(max_running=1)
    batch = _run(builder, [_req("low", [1, 2], priority=0)])
    reads: list[int] = []
    waiting = deque([_req("same", [3], priority=5)])
    preemption.run(waiting, batch, batch.reqs, lambda: reads.append(1))
    assert reads == [] and batch.batch is not None
    waiting.appendleft(_req("high", [4], priority=99))
    preemption.run(waiting, batch, batch.reqs, lambda: reads.append(1))
    assert reads == [1] and batch.batch is None and [r.rid for r in waiting] == ["high", "same", "low"]


def test_preemption_is_off_without_priority_scheduling_or_when_it_cannot_stay_exact():
    cache = RadixCache(ReqToTokenPool(2, 8, "cpu"), TokenToKVPoolAllocator(8))

    def sign(flags: dict, priority_sign: int | None = HIGH_FIRST, speculative: bool = False) -> int | None:
        args = SimpleNamespace(**{
            "disable_priority_preemption": False, "enable_deterministic_inference": False,
            "priority_scheduling_preemption_threshold": 10, **flags,
        })
        policy = SchedulePolicy("fcfs", 8, False, cache, cache.req_to_token_pool, 1, _budget, priority_sign)
        return Preemption.from_server_args(args, policy, speculative).sign

    assert sign({}) == HIGH_FIRST and ServerArgs().priority_scheduling_preemption_threshold == 10
    assert sign({}, priority_sign=None) is None
    assert sign({"disable_priority_preemption": True}) is None
    assert sign({"enable_deterministic_inference": True}) is None
    assert sign({}, speculative=True) is None
