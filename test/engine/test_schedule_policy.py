"""The admission policy on its own (no model, no server): LPM and FCFS order, prompt chunk sizes,
the KV budget check, and the prefill step the StepBuilder builds from those decisions."""

from __future__ import annotations

from collections import deque

import torch

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import (
    LPM_MAX_QUEUE,
    SchedulePolicy,
    cacheable_len,
    chunk_len,
    order_waiting,
)
from sglang.srt.managers.step_builder import StepBuilder
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

VOCAB = 100
MAX_NEW = 4


def _req(rid: str, prompt: list[int], logprob: LogprobRequest | None = None) -> Req:
    params = SamplingParams(max_new_tokens=MAX_NEW)
    params.normalize(None)
    params.verify(VOCAB)
    return Req(rid, prompt, params, logprob=logprob)


def _budget(req: Req) -> int:
    return len(req.origin_input_ids) + req.sampling_params.max_new_tokens


def _cache(slots: int = 64, rows: int = 4, disable: bool = False) -> RadixCache:
    return RadixCache(ReqToTokenPool(rows, 64, "cpu"), TokenToKVPoolAllocator(slots), disable=disable)


def _policy(cache: RadixCache, policy: str = "lpm", chunk: int = 8, deterministic: bool = False) -> SchedulePolicy:
    return SchedulePolicy(policy, chunk, deterministic, cache, cache.req_to_token_pool, 4, _budget)


def _cache_prompt(cache: RadixCache, prompt: list[int]) -> None:
    """Run `prompt` through the cache as a finished request would: its tokens stay cached."""
    req = _req("cached", prompt)
    req.req_pool_idx = cache.req_to_token_pool.alloc()
    slots = cache.alloc(len(prompt))
    cache.req_to_token_pool.assign([req.req_pool_idx], [0], [len(prompt)], slots)
    req.kv_len = len(prompt)
    cache.release(req)


def test_lpm_puts_the_longest_cached_prefix_first_and_keeps_arrival_order_among_equals():
    cache = _cache()
    _cache_prompt(cache, [1, 2, 3, 4, 5, 6])
    waiting = deque([_req("none", [9, 9, 9]), _req("short", [1, 2, 7, 7]), _req("long", [1, 2, 3, 4, 8]), _req("none2", [8, 8])])
    order_waiting(waiting, "lpm", cache)
    assert [r.rid for r in waiting] == ["long", "short", "none", "none2"]


def test_fcfs_a_disabled_cache_or_a_long_queue_keep_arrival_order():
    cache = _cache()
    _cache_prompt(cache, [1, 2, 3, 4])
    arrival = [_req("none", [9, 9]), _req("hit", [1, 2, 3, 4, 5])]
    for policy, queue in (("fcfs", arrival), ("lpm", [_req(f"n{i}", [9, 9]) for i in range(LPM_MAX_QUEUE)] + arrival)):
        waiting = deque(queue)
        order_waiting(waiting, policy, cache)
        assert [r.rid for r in waiting] == [r.rid for r in queue]
    waiting = deque(arrival)
    order_waiting(waiting, "lpm", _cache(disable=True))
    assert [r.rid for r in waiting] == ["none", "hit"]


def test_the_last_prompt_token_and_the_prompt_logprob_span_are_never_taken_from_the_cache():
    assert cacheable_len(_req("a", [1, 2, 3, 4, 5])) == 4
    assert cacheable_len(_req("b", [1, 2, 3, 4, 5], LogprobRequest(logprob_start_len=2))) == 1
    assert cacheable_len(_req("c", [1, 2, 3, 4, 5], LogprobRequest(logprob_start_len=5))) == 4


def test_chunks_fill_the_budget_or_split_at_fixed_multiples_in_the_deterministic_mode():
    req = _req("a", list(range(1, 21)))  # 20 prompt tokens
    assert chunk_len(req, budget=8) == 8
    assert chunk_len(req, budget=64) == 20
    req.kv_len = 5
    assert chunk_len(req, budget=8) == 8  # budget-bound: 5..13
    assert chunk_len(req, budget=8, fixed_chunk=8) == 3  # to the next multiple of 8: 5..8
    assert chunk_len(req, budget=2, fixed_chunk=8) == 0  # that chunk does not fit: wait
    req.kv_len = 16
    assert chunk_len(req, budget=8, fixed_chunk=8) == 4  # the prompt's end


def test_admission_checks_the_kv_budget_beside_the_reserved_tokens_and_holds_nothing_on_refusal():
    cache = _cache(slots=32)
    policy = _policy(cache)
    req = _req("a", list(range(1, 11)))  # needs 10 + MAX_NEW = 14 slots
    assert policy.try_admit(req, token_budget=8, reserved=32 - 13) is None
    assert req.req_pool_idx is None and req.kv_len == 0
    assert cache.req_to_token_pool.available_size() == 4
    assert policy.try_admit(req, token_budget=8, reserved=32 - 14) == 14
    assert req.req_pool_idx is not None


def test_admission_reuses_the_cached_prefix_and_waits_without_a_free_request_row():
    cache = _cache(rows=2)
    _cache_prompt(cache, [1, 2, 3, 4])
    policy = _policy(cache)
    req = _req("a", [1, 2, 3, 4, 5, 6])
    assert policy.try_admit(req, token_budget=8, reserved=0) == 6 + MAX_NEW - 4
    assert req.kv_len == req.cached_tokens == 4
    other = _req("b", [7, 8])
    assert policy.try_admit(other, token_budget=8, reserved=0) is not None  # the second row
    assert policy.try_admit(_req("c", [9, 9]), token_budget=8, reserved=0) is None  # no row left
    assert policy.reserved_tokens([req, other]) == (6 + MAX_NEW - 4) + (2 + MAX_NEW)


def _builder(cache: RadixCache, chunk: int) -> StepBuilder:
    args = ServerArgs(chunked_prefill_size=chunk)
    processors = LoadedLogitsProcessors.from_server_args(args, torch.device("cpu"))
    return StepBuilder(args, _policy(cache, chunk=chunk), cache, cache.req_to_token_pool, torch.device("cpu"), VOCAB, processors)


def test_a_prefill_step_splits_the_prompt_that_overruns_the_budget_and_continues_it_next():
    cache = _cache()
    builder = _builder(cache, chunk=8)
    waiting = deque([_req("a", [1, 2, 3, 4, 5, 6]), _req("b", [7, 8, 9, 10, 11, 12])])
    step, chunked = builder.prefill_step(None, waiting, [])
    assert step.forward_batch.extend_seq_lens_cpu == [6, 2] and step.sample_rows == [0]
    assert chunked is not None and chunked.rid == "b" and not waiting
    assert [r.rid for r in step.sampled_batch.reqs] == ["a"]
    step, chunked = builder.prefill_step(chunked, waiting, [chunked])
    assert step.forward_batch.extend_seq_lens_cpu == [4] and step.sample_rows == [0] and chunked is None


def test_an_n_gt_1_sibling_admitted_in_the_same_step_reuses_the_prompt_chunk_just_scheduled():
    cache = _cache()
    builder = _builder(cache, chunk=64)
    waiting = deque([_req("a-0", [1, 2, 3, 4, 5]), _req("a-1", [1, 2, 3, 4, 5])])
    step, _ = builder.prefill_step(None, waiting, [])
    assert step.forward_batch.extend_seq_lens_cpu == [5, 1]
    assert [r.cached_tokens for r in step.reqs] == [0, 4]


def test_a_prefill_step_admits_no_more_than_max_running_requests_in_all():
    cache = _cache(rows=4)
    builder = _builder(cache, chunk=64)  # max_running 4
    running = [_req(f"r{i}", [9]) for i in range(3)]
    waiting = deque([_req("a", [1, 2]), _req("b", [3, 4])])
    step, _ = builder.prefill_step(None, waiting, running)
    assert [r.rid for r in step.reqs] == ["a"] and [r.rid for r in waiting] == ["b"]


def test_priority_orders_the_queue_then_arrival_in_either_direction():
    from types import SimpleNamespace

    from sglang.srt.managers.request_extras import priority_sign, resolved_priority

    reqs = [_req(name, [1, 2]) for name in "abcde"]
    for req, priority in zip(reqs, [1, 5, 1, None, 5]):
        req.priority = priority
    args = SimpleNamespace(enable_priority_scheduling=True, schedule_low_priority_values_first=False, default_priority_value=None)
    for req in reqs:
        req.priority = resolved_priority(req.priority, args)  # no priority: the lowest, last admitted
    cache = _cache()
    high_first = deque(reqs)
    SchedulePolicy("fcfs", 8, False, cache, cache.req_to_token_pool, 4, _budget, priority_sign(args)).order(high_first)
    assert [r.rid for r in high_first] == ["b", "e", "a", "c", "d"]
    args.schedule_low_priority_values_first = True
    reqs[3].priority = resolved_priority(None, args)
    low_first = deque(reqs)
    SchedulePolicy("fcfs", 8, False, cache, cache.req_to_token_pool, 4, _budget, priority_sign(args)).order(low_first)
    assert [r.rid for r in low_first] == ["a", "c", "b", "e", "d"]
    args.default_priority_value = 3
    assert resolved_priority(None, args) == 3 and resolved_priority(7, args) == 7
    args.enable_priority_scheduling = False
    assert resolved_priority(7, args) is None and priority_sign(args) is None
