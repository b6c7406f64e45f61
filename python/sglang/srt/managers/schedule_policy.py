"""Admission policy: which waiting requests enter a prefill step, in what order, and how many of
their prompt tokens.

- Order: `--schedule-policy lpm` puts the longest cached prefix first, so requests sharing a
  prefix run while it is still cached; `fcfs` (or a queue longer than LPM_MAX_QUEUE) keeps
  arrival order. With `--enable-priority-scheduling` (fcfs only) the order is by priority, then
  arrival.
- KV budget: a request enters only if the free KV slots (evictable prefixes counted as free),
  less what the admitted requests may still use, hold its prompt plus every token it may
  generate. A request admitted is never short of a slot later.
- Chunking: a step prefills at most `--chunked-prefill-size` prompt tokens; a longer prompt is
  split over steps. In the deterministic mode a prompt is split at fixed multiples of that size.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from sglang.srt.managers.beam_coordinator import member_rows_needed
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.step import Step

# Longest queue LPM orders: beyond it, matching every waiting prompt each step costs more than
# the reuse it finds saves.
LPM_MAX_QUEUE = 128


def cacheable_len(req: Req) -> int:
    """Most fill tokens (managers/schedule_batch.Req.fill_ids) a request may take from the cache:
    never the last (its logits give the next output token), nor any whose prompt logprobs it asked
    for (they come from the logits of the position before; a retracted request has them already)."""
    limit = len(req.fill_ids) - 1
    if wants_prompt_logprobs(req):
        limit = min(limit, req.logprob.logprob_start_len - 1)
    return limit


def wants_prompt_logprobs(req: Req) -> bool:
    """Whether the request's prefill computes prompt logprobs: asked for, and not yet computed (a
    request re-prefilled after a retraction has sent them with its first prefill)."""
    return req.logprob is not None and req.logprob.logprob_start_len < len(req.origin_input_ids) and not req.output_ids


def order_waiting(waiting: deque[Req], policy: str, tree_cache: RadixCache) -> None:
    """Put the waiting queue in admission order, in place: longest cached prefix first under
    "lpm" (stable, so arrival order among equals), arrival order otherwise."""
    if policy != "lpm" or tree_cache.disable or len(waiting) > LPM_MAX_QUEUE:
        return
    matched = {id(r): tree_cache.match_len(r, cacheable_len(r)) for r in waiting}
    ordered = sorted(waiting, key=lambda r: -matched[id(r)])
    waiting.clear()
    waiting.extend(ordered)


def order_by_priority(waiting: deque[Req], sign: int) -> None:
    """--enable-priority-scheduling: higher priorities first (lower ones with
    --schedule-low-priority-values-first, sign 1), stable, so arrival order among equals."""
    ordered = sorted(waiting, key=lambda r: r.priority * sign)
    waiting.clear()
    waiting.extend(ordered)


def chunk_len(req: Req, budget: int, fixed_chunk: Optional[int] = None) -> int:
    """Fill tokens of `req` (its prompt, after a retraction also its output so far) to prefill in
    a step with `budget` prompt tokens left; 0 when its next fixed chunk does not fit. With
    `fixed_chunk` (the deterministic mode) the prompt is split at multiples of it from its start,
    never where the budget left by batch-mates ends: a prompt gets the same chunks, so the same
    bits, in every batch."""
    remaining = len(req.fill_ids) - req.kv_len
    if fixed_chunk is None:
        return min(remaining, budget)
    n = min(remaining, fixed_chunk - req.kv_len % fixed_chunk)
    return n if n <= budget else 0


def release_kv(tree_cache: RadixCache, req: Req) -> None:
    """Give back a request's row and KV slots: its tokens stay cached for reuse, unless a failed
    step wrote them (kv_failed)."""
    if req.req_pool_idx is None:
        return
    if req.kv_failed:
        tree_cache.discard(req)
    else:
        tree_cache.release(req)
    req.req_pool_idx = None


def in_flight_ends_running(in_flight: Optional[Step], running: list[Req]) -> bool:
    """Overlap: whether the in-flight decode step gives every running request its last token
    (max_new_tokens). A next decode step would then only compute tokens to drop, and on the
    CPU it would hold the cores while the last tokens go out and the next request comes in."""
    if in_flight is None or in_flight.mode != ForwardMode.DECODE:
        return False
    stepping = {id(req) for req in in_flight.reqs}
    return all(id(req) in stepping and _last_token_in_flight(req) for req in running)


def _last_token_in_flight(req: Req) -> bool:
    """Whether the token of the in-flight step (one past the host's output_ids) ends `req` by length."""
    limit = req.sampling_params.max_new_tokens
    return limit is not None and len(req.output_ids) + 1 >= limit


class SchedulePolicy:
    """Admission decisions over the server's KV pools. `max_running`: the most requests admitted
    at once; `budget(req)`: the KV tokens a request may use in total (prompt plus every token it
    may generate)."""

    def __init__(
        self,
        policy: str,
        chunked_prefill_size: int,
        deterministic: bool,
        tree_cache: RadixCache,
        req_to_token_pool: ReqToTokenPool,
        max_running: int,
        budget: Callable[[Req], int],
        priority_sign: Optional[int] = None,
    ) -> None:
        self.policy = policy
        self.chunked_prefill_size = chunked_prefill_size
        self.fixed_chunk = chunked_prefill_size if deterministic else None
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        self.max_running = max_running
        self.budget = budget
        # Takes the request slots an admitted request needs besides its own (beam members).
        self.reserve_rows: Callable[[Req], None] = lambda req: None
        self.priority_sign = priority_sign  # None: no priority scheduling

    def order(self, waiting: deque[Req]) -> None:
        if self.priority_sign is not None:
            order_by_priority(waiting, self.priority_sign)
            return
        order_waiting(waiting, self.policy, self.tree_cache)

    def chunk_len(self, req: Req, budget: int) -> int:
        return chunk_len(req, budget, self.fixed_chunk)

    def reserved_tokens(self, active: list[Req]) -> int:
        """KV tokens the admitted, unfinished requests may still claim."""
        return sum(max(self.budget(r) - r.kv_len, 0) for r in active if not r.finished())

    def try_admit(self, req: Req, token_budget: int, reserved: int) -> Optional[int]:
        """Give `req` a request row and its cached prefix if the rest of its budget fits beside
        `reserved` and its next chunk fits `token_budget`; returns the KV tokens it may still
        claim. None: it keeps waiting, holding nothing (it matches again next step)."""
        if self.req_to_token_pool.available_size() <= member_rows_needed(req):
            return None
        req.req_pool_idx = self.req_to_token_pool.alloc()
        req.kv_len = req.cached_tokens = self.tree_cache.admit(req, cacheable_len(req))
        need = self.budget(req) - req.kv_len
        if need > self.tree_cache.available_size() - reserved or self.chunk_len(req, token_budget) == 0:
            release_kv(self.tree_cache, req)
            req.kv_len = req.cached_tokens = 0
            return None
        self.reserve_rows(req)
        return need
