"""The pieces of step-failure handling on their own: the failure limit's window, the fault
hook's schedule, and the radix cache's poisoning of a failed step's slots."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.step_failures import StepError, StepFailureLimit, StepFaultHook
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams


def test_the_limit_counts_failures_within_the_window_of_steps():
    limit = StepFailureLimit(limit=3, window=10)
    limit.record(1, "a")
    limit.record(5, "b")
    limit.record(11, "c")  # step 1 left the window (steps 2..11)
    with pytest.raises(RuntimeError, match=r"3 scheduler steps failed within the last 10 steps .*--step-failure-limit 3.* Last failure: d"):
        limit.record(12, "d")
    assert limit.total == 4


def test_the_fault_hook_fails_the_same_steps_on_every_run_and_only_on_its_rank():
    failing = [i for i in range(1, 400) if _raises(StepFaultHook("0.1", tp_rank=0), i)]
    assert failing == [i for i in range(1, 400) if _raises(StepFaultHook("0.1", tp_rank=0), i)]
    assert 20 <= len(failing) <= 60  # Binomial(399, 0.1): mean 40, sd 6
    assert not any(_raises(StepFaultHook("0.1:1", tp_rank=0), i) for i in failing)
    assert all(_raises(StepFaultHook("0.1:1", tp_rank=1), i) for i in failing)
    assert not any(_raises(StepFaultHook(None, tp_rank=0), i) for i in range(1, 400))


def _raises(hook: StepFaultHook, step: int) -> bool:
    try:
        hook.check(step)
    except StepError:
        return True
    return False


def _admit(cache: RadixCache, prompt: list[int]) -> Req:
    req = Req(f"r{prompt}", prompt, SamplingParams(max_new_tokens=4))
    req.req_pool_idx = cache.req_to_token_pool.alloc()
    req.kv_len = req.cached_tokens = cache.admit(req, len(prompt) - 1)
    n = len(prompt) - req.kv_len
    slots = cache.alloc(n)
    cache.req_to_token_pool.assign([req.req_pool_idx], [req.kv_len], [n], slots)
    req.kv_len += n
    cache.cache_prefill(req)
    return req


def test_a_failed_steps_slots_are_never_matched_and_are_evicted_once_unused():
    cache = RadixCache(ReqToTokenPool(8, 64, "cpu"), TokenToKVPoolAllocator(64))
    healthy = _admit(cache, [1, 2, 3, 4])
    cache.release(healthy)
    failed = _admit(cache, [1, 2, 3, 4, 7, 8, 9])  # reuses [1, 2, 3, 4]; its step computes [7, 8, 9]
    assert failed.cached_tokens == 4
    new_slots = cache.req_to_token_pool.slots_of(failed.req_pool_idx, 7)[4:].clone()
    cache.poison(new_slots)
    assert cache.prefix_len([1, 2, 3, 4, 7, 8, 9]) == 4  # the healthy prefix still matches
    cache.discard(failed)
    late = _admit(cache, [1, 2, 3, 4, 7, 8, 9, 10])
    assert late.cached_tokens == 4
    assert not torch.isin(cache.req_to_token_pool.slots_of(late.req_pool_idx, 8), new_slots).any()
    cache.release(late)
    cache.evict(64)  # nothing holds anything: every slot goes back
    assert cache.allocator.available_size() == 64 and cache.total_size() == 0
