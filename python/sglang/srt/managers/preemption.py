"""Priority preemption: a waiting request of much higher priority takes the place of running ones.

With --enable-priority-scheduling (and without --disable-priority-preemption), when the request at
the front of the waiting queue cannot be admitted because the request slots
(--max-running-requests, the request-to-token rows) or the KV budget are taken, running requests
whose priority is lower by more than --priority-scheduling-preemption-threshold (SGLang's test:
the difference must exceed it) are retracted for it: lowest priority first, then latest arrival.
Requests are retracted only when their place lets the waiting request in.

A retracted request leaves the running batch, gives back its row and KV slots (its prompt and
output so far stay in the prefix cache, evictable, so its re-prefill usually reuses them), and
goes back to the waiting queue. Once re-admitted it prefills over its prompt plus the output it
has (Req.fill_ids) and samples its next token from that prefill: output ids, logprobs, stop
conditions and max_new_tokens continue from where it left off, penalties and logits processors
are rebuilt from its output ids, and a seeded row draws at the same positions as without the
retraction. Not retracted: beam-search rows and guided (guidance pair) rows. Off under
speculative decoding (draft state is per running request) and in the deterministic mode (a
re-prefilled K/V has other bits than the decoded one).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

from sglang.srt.managers.beam_coordinator import member_rows_needed
from sglang.srt.managers.guidance_pairs import on_served_model
from sglang.srt.managers.running_batch import RunningBatch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy, release_kv


class Preemption:
    """Victim choice and retraction over a SchedulePolicy's pools. `sign`: the sort-key sign of a
    priority (request_extras.priority_sign: -1 when higher values go first); None: preemption off."""

    def __init__(self, policy: SchedulePolicy, threshold: int, sign: Optional[int]) -> None:
        self.policy = policy
        self.threshold = threshold
        self.sign = sign

    @classmethod
    def from_server_args(cls, server_args: Any, policy: SchedulePolicy, speculative: bool) -> "Preemption":
        """The server's preemption; off (sign None) where the module docstring says."""
        off = server_args.disable_priority_preemption or server_args.enable_deterministic_inference or speculative
        return cls(policy, server_args.priority_scheduling_preemption_threshold, None if off else policy.priority_sign)

    def run(
        self, waiting: deque[Req], running: RunningBatch, active: Callable[[], list[Req]], read_in_flight: Callable[[], None]
    ) -> None:
        """Before a prefill step is built: retract the running requests the waiting ones need.
        The plan is host work only; when it finds victims, the in-flight step's result is read
        first (its tokens belong to the requests that leave), and the plan is made again over
        the settled state. `active`: the admitted requests not yet released."""
        if self.sign is None or not waiting or running.batch is None:
            return
        if not self.victims(waiting, running.batch.reqs, active()):
            return
        read_in_flight()
        victims = self.victims(waiting, running.batch.reqs, active())
        if victims:
            self.retract(victims, running, waiting)

    def outranks(self, waiting: Req, running: Req) -> bool:
        """Whether `waiting`'s priority exceeds `running`'s by more than the threshold."""
        return (waiting.priority - running.priority) * -self.sign > self.threshold

    def victims(self, waiting: deque[Req], running: list[Req], active: list[Req]) -> list[Req]:
        """The running requests to retract so that the waiting requests, in admission order, get
        in; [] when none needs it or none can be made room for. `running`: the running batch's
        requests (the candidates); `active`: every admitted request not yet released."""
        if self.sign is None or not waiting:
            return []
        policy = self.policy
        served = on_served_model(active)
        slots = policy.max_running - len(served)
        rows = policy.req_to_token_pool.available_size()
        kv = policy.tree_cache.available_size() - policy.reserved_tokens(served)
        candidates: Optional[list[Req]] = None  # sorted when a waiting request first does not fit
        chosen: list[Req] = []
        policy.order(waiting)
        for req in waiting:
            if req.guide is not None:
                break  # a guided pair is admitted as a pair (guidance_pairs.admit_pair), not planned here
            need_rows, need_kv = 1 + member_rows_needed(req), policy.budget(req)
            taken: list[Req] = []
            while not (slots >= 1 and rows >= need_rows and kv >= need_kv):
                if candidates is None:  # least urgent first: lowest priority, then the latest arrival
                    candidates = sorted((r for r in running if preemptible(r)), key=lambda r: (r.priority * -self.sign, -r.arrival))
                if not candidates or not self.outranks(req, candidates[0]):
                    return chosen
                victim = candidates.pop(0)
                taken.append(victim)
                slots, rows, kv = slots + 1, rows + 1, kv + self.freed_kv(victim)
            chosen += taken
            slots, rows, kv = slots - 1, rows - need_rows, kv - need_kv
        return chosen

    def freed_kv(self, req: Req) -> int:
        """KV tokens retracting `req` gives back for certain: what it may still claim, and the
        slots it computed itself (its cached prefix may stay locked by other requests)."""
        return max(self.policy.budget(req) - req.kv_len, 0) + req.kv_len - req.cached_tokens

    def retract(self, victims: list[Req], running: RunningBatch, waiting: deque[Req]) -> None:
        """Take `victims` out of the running batch (nothing in flight reads it), free their rows
        and KV slots into the prefix cache, and queue them again."""
        running.remove(victims)
        for req in victims:
            release_kv(self.policy.tree_cache, req)
            req.kv_len = req.cached_tokens = 0
            req.retraction_count += 1
            waiting.append(req)


def preemptible(req: Req) -> bool:
    """A running request that may be retracted: unfinished, no beam-search row, no guided pair."""
    return not req.finished() and req.beam is None and req.guide is None and not req.is_guide
