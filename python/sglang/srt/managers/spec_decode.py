"""Speculative decoding in the scheduler: which decode steps verify drafts, the verify Step, and
reading its result back into the requests' KV rows and counters.

A verify step forwards [last token, d1..dk] of every running request (KV slots for all k + 1
positions) in the shape the model runner's VerifyPlan names: one extend padded to its verify
graphs' width, one decode row per token, or a plain extend; the Sampler verifies every position
(layers/sampler_verify.py). When
its result is read, each request keeps the KV of its last token and its accepted drafts; the
slots of the rejected drafts go back. With NGRAM the overlap schedule stays on: a decode step
overlaps the next one's building as usual, and the scheduler reads the in-flight step's result
first whenever the next step may verify (must_settle). A draft model's steps run without it.

A step decodes without speculation when more requests run than --speculative-disable-batch-size
or no request has a draft. Every step is exact either way: penalty state, once a verify has
folded drafts into it, is rebuilt from the requests' host history before the next step.
"""

from __future__ import annotations

from typing import Optional, Protocol

from sglang.srt.layers.sampler_verify import positions_independent
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.step_builder import StepBuilder
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.step import SpecDrafts, Step, StepResult, VerifyPlan
from sglang.srt.sampling.penaltylib import BatchedPenalizerOrchestrator
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.ngram import ngram_drafts
from sglang.srt.utils import host_to_device

PAD_TOKEN = 0  # what a padded verify forwards after a request's drafts


class SpecDecoding:
    def __init__(self, server_args: ServerArgs, builder: StepBuilder, tree_cache: RadixCache, context_len: int,
                 draft_source: Optional["DraftSource"] = None, plan: VerifyPlan = VerifyPlan()) -> None:
        self.algorithm = server_args.speculative_algorithm
        self.num_drafts = server_args.speculative_num_steps
        self.max_window = server_args.speculative_ngram_max_trie_depth
        self.min_match = server_args.speculative_ngram_min_match_window_size
        self.disable_batch_size = server_args.speculative_disable_batch_size
        self.builder = builder
        self.tree_cache = tree_cache
        self.context_len = context_len
        self.draft_source = draft_source
        self.plan = plan  # how the model runner forwards a verify step
        self.penalties_stale = False  # a verify folded drafts into the running batch's penalty state
        # must_settle's finding that these requests' histories, unchanged since, have no drafts.
        self._draftless: Optional[list[tuple[int, int]]] = None

    @classmethod
    def from_server_args(cls, server_args: ServerArgs, *args, **kwargs) -> Optional["SpecDecoding"]:
        return cls(server_args, *args, **kwargs) if server_args.speculative_algorithm is not None else None

    @property
    def overlaps(self) -> bool:
        """Whether steps may run under the overlap schedule: NGRAM's, whose drafts are a cheap
        lookup in the host history (a draft model's forwards need the latest tokens)."""
        return self.draft_source is None

    def must_settle(self, in_flight: Step, reqs: list[Req]) -> bool:
        """Overlap: whether the in-flight step's result must be read before the next step is
        built: after a verify (its accepted lengths place the next step), and where the history
        without the in-flight token already finds drafts (the next step then likely verifies,
        and its drafts must continue the latest token). Otherwise the next decode step overlaps.
        `reqs` are the requests the next step may run: the running batch and the prefilled
        batches that join it first (their drafts can make that step a verify too)."""
        if in_flight.spec is not None:
            return True
        if not reqs or len(reqs) > self.disable_batch_size:
            return False
        if any(self._drafts(reqs)):
            return True
        self._draftless = _history_marks(reqs)  # next_step need not look them up again
        return False

    def next_step(self, batch: ScheduleBatch, in_flight: Optional[Step] = None) -> Step:
        """The running batch's next decode step: a verify step when it speculates. Never a verify
        while a decode step of the batch is in flight (`in_flight`, under the overlap schedule):
        the requests' host histories then lack its tokens, and a verify forwards from the host's
        last token and prefix length."""
        self._refresh_penalties(batch)
        reqs = batch.reqs
        draftless, self._draftless = self._draftless, None
        if (in_flight is not None and in_flight.mode.is_decode()) or len(reqs) > self.disable_batch_size or draftless == _history_marks(reqs):
            return self.builder.decode_step(batch)
        drafts = self._drafts(reqs)
        if not any(drafts):
            return self.builder.decode_step(batch)
        self.penalties_stale = True
        return self._verify_step(batch, drafts)

    def _drafts(self, reqs: list[Req]) -> list[list[int]]:
        caps = [self._draft_cap(req) for req in reqs]
        if self.draft_source is not None:
            return self.draft_source.propose(reqs, caps)
        return [ngram_drafts(req.fill_ids, cap, self.max_window, self.min_match) for req, cap in zip(reqs, caps)]

    def _draft_cap(self, req: Req) -> int:
        """Drafts the request's KV budget leaves room for (the verify writes k + 1 positions)."""
        return max(0, min(self.num_drafts, self._kv_limit(req) - req.kv_len - 1))

    def _kv_limit(self, req: Req) -> int:
        """The KV positions the request may hold: its admission budget, within the context."""
        max_new = req.sampling_params.max_new_tokens
        return self.context_len if max_new is None else min(self.context_len, len(req.origin_input_ids) + max_new)

    def _verify_step(self, batch: ScheduleBatch, drafts: list[list[int]]) -> Step:
        reqs = list(batch.reqs)
        prefix_lens = [req.kv_len for req in reqs]
        width = self._padded_width(reqs)
        # A padded request forwards PAD_TOKEN after its drafts: never a draft, never emitted.
        forwarded = [d + [PAD_TOKEN] * (width - 1 - len(d)) if width else d for d in drafts]
        extend_lens = [len(d) + 1 for d in forwarded]
        input_ids = [t for req, d in zip(reqs, forwarded) for t in [req.output_ids[-1]] + d]
        starts = [0]
        for n in extend_lens[:-1]:
            starts.append(starts[-1] + n)
        slots = self.builder.allocate_slots(reqs, extend_lens)  # [sum extend_lens] int64, host
        device = self.builder.device
        spec = SpecDrafts(drafts, starts, prefix_lens)
        if width is None and self.plan.decode_rows:
            # Token j of request i is a decode row at position prefix_i + j: all rows store their
            # K/V before any row attends, so each sees its request's tokens up to its own.
            rows = [(req.req_pool_idx, p + j) for req, p, n in zip(reqs, prefix_lens, extend_lens) for j in range(n)]
            forward_batch = ForwardBatch.init_new(
                ForwardMode.DECODE, input_ids, [r for r, _ in rows], [p for _, p in rows], [1] * len(rows), slots, device,
            )
            spec.req_slots = host_to_device([req.req_pool_idx for req in reqs], device)  # [B] int64
        else:
            forward_batch = ForwardBatch.init_new(
                ForwardMode.EXTEND, input_ids, [r.req_pool_idx for r in reqs], prefix_lens, extend_lens, slots, device,
                return_input_logits=True,
            )
            forward_batch.verify_width = width
        positions = host_to_device(prefix_lens, device)  # [B] position 0 of each request
        info = batch.sampling_info
        if positions_independent(info):
            info.repeated_rows(max(len(d) for d in drafts) + 1)  # built here, read by the verify
        return Step(
            ForwardMode.DECODE, reqs, forward_batch, list(range(len(reqs))), batch, positions, kv_slots=slots, spec=spec,
        )

    def _padded_width(self, reqs: list[Req]) -> Optional[int]:
        """The graphs' width when every request's KV budget holds that many more tokens (the
        padding's K/V slots are given back with the rejected drafts'); else None (eager)."""
        width = self.plan.graph_width
        if width is None or any(req.kv_len + width > self._kv_limit(req) for req in reqs):
            return None
        return width

    def _refresh_penalties(self, batch: ScheduleBatch) -> None:
        info = batch.sampling_info
        if not self.penalties_stale or info.penalizer_orchestrator is None:
            self.penalties_stale = False
            return
        info.penalizer_orchestrator.release()
        info.penalizer_orchestrator = BatchedPenalizerOrchestrator(info.vocab_size, batch)
        self.penalties_stale = False


def _history_marks(reqs: list[Req]) -> list[tuple[int, int]]:
    """Which requests, with how many output tokens: equal marks, equal histories."""
    return [(id(req), len(req.output_ids)) for req in reqs]


def trim_rejected_kv(tree_cache: RadixCache, step: Step, result: StepResult) -> None:
    """Each request keeps the KV of its last token and accepted drafts; the rest goes back."""
    for req, prefix, accepted in zip(step.reqs, step.spec.prefix_lens, result.spec_accepted):
        if req.req_pool_idx is not None:
            tree_cache.free_tail(req, prefix + accepted + 1)


def count_plain_decode(step: Step) -> None:
    """A decode step without drafts counts as a verify of none, so that spec_accept_length
    (tokens per target step) covers every step of a speculating server."""
    if step.spec is None and step.mode.is_decode():
        for req in step.reqs:
            count_verify(req, 0, 0)


def count_verify(req: Req, drafts: int, accepted: int) -> None:
    """SGLang's per-request speculative counters (meta_info spec_*)."""
    req.spec_verify_ct += 1
    req.spec_draft_token_num += drafts
    req.spec_accept_token_num += accepted


class DraftSource(Protocol):
    """Where drafts come from besides the NGRAM lookup (a draft model)."""

    def propose(self, reqs: list[Req], caps: list[int]) -> list[list[int]]:
        """Per request up to caps[i] draft ids continuing its tokens."""
