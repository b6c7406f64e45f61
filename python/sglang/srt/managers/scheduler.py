"""Scheduler: continuous batching with chunked prefill and the overlap schedule.

One process per TP rank. Every step is either an extend (prefill) batch of waiting requests
or a decode batch of the running requests. The scheduler only decides steps and reads their
results: the device work of a step (ModelRunner.run: forward, logit bias, sampling, penalty
update, writing the sampled ids into `future_tokens`) runs as one task on a single worker
thread, in submission order. With the overlap schedule the scheduler submits
step i+1 before it has read step i's tokens: step i+1's input ids are read on the worker from
`future_tokens`, and the penalty state already holds step i's ids (update_penalties), so
nothing depends on the host having seen them. A request that finished at step i therefore
runs one extra step whose token is dropped, as in SGLang, unless step i was certain to end it
(max_new_tokens) and no other request runs: then no step follows. Without overlap the
scheduler waits for each step before preparing the next; the device work is the same code.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, Optional

import msgspec
import torch
import torch.distributed as dist
import zmq

from sglang.srt.constrained.base_grammar_backend import grammar_key
from sglang.srt.constrained.grammar_backends import create_grammar_backend
from sglang.srt.constrained.bitmask import allows_nothing
from sglang.srt.constrained.grammar_queue import GrammarQueue
from sglang.srt.distributed.communication import TokenDivergenceError, broadcast_frames
from sglang.srt.distributed.parallel_state import init_tp_groups, tp_cpu_group, tp_group_lost
from sglang.srt.distributed.placement import gpu_id, ranks_sharing_gpu, replica_cores, scheduler_name
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenOut,
    FlushCacheReq,
    QUEUE_FULL,
    STEP_ERROR,
    GetLoadReq,
    ReplicaLoad,
    SchedulerInput,
    SchedulerLoad,
    SchedulerReady,
    TokenizedGenerateReqInput,
    TokenOut,
    decoder,
    encode,
)
from sglang.srt.managers.replica_load import ReplicaLoadReporter
from sglang.srt.managers.results_channel import results_sender
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch, eos_ids
from sglang.srt.managers.step_failures import StepError, StepFailureLimit, StepFaultHook
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.metrics.histogram import Histogram
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import CUDA_KV_FREE_FRACTION, ModelRunner
from sglang.srt.model_executor.step import INVALID_TOKEN_ID, LogprobRequest, Step, StepResult
from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils import host_to_device
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

logger = logging.getLogger(__name__)

# SGLang's bound: beyond it, matching every waiting prompt each step costs more than LPM saves.
LPM_MAX_QUEUE = 128

GRAMMAR_WAIT_S = 0.005
# Added to the nice value of a CPU scheduler process (all its threads, the forward's OpenMP team
# among them): see _yield_cores_to_front_end.
CPU_SCHEDULER_NICE = 10
NAN_MESSAGE = "The logits of this request contained NaN or +inf (or no finite value), so no token could be sampled."


class PromptChunk(NamedTuple):
    req: Req
    start: int  # first prompt position of the chunk (the tokens before it are cached)
    length: int
    slots: torch.Tensor  # [length] int64 KV slots, host


class Scheduler:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs, tp_rank: int = 0, dp_rank: int = 0) -> None:
        self.server_args = server_args
        self.tp_rank, self.tp_size = tp_rank, server_args.tp_size
        self.dp_rank = dp_rank
        device = rank_device(server_args, dp_rank, tp_rank)
        if self.tp_size > 1:
            init_tp_groups(tp_rank, self.tp_size, device, port_args.dist_init_method, server_args.dist_timeout)
        # The forward worker is the only thread of this process that runs torch's OpenMP pool;
        # this one only builds batches, single-threaded (see _init_worker).
        self.worker = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="forward", initializer=_init_worker,
            initargs=(device, torch.get_num_threads()),
        )
        torch.set_num_threads(1)
        # Loaded on the worker, so that even loading starts no OpenMP team on this thread.
        self.model_runner = self.worker.submit(
            ModelRunner,
            server_args.model_path,
            dtype=server_args.dtype,
            device=str(device),
            context_length=server_args.context_length,
            max_total_tokens=server_args.max_total_tokens,
            max_running_requests=server_args.max_running_requests,
            mem_fraction_static=_kv_memory_fraction(server_args, dp_rank, tp_rank),
            tp_rank=tp_rank,
            tp_size=server_args.tp_size,
            deterministic=server_args.enable_deterministic_inference,
            cpu_int8_activations=server_args.cpu_int8_activations,
            attention_backend=server_args.attention_backend,
            disable_cuda_graph=server_args.disable_cuda_graph,
            cuda_graph_max_bs=server_args.cuda_graph_max_bs,
            cuda_graph_bs=server_args.cuda_graph_bs,
            disable_piecewise_cuda_graph=server_args.disable_piecewise_cuda_graph,
            piecewise_cuda_graph_max_tokens=server_args.piecewise_cuda_graph_max_tokens or server_args.chunked_prefill_size,
            piecewise_cuda_graph_tokens=server_args.piecewise_cuda_graph_tokens,
            sampling_backend=server_args.sampling_backend,
            random_seed=server_args.random_seed,
        ).result()
        config = self.model_runner.model_config
        self.device = torch.device(self.model_runner.device)
        self.vocab_size = self.model_runner.vocab_size
        self.context_len = config.context_len
        self.eos_token_ids = set(config.eos_token_ids)
        self.max_total_tokens = self.model_runner.max_total_num_tokens
        self.max_running = self.model_runner.max_running_requests
        # --skip-tokenizer-init: none; stop strings are refused upstream and EOS comes from the model config.
        self.tokenizer = None if server_args.skip_tokenizer_init else get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        backend = create_grammar_backend(
            server_args.grammar_backend, self.tokenizer, self.vocab_size, sorted(eos_ids(self.eos_token_ids, self.tokenizer)),
            any_whitespace=not server_args.constrained_json_disable_any_whitespace,
        )
        # Every rank loads the same classes and sees the same batches, so processor state is identical.
        self.logits_processors = LoadedLogitsProcessors.from_server_args(server_args, self.device)
        self.grammar_queue = GrammarQueue(backend, tp_cpu_group() if self.tp_size > 1 else None) if backend is not None else None
        self.step_count = 0
        self.stream_interval = server_args.stream_interval
        self.decode_steps, self.decode_tokens, self.decode_log_time = 0, 0, time.perf_counter()

        self.overlap = not server_args.disable_overlap_schedule
        self.deterministic = server_args.enable_deterministic_inference
        self.in_flight: Optional[tuple[Step, Future]] = None

        self.waiting: deque[Req] = deque()
        self.running: Optional[ScheduleBatch] = None
        self.chunked_req: Optional[Req] = None
        self.to_merge: list[ScheduleBatch] = []
        self.reqs_by_rid: dict[str, Req] = {}
        self.tree_cache = RadixCache(
            self.model_runner.req_to_token_pool,
            self.model_runner.token_to_kv_pool_allocator,
            disable=server_args.disable_radix_cache,
            # Deterministic mode: only whole aligned prefill chunks, whose bits every run shares.
            align=server_args.chunked_prefill_size if self.deterministic else 1,
        )
        self.flush_requested = False
        self.fault_hook = StepFaultHook.from_env(tp_rank)
        self.step_failures = StepFailureLimit(server_args.step_failure_limit, server_args.step_failure_window)
        self.step_time = Histogram()

        self.decode_input = decoder(SchedulerInput)
        self.parent_pid = os.getppid()
        if tp_rank == 0:
            # Only rank 0 talks to the other processes; the other ranks get its input by broadcast.
            self.context = zmq.Context(2)
            self.recv_socket = self.context.socket(zmq.PULL)
            self.recv_socket.bind(port_args.scheduler_input_ipc)
            self.send_socket = results_sender(server_args, port_args, self.context)
            self.load_reporter = ReplicaLoadReporter(self.context, port_args.load_ipc, server_args.load_watch_interval)
        self.num_reqs_received = 0
        if self.tp_size > 1:
            # Rank 0 reports ready only once every rank holds its shard.
            dist.barrier(group=tp_cpu_group())

    def ready_message(self) -> SchedulerReady:
        return SchedulerReady(
            vocab_size=self.vocab_size,
            context_len=self.context_len,
            max_total_num_tokens=self.max_total_tokens,
            max_running_requests=self.max_running,
            eos_token_ids=sorted(self.eos_token_ids),
            model_path=self.server_args.model_path,
        )

    # ------------------------------------------------------------------ event loop

    def event_loop(self) -> None:
        while True:
            self.recv_requests(block=self._idle())
            step = self.get_next_step()
            if self.overlap and self.in_flight is not None and step is not None and step.reads_host_history():
                # Custom processors read each request's output ids on the host: let them see the
                # in-flight token first.
                self.process_step_result(*self.in_flight)
                self.in_flight = None
            if self.overlap and self.in_flight is not None and step is not None and (step.has_grammar_rows() or step.has_batch_logits_processors()):
                # SGLang's delayed sampling: the forward starts now; the vocab mask waits until the
                # in-flight step's tokens are in the grammars (process_step_result, just below).
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
        return not self.waiting and self.running is None and self.in_flight is None and not self.to_merge and self.chunked_req is None

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
        frames = []
        timeout_ms = 1000 if block else 0
        while self.recv_socket.poll(timeout_ms):
            frames.append(self.recv_socket.recv())
            timeout_ms = 0
        return frames

    def _replica_load(self) -> ReplicaLoad:
        waiting_tokens = sum(len(r.origin_input_ids) for r in self.waiting)
        return ReplicaLoad(
            dp_rank=self.dp_rank,
            num_reqs=self._running_count() + self._queued_count(),
            num_waiting_reqs=self._queued_count(),
            num_tokens=self.max_total_tokens - self.tree_cache.available_size() + waiting_tokens,
            num_reqs_received=self.num_reqs_received,
        )

    def _handle(self, message: Any) -> None:
        if isinstance(message, TokenizedGenerateReqInput):
            self.num_reqs_received += 1
            self._add_request(message)
        elif isinstance(message, FlushCacheReq):
            self.flush_requested = True
        elif isinstance(message, GetLoadReq):
            self._send_load(message.req_id)
        elif isinstance(message, AbortReq):
            req = self.reqs_by_rid.get(message.rid)
            if req is not None and not req.finished():
                req.abort("Aborted by the client.", status_code=499, err_type="ClientAbort")
                if req in self.waiting or (self.grammar_queue is not None and self.grammar_queue.remove(req)):
                    if req in self.waiting:
                        self.waiting.remove(req)
                    self.reqs_by_rid.pop(req.rid, None)
                self._send([req])

    def _add_request(self, message: TokenizedGenerateReqInput) -> None:
        try:
            params = SamplingParams.from_message(message.sampling_params)
        except (TypeError, ValueError) as err:  # not the tokenizer manager's normalized params
            self._reject(Req(message.rid, message.input_ids, SamplingParams()), str(err))
            return
        if params.max_new_tokens is None:
            # SGLang's meaning of null: the rest of the context.
            params.max_new_tokens = max(self.context_len - len(message.input_ids), 0)
        logprob = None
        if message.return_logprob:
            start = message.logprob_start_len if message.logprob_start_len >= 0 else len(message.input_ids)
            logprob = LogprobRequest(message.top_logprobs_num, message.token_ids_logprob, start)
        req = Req(
            message.rid,
            message.input_ids,
            params,
            eos_token_ids=self.eos_token_ids,
            custom_logit_processor=message.custom_logit_processor,
            tokenizer=self.tokenizer,
            logprob=logprob,
            stream=message.stream,
        )
        req.extra_key = message.extra_key
        try:
            self._check_fits(req)
        except ValueError as err:
            self._reject(req, str(err))
            return
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
        self._send([req])

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
        self._send([req for req, _ in failed])

    def _check_fits(self, req: Req) -> None:
        need = self._budget(req)
        if len(req.origin_input_ids) == 0:
            raise ValueError("The input is empty: at least one prompt token is required.")
        if need > self.context_len:
            raise ValueError(
                f"The prompt ({len(req.origin_input_ids)} tokens) plus max_new_tokens exceeds the context length {self.context_len}."
            )
        if need > self.max_total_tokens:
            raise ValueError(f"The request needs {need} KV-cache tokens; the server holds {self.max_total_tokens}.")

    def _budget(self, req: Req) -> int:
        """KV tokens the request may use in total: prompt plus every token it may generate."""
        max_new = req.sampling_params.max_new_tokens
        if max_new is None:
            return self.context_len
        return len(req.origin_input_ids) + max_new

    # ------------------------------------------------------------------ building steps

    def get_next_step(self) -> Optional[Step]:
        self._admit_compiled_grammars()
        self._update_running_batch()
        if self.flush_requested:
            # After the release of requests that finished before the flush was asked for.
            self.tree_cache.flush()
            self.flush_requested = False
        step = self._prefill_step()
        if step is None and self.running is not None and not self._running_ends_in_flight():
            step = self._decode_step()
        if step is not None:
            self.step_count += 1
            step.index = self.step_count
            self._log_step(step)
        return step

    def _running_ends_in_flight(self) -> bool:
        """Overlap: whether the in-flight decode step gives every running request its last token
        (max_new_tokens). A next decode step would then only compute tokens to drop, and on the
        CPU it would hold the cores while the last tokens go out and the next request comes in."""
        if self.in_flight is None or self.in_flight[0].mode != ForwardMode.DECODE:
            return False
        in_flight = {id(req) for req in self.in_flight[0].reqs}
        return all(id(req) in in_flight and _last_token_in_flight(req) for req in self.running.reqs)

    def _log_step(self, step: Step) -> None:
        """SGLang's progress lines: every prefill, and every --decode-log-interval decode steps."""
        # Cached prefixes nobody uses count as free, as in SGLang's token usage.
        queued, used = len(self.waiting), self.max_total_tokens - self.tree_cache.available_size()
        if step.mode == ForwardMode.EXTEND:
            new_tokens = sum(step.forward_batch.extend_seq_lens_cpu)
            cached = sum(r.cached_tokens for r in step.reqs)
            logger.info(
                "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, #running-req: %d, #queue-req: %d",
                len(step.reqs), new_tokens, cached, self._running_count(), queued,
            )
            return
        self.decode_steps += 1
        self.decode_tokens += len(step.reqs)
        if self.decode_steps % self.server_args.decode_log_interval:
            return
        now = time.perf_counter()
        throughput = self.decode_tokens / max(now - self.decode_log_time, 1e-9)
        self.decode_log_time, self.decode_tokens = now, 0
        logger.info(
            "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, gen throughput (token/s): %.2f, #queue-req: %d",
            len(step.reqs), used, used / self.max_total_tokens, throughput, queued,
        )

    def _wait_in_flight(self) -> None:
        """Until the in-flight step's device work is over; a failure of it is read with its result."""
        if self.in_flight is not None:
            wait([self.in_flight[1]])

    def _update_running_batch(self) -> None:
        """Merge newly prefilled requests and drop finished ones (after the in-flight step, which
        still reads the sampling state)."""
        finished = self.running is not None and any(r.finished() for r in self.running.reqs)
        if not self.to_merge and not finished:
            return
        self._wait_in_flight()
        for batch in self.to_merge:
            self._merge_into_running(batch)
        self.to_merge = []
        if self.running is None:
            return
        keep = [i for i, r in enumerate(self.running.reqs) if not r.finished()]
        for req in self.running.reqs:
            if req.finished():
                self._release(req)
        if not keep:
            self.running = None
            return
        if len(keep) < len(self.running.reqs):
            self.running.reqs = [self.running.reqs[i] for i in keep]
            self.running.sampling_info.filter_batch(keep)

    def _merge_into_running(self, batch: ScheduleBatch) -> None:
        # The batch object stays the one the penalty orchestrator was built on: it reads its reqs.
        if self.running is None:
            self.running = batch
            return
        self.running.sampling_info.merge_batch(batch.sampling_info)
        self.running.reqs = self.running.reqs + batch.reqs

    def _schedule_batch(self, reqs: list[Req]) -> ScheduleBatch:
        return ScheduleBatch(
            reqs=list(reqs),
            device=self.device,
            enable_custom_logit_processor=self.server_args.enable_custom_logit_processor,
            custom_logit_processor_allowlist=self.server_args.allowlist(),
            loaded_logits_processors=self.logits_processors,
        )

    def _release(self, req: Req) -> None:
        self._free_kv(req)
        self.reqs_by_rid.pop(req.rid, None)

    def _free_kv(self, req: Req) -> None:
        if req.req_pool_idx is None:
            return
        if req.kv_failed:
            self.tree_cache.discard(req)
        else:
            self.tree_cache.release(req)
        req.req_pool_idx = None

    def _active_reqs(self) -> list[Req]:
        """Admitted requests not yet released: running, prefilled and waiting to merge (among them
        those whose prefill step is still in flight under the overlap schedule), mid-prefill."""
        active = list(self.running.reqs) if self.running is not None else []
        active += [r for batch in self.to_merge for r in batch.reqs]
        if self.in_flight is not None and self.in_flight[0].mode == ForwardMode.EXTEND and self.in_flight[0].sampled_batch:
            active += self.in_flight[0].sampled_batch.reqs
        if self.chunked_req is not None:
            active.append(self.chunked_req)
        return active

    def _reserved_tokens(self) -> int:
        return sum(max(self._budget(r) - r.kv_len, 0) for r in self._active_reqs() if not r.finished())

    def _running_count(self) -> int:
        return len(self._active_reqs())

    def _prefill_step(self) -> Optional[Step]:
        budget = self.server_args.chunked_prefill_size
        chunks: list[PromptChunk] = []
        if self.chunked_req is not None and self.chunked_req.finished():
            # Aborted mid-prefill: its slots go back now, and nothing of it is scheduled.
            self._release(self.chunked_req)
            self._send([self.chunked_req])
            self.chunked_req = None
        if self.chunked_req is not None:
            budget -= self._add_chunk(chunks, self.chunked_req, budget)
        reserved = self._reserved_tokens()
        admitted = self._running_count()
        self._order_waiting()
        while self.waiting and budget > 0 and admitted < self.max_running:
            req = self.waiting[0]
            if self.model_runner.req_to_token_pool.available_size() == 0:
                break
            req.req_pool_idx = self.model_runner.req_to_token_pool.alloc()
            req.kv_len = req.cached_tokens = self.tree_cache.admit(req, self._cacheable_len(req))
            need = self._budget(req) - req.kv_len
            if need > self.tree_cache.available_size() - reserved or self._chunk_len(req, budget) == 0:
                self._free_kv(req)  # it waits, and matches again next step
                req.kv_len = req.cached_tokens = 0
                break
            self.waiting.popleft()
            n = self._add_chunk(chunks, req, budget)
            reserved += need - n
            budget -= n
            admitted += 1
        if not chunks:
            return None
        return self._build_extend_step(chunks)

    def _cacheable_len(self, req: Req) -> int:
        """Most prompt tokens a request may take from the cache: never the last (its logits give
        the first output token), nor any whose prompt logprobs it asked for (they come from the
        logits of the position before)."""
        limit = len(req.origin_input_ids) - 1
        if req.logprob is not None and req.logprob.logprob_start_len < len(req.origin_input_ids):
            limit = min(limit, req.logprob.logprob_start_len - 1)
        return limit

    def _order_waiting(self) -> None:
        """--schedule-policy lpm: longest cached prefix first (SGLang falls back to FCFS for long queues)."""
        if self.server_args.schedule_policy != "lpm" or self.tree_cache.disable or len(self.waiting) > LPM_MAX_QUEUE:
            return
        matched = {id(r): self.tree_cache.match_len(r, self._cacheable_len(r)) for r in self.waiting}
        self.waiting = deque(sorted(self.waiting, key=lambda r: -matched[id(r)]))

    def _add_chunk(self, chunks: list[PromptChunk], req: Req, budget: int) -> int:
        """Schedule the next prompt chunk of `req` and give it KV slots; returns its length. The
        chunk enters the prefix cache at once, so a request admitted later in this same step
        (an n > 1 sibling) already reuses it."""
        n = self._chunk_len(req, budget)
        start = req.kv_len
        slots = self._allocate_slots([req], [n])
        self.tree_cache.cache_prefill(req)
        chunks.append(PromptChunk(req, start, n, slots))
        return n

    def _chunk_len(self, req: Req, budget: int) -> int:
        """Prompt tokens of `req` to prefill now; 0 when its next fixed chunk does not fit."""
        remaining = len(req.origin_input_ids) - req.kv_len
        if not self.deterministic:
            return min(remaining, budget)
        # Split at multiples of chunked_prefill_size from the prompt's start, never where the
        # budget left by batch-mates ends: a prompt gets the same chunks, so the same bits, in
        # every batch.
        size = self.server_args.chunked_prefill_size
        n = min(remaining, size - req.kv_len % size)
        return n if n <= budget else 0

    def _build_extend_step(self, chunks: list[PromptChunk]) -> Step:
        reqs, input_ids, sample_rows, spans = [], [], [], []
        self.chunked_req = None
        for row, (req, start, n, _) in enumerate(chunks):
            reqs.append(req)
            input_ids.extend(req.origin_input_ids[start : start + n])
            if start + n == len(req.origin_input_ids):
                sample_rows.append(row)
            else:
                self.chunked_req = req
            if req.logprob is not None and req.logprob.logprob_start_len < len(req.origin_input_ids):
                spans.append((row, req.logprob.logprob_start_len, start, start + n))
        prefix_lens = [chunk.start for chunk in chunks]
        extend_lens = [chunk.length for chunk in chunks]
        out_cache_loc = torch.cat([chunk.slots for chunk in chunks])
        forward_batch = self._forward_batch(ForwardMode.EXTEND, reqs, input_ids, prefix_lens, extend_lens, out_cache_loc)
        forward_batch.return_input_logits = bool(spans)
        sampled = [reqs[r] for r in sample_rows]
        sampled_batch = None
        if sampled:
            sampled_batch = self._schedule_batch(sampled)
            sampled_batch.sampling_info = SamplingBatchInfo.from_schedule_batch(sampled_batch, self.vocab_size)
        sample_positions = host_to_device([len(r.origin_input_ids) - 1 for r in sampled], self.device)
        return Step(ForwardMode.EXTEND, reqs, forward_batch, sample_rows, sampled_batch, sample_positions, spans, kv_slots=out_cache_loc)

    def _decode_step(self) -> Step:
        reqs = list(self.running.reqs)
        prefix_lens = [req.kv_len for req in reqs]
        out_cache_loc = self._allocate_slots(reqs, [1] * len(reqs))
        # Input ids are read from future_tokens on the worker.
        forward_batch = self._forward_batch(ForwardMode.DECODE, reqs, None, prefix_lens, [1] * len(reqs), out_cache_loc)
        # A decode row samples at the position of its one input token.
        return Step(
            ForwardMode.DECODE, reqs, forward_batch, list(range(len(reqs))), self.running, forward_batch.positions,
            kv_slots=out_cache_loc,
        )

    def _allocate_slots(self, reqs: list[Req], lens: list[int]) -> torch.Tensor:
        """[sum lens] int64 KV slots on the host, recorded in req_to_token after each request's kv_len."""
        slots = self.tree_cache.alloc(sum(lens))
        if slots is None:
            raise RuntimeError("KV cache exhausted despite admission control")
        self.model_runner.req_to_token_pool.assign([r.req_pool_idx for r in reqs], [r.kv_len for r in reqs], lens, slots)
        for req, n in zip(reqs, lens):
            req.kv_len += n
        return slots

    def _forward_batch(self, mode, reqs, input_ids, prefix_lens, extend_lens, out_cache_loc) -> ForwardBatch:
        return ForwardBatch.init_new(
            mode, input_ids, [r.req_pool_idx for r in reqs], prefix_lens, extend_lens, out_cache_loc, self.device
        )

    # ------------------------------------------------------------------ the worker

    # ------------------------------------------------------------------ results

    def process_step_result(self, step: Step, future: Future) -> None:
        """Read a step's result; a step that raised (on any TP rank) fails its requests alone."""
        try:
            error = self._step_error(future)
            if error is None:
                try:
                    self._process_step_result(step, future.result())
                except Exception as err:  # noqa: BLE001 - the same on every rank: host code on the same inputs
                    error = err
        finally:
            step.processed.set()  # the next step's grammar rows may fill their masks now
        self.step_time.observe(time.perf_counter() - step.submitted_at)
        if isinstance(error, TokenDivergenceError):
            raise error  # the ranks' states differ: no later step of theirs can be trusted
        if error is not None:
            self._fail_step(step, error)

    def _step_error(self, future: Future) -> Optional[BaseException]:
        """The step's exception, if its device work raised here or on another TP rank."""
        error = future.exception()
        if self.tp_size > 1:
            failed = torch.tensor([error is not None], dtype=torch.int32)
            dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=tp_cpu_group())
            if failed.item() and error is None:
                error = StepError("the step failed on another TP rank")
        return error

    def _fail_step(self, step: Step, error: BaseException) -> None:
        """Abort every request whose KV row holds a slot the step was to write (its own rows, and
        those that matched its prompt chunks in the prefix cache since), cache none of them, log
        the traceback once, and count the failure (too many end the server)."""
        message = f"Step {step.index} failed ({type(error).__name__}: {error}); its requests were aborted."
        logger.error("%s", message, exc_info=error if error.__traceback__ is not None else None)
        wait([self.in_flight[1]] if self.in_flight is not None else [])  # it may still write into rows of these
        self.tree_cache.poison(step.kv_slots)
        pool = self.model_runner.req_to_token_pool
        victims = {id(r): r for r in step.reqs}
        for req in self._active_reqs():
            if req.req_pool_idx is not None and bool(torch.isin(pool.slots_of(req.req_pool_idx, req.kv_len), step.kv_slots).any()):
                victims[id(req)] = req
        for req in victims.values():
            req.kv_failed = True
            if not req.finished():
                req.abort(message, status_code=500, err_type=STEP_ERROR)
        merged = any(batch is step.sampled_batch for batch in self.to_merge)
        if step.mode == ForwardMode.EXTEND and step.sampled_batch is not None and not merged:
            self.to_merge.append(step.sampled_batch)  # merged and released with the finished ones
        self._send(list(victims.values()))
        self.step_failures.record(step.index, message)

    def _send_load(self, req_id: int) -> None:
        cache, pool = self.tree_cache, self.model_runner.req_to_token_pool
        free, evictable = self.model_runner.token_to_kv_pool_allocator.available_size(), cache.evictable_size()
        used = self.max_total_tokens - free - evictable
        load = SchedulerLoad(
            req_id=req_id,
            num_running_reqs=self._running_count(),
            num_queue_reqs=self._queued_count(),
            req_slots_free=pool.available_size(),
            req_slots_total=pool.size,
            max_total_num_tokens=self.max_total_tokens,
            num_free_tokens=free,
            num_evictable_tokens=evictable,
            num_used_tokens=used,
            token_usage=used / self.max_total_tokens,
            num_steps=self.step_count,
            num_failed_steps=self.step_failures.total,
            step_time_buckets=self.step_time.buckets,
            step_time_counts=self.step_time.cumulative(),
            step_time_sum=self.step_time.sum,
        )
        if self.tp_rank == 0:
            self.send_socket.send(encode(BatchTokenOut(outs=[], load=load)))

    def _process_step_result(self, step: Step, result: StepResult) -> None:
        if result.ready is not None:
            # The one read of the device per step: this step's tokens (the next step is already queued).
            result.ready.synchronize()
        next_ids = result.next_ids.tolist()
        for row, entries in result.input_logprobs.items():
            self._record_input_logprobs(step.reqs[row], entries)
        sampled = [step.reqs[r] for r in step.sample_rows]
        for i, req in enumerate(sampled):
            if req.finished():
                continue  # finished at the previous step (overlap) or aborted: drop this token
            self._record_token(req, next_ids[i], result.row_errors.get(i), result.output_logprobs[i])
        if step.mode == ForwardMode.EXTEND and sampled:
            self.to_merge.append(step.sampled_batch)
        self._send([r for r in step.reqs if r.finished() or (r.stream and self._stream_due(r))])

    def _stream_due(self, req: Req) -> bool:
        """--stream-interval: the first token at once (it is the TTFT), then every N tokens."""
        unsent = len(req.output_ids) - req.sent_output_len
        return unsent > 0 and (req.sent_output_len == 0 or unsent >= self.stream_interval)

    def _record_input_logprobs(self, req: Req, entries: list) -> None:
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

    def _record_token(self, req: Req, token: int, error: Optional[str], logprobs: Optional[tuple]) -> None:
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

    def _send(self, reqs: list[Req]) -> None:
        if self.tp_rank != 0:
            return
        outs = []
        for req in reqs:
            if req.finish_sent:
                continue  # e.g. aborted by the client while a step was in flight
            outs.append(self._token_out(req))
            req.finish_sent = req.finished()
        if outs:
            self.send_socket.send(encode(BatchTokenOut(outs=outs)))

    @staticmethod
    def _token_out(req: Req) -> TokenOut:
        params = req.sampling_params
        first = req.sent_output_len == 0
        new_ids = req.output_ids[req.sent_output_len :]
        req.sent_output_len = len(req.output_ids)
        pending, req.pending_logprobs = req.pending_logprobs, type(req.pending_logprobs)()
        want = req.logprob
        return TokenOut(
            rid=req.rid,
            new_output_ids=new_ids,
            finished_reason=req.finished_reason,
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            no_stop_trim=params.no_stop_trim,
            output_token_logprobs=pending.output_token if want else None,
            output_top_logprobs=pending.output_top if want and want.top_logprobs_num else None,
            output_token_ids_logprobs=pending.output_token_ids if want and want.token_ids_logprob else None,
            input_token_logprobs=pending.input_token,
            input_top_logprobs=pending.input_top if want and want.top_logprobs_num else None,
            input_token_ids_logprobs=pending.input_token_ids if want and want.token_ids_logprob else None,
            matched_text=req.matched_text,
            stop_strs=params.stop_strs if first and req.stream and not params.no_stop_trim else None,
        )


def _last_token_in_flight(req: Req) -> bool:
    """Whether the token of the in-flight step (one past the host's output_ids) ends `req` by length."""
    limit = req.sampling_params.max_new_tokens
    return limit is not None and len(req.output_ids) + 1 >= limit


def rank_device(server_args: ServerArgs, dp_rank: int, tp_rank: int) -> torch.device:
    """The GPU placement.gpu_id gives this rank; on CPU all ranks share the host."""
    if server_args.device != "cuda":
        return torch.device(server_args.device)
    args = server_args
    return torch.device(f"cuda:{gpu_id(dp_rank, tp_rank, args.tp_size, args.nnodes, args.base_gpu_id, args.gpu_id_step)}")


def _kv_memory_fraction(server_args: ServerArgs, dp_rank: int, tp_rank: int) -> Optional[float]:
    """--mem-fraction-static, split between the ranks that share a GPU (replicas with
    --gpu-id-step 0): each measures the free memory when its own weights are in, so equal
    shares of the fraction never add up to more than it."""
    args = server_args
    if args.device != "cuda":
        return args.mem_fraction_static
    sharing = ranks_sharing_gpu(dp_rank, tp_rank, args.dp_size, args.tp_size, args.nnodes, args.base_gpu_id, args.gpu_id_step)
    if sharing == 1:
        return args.mem_fraction_static
    return (args.mem_fraction_static or CUDA_KV_FREE_FRACTION) / sharing


def _pin_replica_cores(server_args: ServerArgs, dp_rank: int) -> None:
    """On CPU with several replicas, each takes its share of the cores (its torch threads too)."""
    if server_args.device != "cpu" or server_args.dp_size == 1:
        return
    cores = replica_cores(dp_rank, server_args.dp_size)
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    logger.info("CPU cores %s", cores)


def _yield_cores_to_front_end(server_args: ServerArgs) -> None:
    """On CPU the HTTP process shares the cores with the forward's OpenMP team, which spins on
    all of them. At equal priority a streamed token waits for the running step's threads to
    use up their time slice before it goes out; a lower priority for the scheduler lets the
    front end run as soon as a result arrives (paired A/B, 2 cores: TTFT median 13.9 -> 11.1 ms,
    ITL unchanged). Set before the forward's threads start, so they inherit it."""
    if server_args.device != "cpu":
        return
    if not os.path.isdir("/proc/self/task"):
        os.nice(CPU_SCHEDULER_NICE)  # the whole process where priority is per process (macOS)
        return
    for tid in map(int, os.listdir("/proc/self/task")):  # Linux: per thread, imports may have started some
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + CPU_SCHEDULER_NICE, 19))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def _init_worker(device: torch.device, threads: int) -> None:
    # torch's thread count is per thread under OpenMP. libgomp counts the threads of every
    # team in the process: once they outnumber the cores (a second team, started by one large
    # op on the scheduler thread, is enough on 2 cores), its waiting threads spin only ~100
    # times before sleeping, and each of a decode step's hundreds of parallel regions pays a
    # futex wake-up (measured: the B=16 forward 30% slower than the same step run alone).
    torch.set_num_threads(threads)
    # A new thread starts on CUDA device 0; allocations without an explicit device and NCCL
    # calls of the forward worker must land on this rank's GPU.
    if device.type == "cuda":
        torch.cuda.set_device(device)


def run_scheduler_process(
    server_args: ServerArgs, port_args: PortArgs, tp_rank: int, ready_writer: Any, dp_rank: int = 0
) -> None:
    """Process entry: load the model, report readiness (rank 0) or the start-up error, then serve."""
    name = scheduler_name(dp_rank, tp_rank, server_args.dp_size)
    prefix = f"dp{dp_rank} tp{tp_rank}" if server_args.dp_size > 1 else str(tp_rank)
    logging.basicConfig(level=server_args.log_level.upper(), format=f"[scheduler {prefix}] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns Ctrl-C and sends SIGTERM
    logger.info("TP rank %d of %d: pid %d", tp_rank, server_args.tp_size, os.getpid())
    _pin_replica_cores(server_args, dp_rank)
    _yield_cores_to_front_end(server_args)
    try:
        scheduler = Scheduler(server_args, port_args, tp_rank, dp_rank)
    except Exception as err:  # noqa: BLE001 - reported to the launcher verbatim
        ready_writer.send(f"{name} failed to start: {err!r}\n{traceback.format_exc()}")
        raise SystemExit(1) from err
    if tp_rank == 0:
        ready_writer.send(encode(scheduler.ready_message()))
    try:
        scheduler.event_loop()
    except Exception as err:
        if not tp_group_lost(err):
            # The launcher's watchdog reports this reason when it sees the process exit.
            ready_writer.send(f"{name} failed: {type(err).__name__}: {err}")
            raise
        if server_args.node_rank > 0:
            # Node 0 stopped (or another node failed, which node 0 reports): this node stops with it.
            logger.info("The TP group closed (%s); this node stops.", err)
            logging.shutdown()
            os._exit(0)  # the forward thread may still wait in a collective of the closed group
        ready_writer.send(f"{name} lost its TP group (a rank on another node stopped, or the network failed): {err}")
        raise
