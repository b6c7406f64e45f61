"""Result processing: read a step's StepResult into its requests (tokens, logprobs, finish
checks), fail a step that raised, and send the requests' new output to the detokenizer.

A step whose device work or result processing raises fails its requests alone
(managers/step_failures.py, docs/reliability.md); a TokenDivergenceError ends the scheduler,
since the TP ranks' states differ and no later step of theirs can be trusted.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, wait
from typing import Optional

import torch
import torch.distributed as dist

from sglang.srt.constrained.base_grammar_backend import grammar_key
from sglang.srt.constrained.bitmask import allows_nothing
from sglang.srt.distributed.communication import TokenDivergenceError
from sglang.srt.distributed.parallel_state import tp_cpu_group
from sglang.srt.managers.beam_coordinator import BeamCoordinator, beam_token_fields, is_hidden
from sglang.srt.managers.guidance_pairs import GuideSide, guidance_alphas
from sglang.srt.managers.io_struct import STEP_ERROR, SchedulerLoad, TokenOut
from sglang.srt.managers.results_router import ResultsRouter
from sglang.srt.managers.sampling_report_out import (
    DEFAULT_SAMPLING_MASK_MAX_TOKENS,
    PendingReport,
    overflow_message,
    support_overflows,
)
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.spec_decode import count_verify, trim_rejected_kv
from sglang.srt.managers.step_failures import StepError, StepFailureLimit
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.metrics.histogram import Histogram
from sglang.srt.layers.sampling_report import RowReport
from sglang.srt.model_executor.step import INVALID_TOKEN_ID, Step, StepResult

logger = logging.getLogger(__name__)

NAN_MESSAGE = "The logits of this request contained NaN or +inf (or no finite value), so no token could be sampled."


class ResultProcessor:
    """Reads step results into requests and sends their output. `sender` is rank 0's results
    socket; the other TP ranks (None) process the same results and send nothing."""

    def __init__(
        self,
        sender: Optional[ResultsRouter],
        tp_size: int,
        vocab_size: int,
        stream_interval: int,
        tree_cache: RadixCache,
        req_to_token_pool: ReqToTokenPool,
        failures: StepFailureLimit,
        step_time: Histogram,
        beams: Optional[BeamCoordinator] = None,
        sampling_mask_max_tokens: int = DEFAULT_SAMPLING_MASK_MAX_TOKENS,
        guide_model: Optional[GuideSide] = None,
    ) -> None:
        self.sender = sender
        self.tp_size = tp_size
        self.vocab_size = vocab_size
        self.stream_interval = stream_interval
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        self.failures = failures
        self.step_time = step_time
        self.beams = beams
        self.sampling_mask_max_tokens = sampling_mask_max_tokens
        self.guide_model = guide_model  # --guide-model-path: its KV holds the guide contexts routed to it

    # ------------------------------------------------------------------ reading a step

    def process(self, step: Step, future: Future) -> Optional[BaseException]:
        """Read a step's result into its requests and send their output; returns the error that
        failed the step (on any TP rank), to be handed to fail(), or None."""
        try:
            error = self._step_error(future)
            if error is None:
                try:
                    self._read(step, future.result())
                except Exception as err:  # noqa: BLE001 - the same on every rank: host code on the same inputs
                    error = err
        finally:
            step.processed.set()  # the next step's grammar rows may fill their masks now
        self.step_time.observe(time.perf_counter() - step.submitted_at)
        if isinstance(error, TokenDivergenceError):
            raise error  # the ranks' states differ: no later step of theirs can be trusted
        return error

    def _step_error(self, future: Future) -> Optional[BaseException]:
        """The step's exception, if its device work raised here or on another TP rank."""
        error = future.exception()
        if self.tp_size > 1:
            failed = torch.tensor([error is not None], dtype=torch.int32)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=tp_cpu_group())
            if failed.item() and error is None:
                error = StepError("the step failed on another TP rank")
        return error

    def _read(self, step: Step, result: StepResult) -> None:
        if result.ready is not None:
            # The one read of the device per step: this step's tokens (the next step is already queued).
            result.ready.synchronize()
        next_ids = result.next_ids.tolist()
        for row, entries in result.input_logprobs.items():
            _record_input_logprobs(step.reqs[row], entries)
        sampled = [step.reqs[r] for r in step.sample_rows]
        if self.beams is not None:
            self.beams.read(step, result)
        if result.spec_tokens is not None:
            self._read_verify(step, result)
        alphas = guidance_alphas(result.guidance_alpha)
        for i, req in enumerate(sampled if result.spec_tokens is None else ()):
            if req.finished() or req.beam is not None:
                continue  # finished at the previous step (overlap) or aborted: drop this token; beams: read above
            appended = len(req.output_ids)
            self._record_token(req, next_ids[i], result.row_errors.get(i), result.output_logprobs[i])
            if i in alphas and len(req.output_ids) > appended:
                req.guidance_alpha.append(alphas[i])
            if result.reports and result.reports[i] is not None and len(req.output_ids) > appended:
                self._record_report(req, result.reports[i])
        self.send([r for r in step.reqs if r.finished() or (r.stream and self._stream_due(r))])

    def _read_verify(self, step: Step, result: StepResult) -> None:
        """A verify step: each request's emitted ids in order, up to the one that ends it."""
        trim_rejected_kv(self.tree_cache, step, result)
        logprobs = result.spec_logprobs
        for i, (req, tokens) in enumerate(zip(step.reqs, result.spec_tokens)):
            count_verify(req, len(step.spec.drafts[i]), result.spec_accepted[i])
            for j, token in enumerate(tokens):
                if req.finished():
                    break
                error = result.row_errors.get(i) if j == len(tokens) - 1 else None
                self._record_token(req, token, error, logprobs[i][j] if logprobs is not None else None)

    def _stream_due(self, req: Req) -> bool:
        """--stream-interval: the first token at once (it is the TTFT), then every N tokens."""
        unsent = len(req.output_ids) - req.sent_output_len
        return unsent > 0 and (req.sent_output_len == 0 or unsent >= self.stream_interval)

    def _record_token(self, req: Req, token: int, error: Optional[str], logprobs: Optional[tuple]) -> None:
        """Append a sampled token (with its logprobs) and check whether it ends the request; a
        row the sampler flagged, or a token the grammar refuses, aborts the request."""
        if token == INVALID_TOKEN_ID:
            if error is None and req.grammar is not None and allows_nothing(req.grammar, self.vocab_size):
                # The client's grammar cannot go on from here (e.g. a regex that matches nothing): a 400, not a NaN.
                kind = grammar_key(req.sampling_params).kind
                req.abort(f"{kind} allows no token after {len(req.output_ids)} output tokens: the grammar cannot be completed.")
                return
            req.abort(error or NAN_MESSAGE, status_code=500, err_type="InternalServerError" if error is None else "CustomLogitProcessorError")
            return
        if req.sampling_params.max_new_tokens == 0:
            req.finished_reason = {"type": "length", "length": 0}
            return
        if req.grammar is not None and not req.grammar.accept_token(token):
            req.abort(f"The grammar rejected the sampled token {token}.", status_code=500, err_type="InternalServerError")
            return
        req.output_ids.append(token)
        if logprobs is not None:
            token_lp, top, ids = logprobs
            req.pending_logprobs.output_token.append([token_lp, token])
            if top is not None:
                req.pending_logprobs.output_top.append(top)
            if ids is not None:
                req.pending_logprobs.output_token_ids.append(ids)
        req.check_finished()

    def _record_report(self, req: Req, report: RowReport) -> None:
        """Queue the sampled token's report; a support past --sampling-mask-max-tokens aborts (SGLang's 400)."""
        if support_overflows(report, self.sampling_mask_max_tokens):
            req.abort(overflow_message(self.sampling_mask_max_tokens))
        else:
            req.pending_report.add(report)

    # ------------------------------------------------------------------ failed steps

    def fail(self, step: Step, error: BaseException, in_flight: Optional[Future], active: list[Req]) -> None:
        """Abort every request whose KV row holds a slot the step was to write (its own rows, and
        those of `active` that matched its prompt chunks in the prefix cache since), cache none of
        them, log the traceback once, and count the failure (too many end the server). A guide
        context on the guide model is checked against that model's KV and the step's slots there.
        `in_flight` is the step submitted after it, which may still write into rows of these."""
        message = f"Step {step.index} failed ({type(error).__name__}: {error}); its requests were aborted."
        logger.error("%s", message, exc_info=error if error.__traceback__ is not None else None)
        wait([in_flight] if in_flight is not None else [])
        self.tree_cache.poison(step.kv_slots)
        if step.guide_kv_slots is not None:
            self.guide_model.side.tree_cache.poison(step.guide_kv_slots)
        victims = {id(r): r for r in step.reqs}
        for req in active:
            if req.req_pool_idx is not None and self._writes_into(req, step):
                victims[id(req)] = req
        for req in victims.values():
            req.kv_failed = True
            if not req.finished():
                req.abort(message, status_code=500, err_type=STEP_ERROR)
        self.send(list(victims.values()))
        self.failures.record(step.index, message)

    def _writes_into(self, req: Req, step: Step) -> bool:
        """Whether the KV row of `req` holds any slot `step` writes on the model `req` runs on."""
        if req.is_guide and req.side is not None:
            pool, slots = req.side.pool, step.guide_kv_slots
        else:
            pool, slots = self.req_to_token_pool, step.kv_slots
        return slots is not None and bool(torch.isin(pool.slots_of(req.req_pool_idx, req.kv_len), slots).any())

    # ------------------------------------------------------------------ sending

    def send(self, reqs: list[Req]) -> None:
        """Send the new output of `reqs` (rank 0), each finished request's last output once."""
        if self.sender is None:
            return
        outs = []
        for req in reqs:
            if req.finish_sent or is_hidden(req):
                continue  # e.g. aborted by the client while a step was in flight; beam rows: at the end
            outs.append(_token_out(req))
            req.finish_sent = req.finished()
        if outs:
            self.sender.send_outs(outs)

    def send_load(self, load: SchedulerLoad, http_worker_ipc: Optional[str]) -> None:
        if self.sender is not None:
            self.sender.send_load(load, http_worker_ipc)


def _record_input_logprobs(req: Req, entries: list) -> None:
    """Queue a prefill chunk's prompt logprobs; None stands for the first prompt token (no logprob)."""
    pending = req.pending_logprobs
    if pending.input_token is None:
        pending.input_token, pending.input_top, pending.input_token_ids = [], [], []
    for entry in entries:
        if entry is None:
            pending.input_token.append([None, req.origin_input_ids[0]])
            pending.input_top.append(None)
            pending.input_token_ids.append(None)
            continue
        token, top, ids = entry
        pending.input_token.append(token)
        pending.input_top.append(top)
        pending.input_token_ids.append(ids)


def _token_out(req: Req) -> TokenOut:
    """The request's output since the last send, and its pending logprobs and reports (taken,
    not copied). A request that asked for neither, the common case, skips both: their fields
    keep their None defaults, which is what they would be given."""
    params = req.sampling_params
    first = req.sent_output_len == 0
    new_alphas = req.guidance_alpha[req.sent_output_len :] if req.guidance_alpha else None
    new_ids = req.output_ids[req.sent_output_len :]
    req.sent_output_len = len(req.output_ids)
    completion_tokens, beam_results = len(req.output_ids), None
    if req.beam is not None:
        beam = beam_token_fields(req)
        # A beam request that failed (no results): its rows' ids are no answer.
        new_ids, completion_tokens, beam_results = beam if beam is not None else ([], completion_tokens, None)
    out = TokenOut(
        rid=req.rid,
        new_output_ids=new_ids,
        finished_reason=req.finished_reason,
        prompt_tokens=len(req.origin_input_ids),
        completion_tokens=completion_tokens,
        cached_tokens=req.cached_tokens,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
        no_stop_trim=params.no_stop_trim,
        matched_text=req.matched_text,
        spec_verify_ct=req.spec_verify_ct,
        spec_accept_token_num=req.spec_accept_token_num,
        spec_draft_token_num=req.spec_draft_token_num,
        num_retractions=req.retraction_count,
        stop_strs=params.stop_strs if first and req.stream and not params.no_stop_trim else None,
        beam_results=beam_results,
        guidance_alpha=new_alphas,
    )
    _take_logprobs(req, out)
    _take_reports(req, out)
    return out


def _take_logprobs(req: Req, out: TokenOut) -> None:
    """Move the request's pending logprobs into `out` (the ones it asked for)."""
    pending = req.pending_logprobs
    want = req.logprob
    if want is None and pending.input_token is None and not (pending.output_token or pending.output_top or pending.output_token_ids):
        return
    req.pending_logprobs = type(pending)()
    if want:
        out.output_token_logprobs = pending.output_token
        out.output_top_logprobs = pending.output_top if want.top_logprobs_num else None
        out.output_token_ids_logprobs = pending.output_token_ids if want.token_ids_logprob else None
    out.input_token_logprobs = pending.input_token
    out.input_top_logprobs = pending.input_top if want and want.top_logprobs_num else None
    out.input_token_ids_logprobs = pending.input_token_ids if want and want.token_ids_logprob else None


def _take_reports(req: Req, out: TokenOut) -> None:
    """Move the request's pending sampling reports into `out` (the ones it asked for)."""
    pending = req.pending_report
    if req.sampling_report is None and not (pending.masks or pending.entropy):
        return
    req.pending_report = PendingReport()
    for name, value in pending.message_fields(req.sampling_report).items():
        setattr(out, name, value)
