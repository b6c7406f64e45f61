"""The running batch on its own: prefilled batches join it, finished requests leave it (returned
for release), and both wait for the in-flight step first."""

from __future__ import annotations

import torch

from sglang.srt.managers.running_batch import RunningBatch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.managers.step_builder import StepBuilder
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

VOCAB = 100


def _batch(builder: StepBuilder, *rids_and_temperatures: tuple[str, float]) -> ScheduleBatch:
    reqs = []
    for rid, temperature in rids_and_temperatures:
        params = SamplingParams(max_new_tokens=4, temperature=temperature)
        params.normalize(None)
        params.verify(VOCAB)
        reqs.append(Req(rid, [1, 2], params))
    return builder.sampled_batch(reqs)


def _builder() -> StepBuilder:
    args = ServerArgs()
    cache = RadixCache(ReqToTokenPool(8, 16, "cpu"), TokenToKVPoolAllocator(32))
    policy = SchedulePolicy("fcfs", 8, False, cache, cache.req_to_token_pool, 8, lambda r: 6)
    processors = LoadedLogitsProcessors.from_server_args(args, torch.device("cpu"))
    return StepBuilder(args, policy, cache, cache.req_to_token_pool, torch.device("cpu"), VOCAB, processors)


def test_prefilled_batches_join_and_finished_requests_leave_after_the_in_flight_step():
    builder, running, waits = _builder(), RunningBatch(), []
    assert running.empty() and running.update(lambda: waits.append(1)) == [] and not waits  # nothing to do: no wait
    first = _batch(builder, ("a", 0.5), ("b", 1.0))
    running.to_merge.append(first)
    assert not running.empty() and [r.rid for r in running.reqs()] == ["a", "b"]
    assert running.update(lambda: waits.append(1)) == [] and waits == [1]
    assert running.batch is first  # the first batch becomes the running one (the penalty state reads it)
    running.to_merge.append(_batch(builder, ("c", 0.25)))
    first.reqs[0].abort("gone")
    finished = running.update(lambda: waits.append(2))
    assert [r.rid for r in finished] == ["a"] and waits == [1, 2]
    assert running.batch is first and [r.rid for r in running.batch.reqs] == ["b", "c"]
    assert running.batch.sampling_info.temperatures.flatten().tolist() == [1.0, 0.25]
    for req in running.batch.reqs:
        req.abort("gone")
    assert [r.rid for r in running.update(lambda: None)] == ["b", "c"]
    assert running.batch is None and running.empty()
