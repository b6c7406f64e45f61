"""Chunked prefill of guided pairs (managers/guidance_pairs.py, StepBuilder.prefill_step), with no
model: a pair's two prompts advance as one entry under --chunked-prefill-size, the guide's first,
both ending in the step where the main row samples; the pair is the request left mid-prefill, and
nothing joins behind it. Token equality with unchunked prefill: test/sampling/test_guidance_chunked_e2e.py."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import torch

from sglang.srt.managers.guidance_pairs import KVSide, attach_guide, pair_chunk_lens
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.managers.step_builder import StepBuilder
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

VOCAB = 100
MAX_NEW = 4
CONTEXT = 128


def _req(rid: str, prompt: list[int], guide: list[int] | None = None, guide_model=None) -> Req:
    model = "self" if guide_model is None else "guide"
    guidance = None if guide is None else {"method": "cfg", "input_ids": guide, "weight": 2.0, "model": model}
    params = SamplingParams(max_new_tokens=MAX_NEW, guidance=guidance)
    params.normalize(None)
    params.verify(VOCAB)
    req = Req(rid, prompt, params)
    attach_guide(req, CONTEXT, 512, guide_model)
    return req


def _policy(chunk: int, deterministic: bool = False) -> SchedulePolicy:
    cache = RadixCache(ReqToTokenPool(8, CONTEXT, "cpu"), TokenToKVPoolAllocator(512), disable=True)
    budget = lambda req: len(req.origin_input_ids) + MAX_NEW  # noqa: E731
    return SchedulePolicy("fcfs", chunk, deterministic, cache, cache.req_to_token_pool, 6, budget)


def _builder(chunk: int, deterministic: bool = False) -> StepBuilder:
    policy = _policy(chunk, deterministic)
    cache = policy.tree_cache
    args = ServerArgs(chunked_prefill_size=chunk)
    processors = LoadedLogitsProcessors.from_server_args(args, torch.device("cpu"))
    return StepBuilder(args, policy, cache, cache.req_to_token_pool, torch.device("cpu"), VOCAB, processors)


def _rows(step) -> list[tuple[str, int]]:
    return [(r.rid, n) for r, n in zip(step.reqs, step.forward_batch.extend_seq_lens_cpu)]


def test_a_pair_prefills_guide_first_in_chunks_and_both_prompts_end_in_the_sampling_step():
    builder = _builder(chunk=8)
    pair = _req("a", list(range(10, 20)), guide=list(range(30, 42)))  # main 10 tokens, guide 12
    waiting = deque([pair, _req("b", [1, 2, 3])])
    steps, left = [], []
    chunked = None
    for _ in range(3):
        step, chunked = builder.prefill_step(chunked, waiting, [pair, pair.guide])
        steps.append(step)
        left.append(chunked.rid if chunked is not None else None)
    assert _rows(steps[0]) == [("a:guide", 8)] and steps[0].sampled_batch is None  # the guide's tokens alone
    assert _rows(steps[1]) == [("a:guide", 3), ("a", 5)] and steps[1].sampled_batch is None
    assert _rows(steps[2]) == [("a:guide", 1), ("a", 5), ("b", 2)]  # both ends, then the next request
    assert steps[2].sample_rows == [1] and steps[2].guide_rows == [0]
    assert left == ["a", "a", "b"]


def test_nothing_joins_a_step_that_leaves_the_pair_mid_prefill():
    builder = _builder(chunk=40)
    pair = _req("a", list(range(40)), guide=[7])  # 41 tokens: one more than a step
    waiting = deque([pair, _req("b", [1, 2])])
    step, chunked = builder.prefill_step(None, waiting, [])
    assert _rows(step) == [("a", 39)] and chunked is pair and [r.rid for r in waiting] == ["b"]
    step, chunked = builder.prefill_step(chunked, waiting, [pair, pair.guide])
    assert _rows(step) == [("a:guide", 1), ("a", 1), ("b", 2)] and chunked is None
    assert step.sample_rows == [1, 2] and step.guide_rows == [0]


def test_a_pair_that_fits_the_budget_prefills_whole_in_one_step():
    builder = _builder(chunk=64)
    pair = _req("a", list(range(10, 20)), guide=list(range(30, 42)))
    step, chunked = builder.prefill_step(None, deque([pair]), [])
    assert _rows(step) == [("a:guide", 12), ("a", 10)] and chunked is None and step.sample_rows == [1]


def test_deterministic_mode_splits_each_prompt_at_fixed_multiples_whatever_the_budget_left():
    builder = _builder(chunk=8, deterministic=True)
    pair = _req("a", list(range(10, 22)), guide=list(range(30, 41)))  # main 12 = 8 + 4, guide 11 = 8 + 3
    assert pair_chunk_lens(builder.policy, pair, 8, first=True) == (8, 0)
    assert pair_chunk_lens(builder.policy, pair, 5, first=False) == (0, 0)  # its fixed chunk does not fit
    step, chunked = builder.prefill_step(None, deque([pair]), [])
    assert _rows(step) == [("a:guide", 8)]
    step, chunked = builder.prefill_step(chunked, deque(), [pair, pair.guide])
    assert _rows(step) == [("a", 8)]
    step, chunked = builder.prefill_step(chunked, deque(), [pair, pair.guide])
    assert _rows(step) == [("a:guide", 3), ("a", 4)] and chunked is None and step.sample_rows == [1]


def test_guide_model_chunks_alone_leave_the_served_model_without_rows():
    builder = _builder(chunk=8)
    guide_policy = _policy(chunk=8)
    guide_model = SimpleNamespace(side=KVSide(guide_policy.tree_cache, guide_policy.req_to_token_pool),
                                  policy=guide_policy, max_total_tokens=512)
    builder.guide_model = guide_model
    pair = _req("a", list(range(10, 14)), guide=list(range(30, 42)), guide_model=guide_model)
    step, chunked = builder.prefill_step(None, deque([pair]), [])
    assert step.forward_batch.batch_size == 0 and step.sampled_batch is None and chunked is pair
    assert step.guide_forward_batch.extend_seq_lens_cpu == [8] and step.guide_kv_slots.numel() == 8
    step, chunked = builder.prefill_step(chunked, deque(), [pair, pair.guide])
    assert step.guide_forward_batch.extend_seq_lens_cpu == [4] and _rows(step) == [("a", 4)] and chunked is None
    assert step.sample_rows == [0] and step.guide_rows == [1]  # the guide model's row follows the served rows
