"""Step building: the prefill (extend) and decode Steps the scheduler submits, with their
ForwardBatch, the sampling batch of the rows that sample, and the KV slots each step writes.
Which waiting requests a prefill step takes is the SchedulePolicy's decision."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple, Optional, Sequence

import torch

from sglang.srt.managers.beam_coordinator import beam_ask
from sglang.srt.managers.guidance_pairs import (
    GuideSide,
    KVSide,
    admit_pair,
    guide_rows,
    on_guide_model,
    on_served_model,
    pair_chunk_lens,
    remaining,
    with_guides,
)
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import SchedulePolicy, wants_prompt_logprobs
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.step import Step
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import host_to_device


class PromptChunk(NamedTuple):
    req: Req
    start: int  # first prompt position of the chunk (the tokens before it are cached)
    length: int
    slots: torch.Tensor  # [length] int64 KV slots, host


class StepBuilder:
    def __init__(
        self,
        server_args: ServerArgs,
        policy: SchedulePolicy,
        tree_cache: RadixCache,
        req_to_token_pool: ReqToTokenPool,
        device: torch.device,
        vocab_size: int,
        logits_processors: LoadedLogitsProcessors,
    ) -> None:
        self.policy = policy
        self.device = device
        self.vocab_size = vocab_size
        self.enable_custom_logit_processor = server_args.enable_custom_logit_processor
        self.custom_logit_processor_allowlist = server_args.allowlist()
        self.logits_processors = logits_processors
        self.served = KVSide(tree_cache, req_to_token_pool)
        self.guide_model: Optional[GuideSide] = None  # --guide-model-path: set by the scheduler

    def prefill_step(
        self, chunked_req: Optional[Req], waiting: deque[Req], active: list[Req]
    ) -> tuple[Optional[Step], Optional[Req]]:
        """The next prefill step, if any request has prompt tokens to run, and the request it
        leaves mid-prefill. It continues `chunked_req` (the request the last prefill step left
        unfinished), then takes requests from the front of `waiting` in policy order while the
        step's prompt-token budget, the KV budget and the request slots last. `active`: the
        admitted requests not yet released (`chunked_req` among them). A guided request and its
        guide context are one entry (guidance_pairs.pair_chunk_lens)."""
        budget = self.policy.chunked_prefill_size
        chunks: list[PromptChunk] = []
        guide_chunks: list[PromptChunk] = []  # the guide model's
        if chunked_req is not None and chunked_req.guide is not None:
            budget -= self.add_pair_chunks(chunks, guide_chunks, chunked_req, *pair_chunk_lens(self.policy, chunked_req, budget, True))
            if remaining(chunked_req) or remaining(chunked_req.guide):
                budget = 0  # the pair stays mid-prefill: nothing joins behind it (one such request per step)
        elif chunked_req is not None:
            budget -= self.add_chunk(chunks, chunked_req, self.policy.chunk_len(chunked_req, budget))
        served = on_served_model(active)
        reserved = self.policy.reserved_tokens(served)
        guide_reserved = self.guide_model.policy.reserved_tokens(on_guide_model(active)) if self.guide_model else 0
        admitted = len(served)
        self.policy.order(waiting)
        while waiting and budget > 0 and admitted < self.policy.max_running:
            req = waiting[0]
            if req.guide is None:
                need = self.policy.try_admit(req, budget, reserved)
                if need is None:
                    break
                waiting.popleft()
                n = self.add_chunk(chunks, req, self.policy.chunk_len(req, budget))
                reserved, budget, admitted = reserved + need - n, budget - n, admitted + 1
                continue
            same_model = req.guide.side is None
            guide_policy = self.policy if same_model else self.guide_model.policy
            first = not chunks and not guide_chunks
            admission = admit_pair(self.policy, guide_policy, req, budget, (reserved, guide_reserved), admitted, first)
            if admission is None:
                break
            waiting.popleft()
            need, need_guide, g, n = admission
            self.add_pair_chunks(chunks, guide_chunks, req, g, n)
            if same_model:
                reserved, admitted = reserved + need + need_guide - n - g, admitted + 2
            else:
                reserved, guide_reserved, admitted = reserved + need - n, guide_reserved + need_guide - g, admitted + 1
            budget -= n + g
            if remaining(req) or remaining(req.guide):
                break  # the pair continues in the next step, the one request a step leaves mid-prefill
        if not chunks and not guide_chunks:
            return None, None
        return self.extend_step(chunks, guide_chunks)

    def add_pair_chunks(
        self, chunks: list[PromptChunk], guide_chunks: list[PromptChunk], req: Req, guide_len: int, main_len: int
    ) -> int:
        """Schedule a guided pair's next prompt tokens, the guide's row first (on the guide model:
        in `guide_chunks`); returns their count."""
        if guide_len:
            self.add_chunk(chunks if req.guide.side is None else guide_chunks, req.guide, guide_len)
        if main_len:
            self.add_chunk(chunks, req, main_len)
        return guide_len + main_len

    def add_chunk(self, chunks: list[PromptChunk], req: Req, length: int) -> int:
        """Schedule the next `length` prompt tokens of `req` and give them KV slots; returns
        `length`. The chunk enters the prefix cache at once, so a request admitted later in this
        same step (an n > 1 sibling) already reuses it."""
        start = req.kv_len
        side = self._side(req)
        slots = self._allocate_slots([req], [length], side)
        side.tree_cache.cache_prefill(req)
        chunks.append(PromptChunk(req, start, length, slots))
        return length

    def extend_step(self, chunks: list[PromptChunk], guide_chunks: Sequence[PromptChunk] = ()) -> tuple[Step, Optional[Req]]:
        """The prefill step of `chunks`, and the request whose prompt it leaves unfinished (it
        continues in the next prefill step), if any. Rows whose prompt completes sample.
        `guide_chunks`: guide contexts' prompts on the guide model, its forward in the same step.
        A guide context's unfinished prompt leaves its request unfinished; a step may hold guide
        chunks alone (on the guide model: no served-model rows, whose forward is then skipped)."""
        reqs, input_ids, sample_rows, spans = [], [], [], []
        unfinished = next((c.req.main for c in guide_chunks if c.start + c.length < len(c.req.origin_input_ids)), None)
        fill_lens = []  # [rows] tokens each row's prefill runs over in all (the prompt; after a retraction, with the output)
        for row, (req, start, n, _) in enumerate(chunks):
            reqs.append(req)
            fill = req.fill_ids
            fill_lens.append(len(fill))
            input_ids.extend(fill[start : start + n])
            if start + n < len(fill):
                unfinished = req.main if req.is_guide else req
            elif not req.is_guide:
                sample_rows.append(row)
            if wants_prompt_logprobs(req):
                spans.append((row, req.logprob.logprob_start_len, start, start + n))
        prefix_lens = [chunk.start for chunk in chunks]
        extend_lens = [chunk.length for chunk in chunks]
        # [sum extend_lens] int64, host (empty when the step holds guide-model chunks alone)
        out_cache_loc = torch.cat([chunk.slots for chunk in chunks] or [torch.empty(0, dtype=torch.int64)])
        forward_batch = self._forward_batch(ForwardMode.EXTEND, reqs, input_ids, prefix_lens, extend_lens, out_cache_loc)
        forward_batch.return_input_logits = bool(spans)
        sampled = [reqs[r] for r in sample_rows]
        sampled_batch = self.sampled_batch(sampled) if sampled else None
        # [S] the position of each sampled row's last fill token
        sample_positions = host_to_device([fill_lens[r] - 1 for r in sample_rows], self.device)
        step = Step(ForwardMode.EXTEND, reqs, forward_batch, sample_rows, sampled_batch, sample_positions, spans, kv_slots=out_cache_loc)
        step.beam_rows, step.beam_candidates = beam_ask(sampled)
        guide_reqs = [chunk.req for chunk in guide_chunks]
        if guide_chunks:
            step.guide_kv_slots = torch.cat([c.slots for c in guide_chunks])  # [Ng] int64, host
            step.guide_forward_batch = self._forward_batch(
                ForwardMode.EXTEND, guide_reqs, [t for c in guide_chunks for t in c.req.origin_input_ids[c.start : c.start + c.length]],
                [c.start for c in guide_chunks], [c.length for c in guide_chunks], step.guide_kv_slots,
            )
        step.guide_rows = guide_rows(reqs, guide_reqs, sampled)
        return step, unfinished

    def decode_step(self, running: ScheduleBatch) -> Step:
        """One token for every running request; its input ids are read from future_tokens on the
        worker. The guide contexts of guided requests follow them as rows that do not sample."""
        guided = with_guides(list(running.reqs))
        reqs, guide_reqs = on_served_model(guided), on_guide_model(guided)
        forward_batch, out_cache_loc = self._decode_batch(reqs, self.served)
        guide_batch, guide_slots = self._decode_batch(guide_reqs, guide_reqs[0].side) if guide_reqs else (None, None)
        # A decode row samples at the position of its one input token.
        sampled = len(running.reqs)
        positions = forward_batch.positions if sampled == len(reqs) else forward_batch.positions[:sampled]
        step = Step(ForwardMode.DECODE, reqs, forward_batch, list(range(sampled)), running, positions, kv_slots=out_cache_loc)
        step.guide_forward_batch, step.guide_kv_slots = guide_batch, guide_slots
        step.guide_rows = guide_rows(reqs, guide_reqs, running.reqs)
        step.beam_rows, step.beam_candidates = beam_ask(list(running.reqs))
        return step

    def _decode_batch(self, reqs: list[Req], side: KVSide) -> tuple[ForwardBatch, torch.Tensor]:
        """The decode ForwardBatch of `reqs` on one model's KV, and its [B] int64 host KV slots."""
        prefix_lens = [req.kv_len for req in reqs]
        out_cache_loc = self._allocate_slots(reqs, [1] * len(reqs), side)  # [B] int64, host
        return self._forward_batch(ForwardMode.DECODE, reqs, None, prefix_lens, [1] * len(reqs), out_cache_loc), out_cache_loc

    def _side(self, req: Req) -> KVSide:
        return req.side if req.is_guide and req.side is not None else self.served

    def sampled_batch(self, reqs: list[Req]) -> ScheduleBatch:
        """The ScheduleBatch of newly prefilled requests, with its SamplingBatchInfo; it joins the
        running batch once its step's result is read."""
        batch = ScheduleBatch(
            reqs=list(reqs),
            device=self.device,
            enable_custom_logit_processor=self.enable_custom_logit_processor,
            custom_logit_processor_allowlist=self.custom_logit_processor_allowlist,
            loaded_logits_processors=self.logits_processors,
        )
        batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, self.vocab_size)
        return batch

    def allocate_slots(self, reqs: list[Req], lens: list[int]) -> torch.Tensor:
        """[sum lens] int64 KV slots of the served model on the host (speculative verify steps)."""
        return self._allocate_slots(reqs, lens, self.served)

    def _allocate_slots(self, reqs: list[Req], lens: list[int], side: KVSide) -> torch.Tensor:
        """[sum lens] int64 KV slots of `side` on the host, recorded in its req_to_token after each request's kv_len."""
        slots = side.tree_cache.alloc(sum(lens))
        if slots is None:
            raise RuntimeError("KV cache exhausted despite admission control")
        side.pool.assign([r.req_pool_idx for r in reqs], [r.kv_len for r in reqs], lens, slots)
        for req, n in zip(reqs, lens):
            req.kv_len += n
        return slots

    def _forward_batch(
        self,
        mode: ForwardMode,
        reqs: list[Req],
        input_ids: Optional[list[int]],
        prefix_lens: list[int],
        extend_lens: list[int],
        out_cache_loc: torch.Tensor,
    ) -> ForwardBatch:
        return ForwardBatch.init_new(
            mode, input_ids, [r.req_pool_idx for r in reqs], prefix_lens, extend_lens, out_cache_loc, self.device
        )
