"""Scheduler: continuous batching with chunked prefill and the overlap schedule.

One process per TP rank. Every step is either an extend (prefill) batch of waiting requests
or a decode batch of the running requests. The scheduler only decides steps and reads their
results: the device work of a step (ModelRunner.run: forward, logit bias, sampling, penalty
update, writing the sampled ids into `future_tokens`) runs as one task on a single worker
thread, in submission order. With the overlap schedule the scheduler submits
step i+1 before it has read step i's tokens: step i+1's input ids are read on the worker from
`future_tokens`, and the penalty state already holds step i's ids (update_penalties), so
nothing depends on the host having seen them. A request that finished at step i therefore
runs one extra step whose token is dropped, unless step i was certain to end it
(max_new_tokens) and no other request runs: then no step follows. Without overlap the
scheduler waits for each step before preparing the next; the device work is the same code.

This module holds the event loop, the request intake and the state that ties the parts
together (waiting queue, request mid-prefill, step in flight). The parts: request_intake,
schedule_policy, step_builder, running_batch, preemption, result_processor, scheduler_stats,
scheduler_parts (prefix cache, grammar queue), scheduler_process (the process).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from concurrent.futures import Future, wait
from typing import Any, Optional

import msgspec
import torch
import torch.distributed as dist
import zmq

from sglang.srt.constrained.base_grammar_backend import grammar_key
from sglang.srt.distributed.communication import broadcast_frames
from sglang.srt.distributed.parallel_state import init_tp_groups, tp_cpu_group
from sglang.srt.managers.beam_coordinator import BeamCoordinator
from sglang.srt.managers.guide_model import GuideModel
from sglang.srt.managers.guidance_pairs import attach_guide, release_guide, with_guides
from sglang.srt.managers.io_struct import (
    AbortReq,
    FlushCacheReq,
    QUEUE_FULL,
    GetLoadReq,
    ReplicaLoad,
    SchedulerInput,
    SchedulerReady,
    TokenizedGenerateReqInput,
    decoder,
)
from sglang.srt.managers.preemption import Preemption
from sglang.srt.managers.replica_load import ReplicaLoadReporter
from sglang.srt.managers.request_intake import InvalidRequest, check_fits, kv_budget, req_from_message
from sglang.srt.managers.result_processor import ResultProcessor
from sglang.srt.managers.results_router import ResultsRouter
from sglang.srt.managers.running_batch import RunningBatch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.request_extras import priority_sign
from sglang.srt.managers.schedule_policy import SchedulePolicy, in_flight_ends_running, release_kv
from sglang.srt.managers.scheduler_parts import make_grammar_queue, make_tree_cache
from sglang.srt.managers.scheduler_process import rank_device, serve, start_forward_worker
from sglang.srt.managers.scheduler_stats import SchedulerStats
from sglang.srt.managers.spec_decode import SpecDecoding, count_plain_decode
from sglang.srt.managers.spec_draft_model import draft_source
from sglang.srt.managers.step_builder import StepBuilder
from sglang.srt.managers.step_failures import StepFailureLimit, StepFaultHook
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.step import Step, StepResult
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

logger = logging.getLogger(__name__)

GRAMMAR_WAIT_S = 0.005  # how long an otherwise idle loop waits for a grammar compile per turn


class Scheduler:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs, tp_rank: int = 0, dp_rank: int = 0) -> None:
        self.server_args = server_args
        self.tp_rank, self.tp_size, self.dp_rank = tp_rank, server_args.tp_size, dp_rank
        device = rank_device(server_args, dp_rank, tp_rank)
        if self.tp_size > 1:
            init_tp_groups(tp_rank, self.tp_size, device, port_args.dist_init_method, server_args.dist_timeout, not server_args.disable_custom_all_reduce)
        self.worker, self.model_runner = start_forward_worker(server_args, device, tp_rank, dp_rank)
        self.guide_model = (
            GuideModel(server_args, self.worker, device, tp_rank, self.model_runner) if server_args.guide_model_path else None
        )
        config = self.model_runner.model_config
        self.device = torch.device(self.model_runner.device)
        self.vocab_size = self.model_runner.vocab_size
        self.context_len = config.context_len
        self.eos_token_ids = set(config.eos_token_ids)
        self.max_total_tokens = self.model_runner.max_total_num_tokens
        self.max_running = self.model_runner.max_running_requests
        # --skip-tokenizer-init: none; stop strings are refused upstream and EOS comes from the model config.
        self.tokenizer = None if server_args.skip_tokenizer_init else get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        # Every rank loads the same classes and sees the same batches, so processor state is identical.
        logits_processors = LoadedLogitsProcessors.from_server_args(server_args, self.device)
        self.grammar_queue = make_grammar_queue(server_args, self.tokenizer, self.vocab_size, self.eos_token_ids)

        self.overlap = not server_args.disable_overlap_schedule
        self.deterministic = server_args.enable_deterministic_inference
        self.in_flight: Optional[tuple[Step, Future]] = None

        self.waiting: deque[Req] = deque()
        self.running = RunningBatch()
        self.chunked_req: Optional[Req] = None  # the request whose prompt the last prefill step left unfinished
        self.reqs_by_rid: dict[str, Req] = {}
        pool = self.model_runner.req_to_token_pool
        self.tree_cache = make_tree_cache(server_args, self.model_runner, self.deterministic, tp_rank)
        self.policy = SchedulePolicy(
            server_args.schedule_policy, server_args.chunked_prefill_size, self.deterministic, self.tree_cache, pool,
            self.max_running, self._budget, priority_sign(server_args),
        )
        self.builder = StepBuilder(server_args, self.policy, self.tree_cache, pool, self.device, self.vocab_size, logits_processors)
        self.builder.guide_model = self.guide_model
        drafts = draft_source(server_args, self.worker, self.device, tp_rank, self.max_total_tokens, self.max_running, self.context_len)
        self.spec = SpecDecoding.from_server_args(server_args, self.builder, self.tree_cache, self.context_len, drafts, self.model_runner.verify_plan)
        if self.spec is not None and not self.spec.overlaps:
            self.overlap = False  # a draft model's forwards read each request's latest tokens
        self.preemption = Preemption.from_server_args(server_args, self.policy, self.spec is not None)
        self.flush_requested = False
        self.fault_hook = StepFaultHook.from_env(tp_rank)
        failures = StepFailureLimit(server_args.step_failure_limit, server_args.step_failure_window)
        self.stats = SchedulerStats(server_args.decode_log_interval, self.tree_cache, pool, self.max_total_tokens, failures)

        self.decode_input = decoder(SchedulerInput)
        self.parent_pid = os.getppid()
        sender = None
        if tp_rank == 0:
            # Only rank 0 talks to the other processes; the other ranks get its input by broadcast.
            self.context = zmq.Context(2)
            self.recv_socket = self.context.socket(zmq.PULL)
            self.recv_socket.bind(port_args.scheduler_input_ipc)
            sender = ResultsRouter.create(server_args, port_args, self.context)
            self.load_reporter = ReplicaLoadReporter(self.context, port_args.load_ipc, server_args.load_watch_interval)
        self.beams = BeamCoordinator(self.tree_cache, pool, self.model_runner.future_tokens, self.builder.sampled_batch, self.max_running, self.max_total_tokens)
        self.policy.reserve_rows = self.beams.reserve_rows
        self.results = ResultProcessor(
            sender, self.tp_size, self.vocab_size, server_args.stream_interval, self.tree_cache, pool,
            failures, self.stats.step_time, self.beams, server_args.sampling_mask_max_tokens, self.guide_model,
        )
        self.num_reqs_received = 0
        if self.tp_size > 1:
            # Rank 0 reports ready only once every rank holds its shard.
            dist.barrier(group=tp_cpu_group())

    def ready_message(self) -> SchedulerReady:
        return SchedulerReady(
            vocab_size=self.vocab_size, context_len=self.context_len, max_total_num_tokens=self.max_total_tokens,
            max_running_requests=self.max_running, eos_token_ids=sorted(self.eos_token_ids), model_path=self.server_args.model_path,
        )

    # ------------------------------------------------------------------ event loop

    def event_loop(self) -> None:
        while True:
            self.recv_requests(block=self._idle())
            step = self.get_next_step()
            if self.overlap and self.in_flight is not None and step is not None and (step.reads_host_history() or step.has_beam_rows()):
                # Custom processors read each request's output ids on the host: let them see the
                # in-flight token first. Beam rows take their next input ids, K/V spans and penalty
                # state from the in-flight step's selection (managers/beam_coordinator.py).
                self._read_in_flight()
            if self.overlap and self.in_flight is not None and step is not None and (step.has_grammar_rows() or step.has_batch_logits_processors()):
                # Delayed sampling: the forward starts now; the vocab mask and the batch processors
                # wait until the in-flight step's tokens are in the grammars and output lists
                # (process_step_result, just below).
                step.grammar_wait = self.in_flight[0].processed
            future = self._submit(step) if step is not None else None
            if self.overlap:
                previous, self.in_flight = self.in_flight, (step, future) if step is not None else None
                if previous is not None:
                    self.process_step_result(*previous)
            elif step is not None:
                self.process_step_result(step, future)

    def _submit(self, step: Step) -> Future:
        step.submitted_at = time.perf_counter()
        return self.worker.submit(self._run_step, step)

    def _run_step(self, step: Step) -> StepResult:
        """On the worker: the step's device work, then the test hook (after the TP collectives
        of the forward, so a fault on one rank leaves the others' forward whole)."""
        result = self.model_runner.run(step)
        self.fault_hook.check(step.index)
        return result

    def _idle(self) -> bool:
        return self._nothing_to_run() and not self.grammar_queue

    def _nothing_to_run(self) -> bool:
        return not self.waiting and self.running.empty() and self.in_flight is None and self.chunked_req is None

    # ------------------------------------------------------------------ request intake

    def recv_requests(self, block: bool) -> None:
        """Handle what arrived since the last step: rank 0 reads the socket and broadcasts the
        raw messages, so every rank adds and aborts the same requests at the same step."""
        if self.tp_rank == 0:
            self.load_reporter.report(self._replica_load, now=block)  # before waiting idle: the final state
        frames = self._poll_frames(block) if self.tp_rank == 0 else []
        if self.tp_size > 1:
            frames = broadcast_frames(frames, tp_cpu_group())
        for frame in frames:
            try:
                message = self.decode_input.decode(frame)
            except msgspec.DecodeError:  # msgpack of our structs only: anything else is dropped, never run
                logger.error("Dropping an undecodable %d-byte message on the scheduler socket", len(frame))
                continue
            self._handle(message)
        if not block and self.grammar_queue and self._nothing_to_run():
            self.grammar_queue.wait(GRAMMAR_WAIT_S)  # rather than spin while only compiles are pending
        if block and os.getppid() != self.parent_pid:
            raise SystemExit("scheduler: the server process is gone")

    def _poll_frames(self, block: bool) -> list[bytes]:
        frames, timeout_ms = [], 1000 if block else 0
        while self.recv_socket.poll(timeout_ms):
            frames.append(self.recv_socket.recv())
            timeout_ms = 0
        return frames

    def _replica_load(self) -> ReplicaLoad:
        waiting_tokens = sum(len(r.origin_input_ids) for r in self.waiting)
        return ReplicaLoad(
            dp_rank=self.dp_rank,
            num_reqs=len(self._active_reqs()) + self._queued_count(),
            num_waiting_reqs=self._queued_count(),
            num_tokens=self.max_total_tokens - self.tree_cache.available_size() + waiting_tokens,
            num_reqs_received=self.num_reqs_received,
        )

    def _handle(self, message: Any) -> None:
        if isinstance(message, TokenizedGenerateReqInput):
            self.num_reqs_received += 1
            if self.results.sender is not None:
                self.results.sender.register(message.rid, message.http_worker_ipc)
            self._add_request(message)
        elif isinstance(message, FlushCacheReq):
            self.flush_requested = True
        elif isinstance(message, GetLoadReq):
            self._send_load(message.req_id, message.http_worker_ipc)
        elif isinstance(message, AbortReq) and message.abort_all:
            for rid in list(self.reqs_by_rid):
                self._handle(AbortReq(rid=rid))
        elif isinstance(message, AbortReq):
            req = self.reqs_by_rid.get(message.rid)
            if req is not None and not req.finished():
                req.abort("Aborted by the client.", status_code=499, err_type="ClientAbort")
                if req in self.waiting or (self.grammar_queue is not None and self.grammar_queue.remove(req)):
                    if req in self.waiting:
                        self.waiting.remove(req)
                    self.reqs_by_rid.pop(req.rid, None)
                self.results.send([req])

    def _add_request(self, message: TokenizedGenerateReqInput) -> None:
        try:
            req = req_from_message(message, self.context_len, self.eos_token_ids, self.tokenizer)
            check_fits(req, self.context_len, self.max_total_tokens)
            attach_guide(req, self.context_len, self.max_total_tokens, self.guide_model)
        except InvalidRequest as err:
            self._reject(err.req, str(err))
            return
        beam_error = self.beams.init_request(req)
        if beam_error is not None:
            self._reject(req, beam_error)
            return
        params = req.sampling_params
        key = grammar_key(params)
        limit = self.server_args.max_queued_requests
        if key is not None and self.grammar_queue is None:
            # The tokenizer manager refuses these up front; this covers direct senders.
            self._reject(req, f"{key.kind} needs a grammar backend; this server runs with --grammar-backend none or --skip-tokenizer-init.")
        elif limit is not None and self._queued_count() >= limit:
            self._reject(
                req, f"The request queue is full: {limit} requests are waiting (--max-queued-requests {limit}); retry later.",
                status_code=503, err_type=QUEUE_FULL,
            )
        elif key is None:
            self.reqs_by_rid[req.rid] = req
            self.waiting.append(req)
        else:
            self.reqs_by_rid[req.rid] = req
            self.grammar_queue.add(req, key)

    def _reject(self, req: Req, message: str, status_code: int = 400, err_type: str = "BadRequestError") -> None:
        req.abort(message, status_code=status_code, err_type=err_type)
        self.results.send([req])

    def _queued_count(self) -> int:
        return len(self.waiting) + (len(self.grammar_queue) if self.grammar_queue is not None else 0)

    def _admit_compiled_grammars(self) -> None:
        """Queue the requests whose grammar compiled on every rank; fail those whose grammar did not."""
        if not self.grammar_queue:
            return
        ready, failed = self.grammar_queue.pop_ready()
        self.waiting.extend(ready)
        for req, reason in failed:
            req.abort(reason)
            self.reqs_by_rid.pop(req.rid, None)
        self.results.send([req for req, _ in failed])

    def _budget(self, req: Req) -> int:
        return kv_budget(req, self.context_len) + self.beams.extra_kv_budget(req)

    def _send_load(self, req_id: int, http_worker_ipc: Optional[str]) -> None:
        grammar_queued = len(self.grammar_queue) if self.grammar_queue is not None else 0
        load = self.stats.load(req_id, len(self._active_reqs()), self._queued_count(), grammar_queued)
        self.results.send_load(load, http_worker_ipc)

    # ------------------------------------------------------------------ the next step

    def get_next_step(self) -> Optional[Step]:
        self._admit_compiled_grammars()
        if self.spec is not None and self.in_flight is not None and self.spec.must_settle(self.in_flight[0], self.running.reqs()):
            self._read_in_flight()
        for req in self.running.update(self._wait_in_flight):
            self._release(req)
        if self.flush_requested:
            # After the release of requests that finished before the flush was asked for.
            self.tree_cache.flush()
            if self.guide_model is not None:
                self.guide_model.tree_cache.flush()
            self.flush_requested = False
        self.preemption.run(self.waiting, self.running, self._active_reqs, self._read_in_flight)
        step = self._prefill_step()
        if step is None and self.running.batch is not None and not self._running_ends_in_flight():
            step = self._decode_step(self.running.batch)
        if step is not None:
            self.stats.count(step, len(self._active_reqs()), len(self.waiting))
        return step

    def _decode_step(self, batch: Any) -> Step:
        return self.builder.decode_step(batch) if self.spec is None else self.spec.next_step(batch, self._in_flight_step())

    def _running_ends_in_flight(self) -> bool:
        return in_flight_ends_running(self._in_flight_step(), self.running.batch.reqs)

    def _in_flight_step(self) -> Optional[Step]:
        return self.in_flight[0] if self.in_flight is not None else None

    def _prefill_step(self) -> Optional[Step]:
        if self.chunked_req is not None and self.chunked_req.finished():
            # Aborted mid-prefill: its slots go back now, and nothing of it is scheduled.
            self._release(self.chunked_req)
            self.results.send([self.chunked_req])
            self.chunked_req = None
        step, self.chunked_req = self.builder.prefill_step(self.chunked_req, self.waiting, with_guides(self._active_reqs()))
        return step

    # ------------------------------------------------------------------ admitted requests

    def _wait_in_flight(self) -> None:
        """Until the in-flight step's device work is over; a failure of it is read with its result."""
        if self.in_flight is not None:
            wait([self.in_flight[1]])

    def _read_in_flight(self) -> None:
        if self.in_flight is not None:
            self.process_step_result(*self.in_flight)
            self.in_flight = None

    def _release(self, req: Req) -> None:
        release_kv(self.tree_cache, req)
        self.beams.released(req)
        release_guide(self.tree_cache, req)
        self.reqs_by_rid.pop(req.rid, None)

    def _active_reqs(self) -> list[Req]:
        """Admitted requests not yet released: running, prefilled and waiting to merge (among them
        those whose prefill step is still in flight under the overlap schedule), mid-prefill."""
        active = self.running.reqs()
        if self.in_flight is not None and self.in_flight[0].mode == ForwardMode.EXTEND and self.in_flight[0].sampled_batch:
            active += self.in_flight[0].sampled_batch.reqs
        if self.chunked_req is not None:
            active.append(self.chunked_req)
        return active

    # ------------------------------------------------------------------ results

    def process_step_result(self, step: Step, future: Future) -> None:
        """Read a step's result; a step that raised (on any TP rank) fails its requests alone. The
        requests a prefill step sampled for then wait to join the running batch (after a failure,
        to be released there with the other finished requests)."""
        if self.spec is not None:
            count_plain_decode(step)  # before the result goes out with the counters
        error = self.results.process(step, future)
        if error is not None:
            in_flight = self.in_flight[1] if self.in_flight is not None else None
            self.results.fail(step, error, in_flight, with_guides(self._active_reqs()))
        if step.mode == ForwardMode.EXTEND and step.sampled_batch is not None:
            self.running.to_merge.append(step.sampled_batch)
        self.running.to_merge.extend(self.beams.take_new_batches())


def run_scheduler_process(
    server_args: ServerArgs, port_args: PortArgs, tp_rank: int, ready_writer: Any, dp_rank: int = 0
) -> None:
    """Process entry of a scheduler rank: load the model, report readiness (rank 0) or the
    start-up error, then serve (scheduler_process.serve)."""
    serve(lambda: Scheduler(server_args, port_args, tp_rank, dp_rank), server_args, tp_rank, ready_writer, dp_rank)
