"""A failed step and guide contexts on the guide model (--guide-model-path): ResultProcessor.fail
checks each sequence's KV against the slots the step wrote on that sequence's own model. A guide
context whose guide-pool row shares an index with a served request the step wrote is untouched;
one whose guide-model KV holds a slot the step wrote there fails with its request, and those
slots leave the guide model's prefix cache."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang.srt.managers.guidance_pairs import KVSide, attach_guide
from sglang.srt.managers.result_processor import ResultProcessor
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.step_failures import StepFailureLimit
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.metrics.histogram import Histogram
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.step import Step
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 100


def _cache() -> RadixCache:
    return RadixCache(ReqToTokenPool(4, 32, "cpu"), TokenToKVPoolAllocator(64))


def _req(rid: str, prompt: list[int], guide: list[int] | None = None, guide_model=None) -> Req:
    guidance = None if guide is None else {"method": "cfg", "input_ids": guide, "weight": 2.0, "model": "guide"}
    params = SamplingParams(max_new_tokens=4, guidance=guidance)
    params.normalize(None)
    params.verify(VOCAB)
    req = Req(rid, prompt, params)
    attach_guide(req, 32, 64, guide_model)
    return req


def _hold(cache: RadixCache, req: Req) -> torch.Tensor:
    """Give `req` a row of `cache`'s pool and KV slots for its whole prompt; returns them."""
    req.req_pool_idx = cache.req_to_token_pool.alloc()
    slots = cache.alloc(len(req.origin_input_ids))
    cache.req_to_token_pool.assign([req.req_pool_idx], [0], [len(req.origin_input_ids)], slots)
    req.kv_len = len(req.origin_input_ids)
    return slots


def _setup():
    served, guide = _cache(), _cache()
    guide_model = SimpleNamespace(side=KVSide(guide, guide.req_to_token_pool), max_total_tokens=64)
    other = _req("x", [1, 2, 3, 4])
    served_slots = _hold(served, other)  # served row 0
    pair = _req("m", [5, 6, 7], guide=[8, 9, 10], guide_model=guide_model)
    _hold(served, pair)  # served row 1
    guide_slots = _hold(guide, pair.guide)  # guide-model row 0: the index of `other`'s served row
    assert pair.guide.req_pool_idx == other.req_pool_idx
    results = ResultProcessor(None, 1, VOCAB, 1, served, served.req_to_token_pool, StepFailureLimit(100, 100),
                              Histogram(), guide_model=guide_model)
    return results, other, pair, served_slots, guide_slots, guide


def _step(reqs: list[Req], kv_slots: torch.Tensor, guide_kv_slots=None) -> Step:
    step = Step(ForwardMode.DECODE, reqs, None, [], None, torch.zeros(0), kv_slots=kv_slots)
    step.guide_kv_slots = guide_kv_slots
    return step


def test_a_served_step_does_not_fail_a_guide_model_context_with_the_same_row_index():
    results, other, pair, served_slots, _, _ = _setup()
    step = _step([other], served_slots[:1])
    results.fail(step, RuntimeError("boom"), None, [other, pair, pair.guide])
    assert other.finished() and other.kv_failed
    assert not pair.finished() and not pair.guide.kv_failed


def test_a_step_that_wrote_a_guide_model_slot_fails_the_guide_context_holding_it():
    results, other, pair, _, guide_slots, guide_cache = _setup()
    guide_cache.cache_prefill(pair.guide)  # its prompt is in the guide model's prefix cache
    step = _step([other], torch.empty(0, dtype=torch.int64), guide_kv_slots=guide_slots[-1:])
    results.fail(step, RuntimeError("boom"), None, [other, pair, pair.guide])
    assert pair.finished() and pair.guide.kv_failed  # aborting the guide aborts its request
    assert guide_cache.prefix_len(pair.guide.origin_input_ids) < len(pair.guide.origin_input_ids)
