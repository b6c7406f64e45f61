"""TokenizerManager: request validation, tokenization, fan-out and result streaming (main process).

A request travels as TokenizedGenerateReqInput over ZMQ to scheduler rank 0; its results come
back on a socket this class binds: from the detokenizer process as BatchStrOut, or with
--detokenizer-mode inline from the scheduler as BatchTokenOut, detokenized here. Every request
has a ReqState per child (n > 1 fans out into n children) that the socket's reader updates;
the generator of the request wakes on its group's event and yields cumulative SGLang-native dicts.
The parts: request_validator (prepare_request's checks), fan_out (n > 1 children, the merge of
several requests' streams: generate_many / run_many / collect), request_state (the dicts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional

import zmq

from sglang.srt.managers.detokenizer_manager import DETOKENIZATION_ERROR, results_decoder
from sglang.srt.managers.io_struct import (
    QUEUE_FULL,
    AbortReq,
    BatchStrOut,
    FlushCacheReq,
    GenerateReqInput,
    GetLoadReq,
    SchedulerLoad,
    SchedulerReady,
    StrOut,
    TokenizedGenerateReqInput,
    encode,
)
from sglang.srt.managers.fan_out import ManyRequests, PreparedRequest, fan_out
from sglang.srt.managers.load_queries import LoadQueries
from sglang.srt.managers.request_extras import PRIORITY_DISABLED_MESSAGE, message_fields, priority_refused
from sglang.srt.managers.reasoning_tokens import think_end_ids
from sglang.srt.managers.request_logger import RequestLogger
from sglang.srt.managers.request_state import ReqGroup, ReqState, apply_token_out, child_state, snapshot
from sglang.srt.managers.request_validator import RequestValidator
from sglang.srt.managers.results_channel import results_source
from sglang.srt.managers.results_router import worker_endpoints
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_S = 20.0
HEALTH_CHECK_NAMESPACE = "__sglang_health_check__"
LOAD_TIMEOUT_S = 60.0  # the scheduler answers between steps; a loaded CPU step can take seconds
ABORTED_BY_CLIENT = {
    "type": "abort", "message": "The request was aborted.", "status_code": 499, "err_type": "ClientClosedRequest",
}

ABORTED_BY_SHUTDOWN = {
    "type": "abort",
    "message": "The server is shutting down: the request did not finish within --graceful-shutdown-timeout.",
    "status_code": 503,
    "err_type": "ServerShutdown",
}


class ServiceUnavailableError(RuntimeError):
    """The scheduler refused the request for load (--max-queued-requests), or is gone: HTTP 503."""


class TokenizerManager(ManyRequests):
    def __init__(
        self, server_args: ServerArgs, port_args: PortArgs, ready: SchedulerReady, tokenizer: Any, worker_id: int = 0
    ) -> None:
        """worker_id: which of the --tokenizer-worker-num HTTP workers this is (its results endpoint)."""
        self.server_args = server_args
        self.ready = ready
        self.tokenizer = tokenizer  # None with --skip-tokenizer-init
        self.request_logger = RequestLogger(server_args.log_requests, server_args.log_requests_level)
        self.validator = RequestValidator(server_args, ready, tokenizer)
        self.think_end_ids = think_end_ids(tokenizer, server_args.reasoning_parser)
        # Sends never block: PUSH to a connected endpoint queues and the HWM is unlimited, so
        # abort can be sent from a generator's finally (even during garbage collection).
        self._sync_ctx = zmq.Context()
        self._send_sock = self._sync_ctx.socket(zmq.PUSH)
        self._send_sock.setsockopt(zmq.SNDHWM, 0)
        self._send_sock.setsockopt(zmq.LINGER, 0)
        self._send_sock.connect(port_args.scheduler_input_ipc)
        # Read from the loop's own reader callbacks, not zmq.asyncio, whose futures and flag
        # enums cost CPU on every streamed token's message (docs/serving.md).
        self._decode_results = results_decoder(server_args.detokenizer_process(), tokenizer)
        endpoint = worker_endpoints(server_args, port_args)[worker_id]
        # Stamped on what this worker sends, so the answers come back here (None: the only worker).
        self.http_worker_ipc = endpoint if server_args.tokenizer_worker_num > 1 else None
        self._results = results_source(server_args, endpoint, self._sync_ctx, self._on_results)
        self._states: dict[str, ReqState] = {}
        self._children_of: dict[str, list[str]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the loop whose reader receives
        self._loads = LoadQueries(server_args.dp_size)
        self._down_message: Optional[str] = None  # set when the scheduler died (fail_all)
        self.metrics = None
        if server_args.enable_metrics:
            from sglang.srt.metrics.collector import TokenizerMetricsCollector

            self.metrics = TokenizerMetricsCollector(server_args.served_model_name)
        self.accepting = True  # False once a graceful shutdown began

    # ------------------------------------------------------------------ public API

    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        """Yield `{"text", "output_ids", "meta_info"}` dicts for one request.

        Streaming: a cumulative dict after every update, the last one finished (with
        --stream-output, each dict's output_ids holds only the ids new since the previous one).
        Otherwise one final dict per child. With --skip-tokenizer-init the dicts have no "text".
        With n > 1 every dict also carries "index" (the child, 0..n-1).
        Invalid requests raise ValueError on the first iteration, before anything is sent.
        """
        prepared = self.prepare_request(obj)
        # aclosing: an early exit of our consumer must reach run_prepared's abort at once.
        async with contextlib.aclosing(self.run_prepared(prepared)) as results:
            async for out in results:
                yield out

    def prepare_request(self, obj: GenerateReqInput, grammar_checked: bool = False) -> PreparedRequest:
        """Tokenize and validate; raises ValueError naming the offending parameter.

        grammar_checked: the caller validated the request's grammar already (the OpenAI routes
        check a response_format where it enters, so that their errors name that field).
        """
        input_ids, params = self.validator.validate(obj, grammar_checked)
        if self.server_args.enable_deterministic_inference and params.sampling_seed is None:
            # Every sampled row takes the seeded path in this mode; a fresh seed per request (not
            # one shared by all) keeps unseeded requests independent, and meta_info reports it.
            params.sampling_seed = secrets.randbits(63)
        if priority_refused(obj.priority, self.server_args):
            raise ServiceUnavailableError(PRIORITY_DISABLED_MESSAGE)
        rid = obj.rid if obj.rid is not None else uuid.uuid4().hex
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"rid must be a non-empty string, got {rid!r}.")
        base = TokenizedGenerateReqInput(
            rid=rid,
            input_ids=input_ids,
            sampling_params=params.to_message(),
            return_logprob=obj.return_logprob,
            logprob_start_len=obj.logprob_start_len,
            top_logprobs_num=obj.top_logprobs_num,
            token_ids_logprob=obj.token_ids_logprob,
            custom_logit_processor=obj.custom_logit_processor,
            stream=obj.stream,
            extra_key=obj.extra_key,
            http_worker_ipc=self.http_worker_ipc,
            **message_fields(obj, self.server_args),
        )
        # A beam search is one request whatever its n (the number of beams it returns).
        children = fan_out(base, 1 if (params.beam_width or 1) > 1 else params.n)
        return PreparedRequest(rid, obj.stream, children, obj.return_text_in_logprobs, obj)

    async def run_prepared(self, prepared: PreparedRequest) -> AsyncIterator[dict[str, Any]]:
        """Send a prepared request and yield its results (see generate_request)."""
        if self._down_message is not None:
            raise ServiceUnavailableError(self._down_message)
        self._ensure_receiving()
        group = self._register(prepared)
        indexed = len(prepared.children) > 1
        logged = self._logged_request(prepared)
        try:
            for child in prepared.children:
                self._send_sock.send(encode(child))
            # Taken again after each yield: a child that finished meanwhile still yields its final dict.
            while (dirty := self._take_dirty(group)) or group.unfinished():
                if not dirty:
                    await group.event.wait()
                    group.event.clear()
                    continue
                for state in dirty:
                    _raise_if_refused(state)
                    if prepared.stream or state.finished_reason is not None:
                        out = self._snapshot(state, indexed)
                        if logged is not None and state.finished_reason is not None:
                            # The whole output, also when --stream-output made this chunk a delta.
                            self.request_logger.finished(logged, {**out, "output_ids": state.output_ids})
                        yield out
        finally:
            # Reached early on cancellation or client disconnect: stop the scheduler's work.
            for state in group.unfinished():
                self._abort_child(state, notify=False)
            self._children_of.pop(prepared.rid, None)

    def abort_request(self, rid: str) -> None:
        """Abort a request (all its children when n > 1); its generator finishes with abort. A rid
        another tokenizer worker holds is aborted by the scheduler, which tells that worker."""
        if self.http_worker_ipc is not None and rid not in self._children_of and rid not in self._states:
            self._send_sock.send(encode(AbortReq(rid=rid)))
        for child_rid in self._children_of.get(rid, [rid]):
            state = self._states.get(child_rid)
            if state is not None:
                self._abort_child(state, notify=True)

    def abort_all(self, reason: dict[str, Any] = ABORTED_BY_CLIENT, server_wide: bool = False) -> None:
        """SGLang's abort_all: every running or waiting request of this worker finishes with abort;
        server_wide: the other tokenizer workers' requests too (the scheduler aborts them)."""
        if server_wide and self.http_worker_ipc is not None:
            self._send_sock.send(encode(AbortReq(rid="", abort_all=True)))
        for state in list(self._states.values()):
            self._abort_child(state, notify=True, reason=reason)

    def num_requests(self) -> int:
        """Children sent to the scheduler and not yet finished."""
        return len(self._states)

    async def get_load(self, timeout: float = LOAD_TIMEOUT_S) -> SchedulerLoad:
        """The schedulers' live state, summed over the --dp-size replicas (each answers the
        query once); TimeoutError when they do not all answer in time."""
        self._ensure_receiving()
        return await self._loads.ask(lambda req_id: self._send_sock.send(
            encode(GetLoadReq(req_id=req_id, http_worker_ipc=self.http_worker_ipc))), timeout)

    async def health(self, timeout: float = HEALTH_CHECK_TIMEOUT_S) -> bool:
        """True when a one-token generation makes the round trip within `timeout` seconds."""
        obj = GenerateReqInput(
            input_ids=[0],
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            # A prefix-cache namespace of its own: a client's fresh prompt never counts its token as cached.
            extra_key=HEALTH_CHECK_NAMESPACE,
        )
        try:
            await asyncio.wait_for(self._drain(obj), timeout)
        except asyncio.TimeoutError:
            logger.warning("Health check timed out after %.0f s", timeout)
            return False
        return True

    def flush_cache(self) -> bool:
        """SGLang's /flush_cache: empty the prefix cache; refused (False) while any request runs.
        The scheduler reads its input in order, so every later request sees the emptied cache."""
        if self._states:
            return False
        self._send_sock.send(encode(FlushCacheReq()))
        return True

    async def flush_cache_server_wide(self) -> bool:
        """flush_cache, refused also while another tokenizer worker's requests run or wait (the
        scheduler's load counts them)."""
        if self.http_worker_ipc is not None:
            try:
                load = await self.get_load()
            except asyncio.TimeoutError:
                return False
            if load.num_running_reqs or load.num_queue_reqs:
                return False
        return self.flush_cache()

    def fail_all(self, message: str) -> None:
        """Finish every running request with an abort, e.g. when the scheduler died. Thread-safe."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_all, message)

    def _fail_all(self, message: str) -> None:
        self._down_message = message  # later requests are refused at once: nothing would answer them
        reason = {"type": "abort", "message": message, "status_code": 503, "err_type": "ServiceUnavailable"}
        for state in list(self._states.values()):
            state.finished_reason = dict(reason)
            state.dirty = True
            state.group.event.set()
        self._states.clear()

    def close(self) -> None:
        """Release the sockets (after the serving loop has stopped)."""
        self._results.close()
        self._sync_ctx.destroy(linger=0)

    # ------------------------------------------------------------------ request state

    def _register(self, prepared: PreparedRequest) -> ReqGroup:
        group = ReqGroup()
        for rid in [prepared.rid] + [child.rid for child in prepared.children]:
            if rid in self._states or rid in self._children_of:
                raise ValueError(f"Duplicate request ID: rid {rid!r} is already in use by a running request.")
        counts_reasoning = prepared.obj is not None and prepared.obj.require_reasoning
        end_ids = (self.think_end_ids or []) if counts_reasoning else None
        for index, child in enumerate(prepared.children):
            state = child_state(child, index, group, prepared.return_text_in_logprobs, end_ids)
            group.children.append(state)
            self._states[state.rid] = state
        self._children_of[prepared.rid] = [s.rid for s in group.children]
        return group

    def _abort_child(self, state: ReqState, notify: bool, reason: dict[str, Any] = ABORTED_BY_CLIENT) -> None:
        self._send_sock.send(encode(AbortReq(rid=state.rid)))
        self._states.pop(state.rid, None)
        state.finished_reason = dict(reason)
        self._record_finish(state)
        state.dirty = notify
        if notify:
            state.group.event.set()

    @staticmethod
    def _take_dirty(group: ReqGroup) -> list[ReqState]:
        dirty = [c for c in group.children if c.dirty]
        for c in dirty:
            c.dirty = False
        return dirty

    async def _drain(self, obj: GenerateReqInput) -> None:
        async for _ in self.generate_request(obj):
            pass

    # ------------------------------------------------------------------ results

    def _ensure_receiving(self) -> None:
        # Registered lazily so results reach the loop that serves the requests (uvicorn's).
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._results.attach(loop)
            self._loop = loop

    def _on_results(self, data: bytes) -> None:
        try:
            self._handle_batch(self._decode_results(data))
        except Exception:  # the reader must go on: the other messages are other requests'
            logger.exception("Dropping a results message (undecodable, or it failed)")

    def _handle_batch(self, batch: BatchStrOut) -> None:
        if batch.load is not None:
            self._loads.on_reply(batch.load)
        for out in batch.outs:
            try:
                self._apply(out)
            except Exception:  # one bad result must not stop the reader that serves them all
                logger.exception("Dropping a result for request %s", out.token.rid)

    def _apply(self, out: StrOut) -> None:
        token = out.token
        state = self._states.get(token.rid)
        if state is None:  # aborted, or a finished request's late message
            return
        apply_token_out(state, out, self._token_text)
        if token.new_output_ids:
            self._record_tokens(state, len(token.new_output_ids))
        if token.finished_reason is not None:
            state.finished_reason = token.finished_reason
            state.beam_results = token.beam_results
            del self._states[token.rid]
            self._record_finish(state)
            if token.finished_reason.get("err_type") == DETOKENIZATION_ERROR:
                self._send_sock.send(encode(AbortReq(rid=token.rid)))  # the scheduler still runs it
        state.dirty = True
        state.group.event.set()

    def _record_tokens(self, state: ReqState, count: int) -> None:
        now = time.perf_counter()
        if self.metrics is not None:
            if state.last_token_at is None:
                self.metrics.first_token(now - state.created_at)
            else:
                self.metrics.later_tokens(now - state.last_token_at, count)
        state.last_token_at = now

    def _record_finish(self, state: ReqState) -> None:
        if self.metrics is not None:
            elapsed = time.perf_counter() - state.created_at
            self.metrics.finished(
                state.prompt_tokens, state.completion_tokens, elapsed, state.finished_reason, state.cached_tokens
            )
            if state.spec_counts[0]:
                self.metrics.spec_finished(state.completion_tokens / state.spec_counts[0])

    def _logged_request(self, prepared: PreparedRequest) -> Optional[GenerateReqInput]:
        """--log-requests: log the request's arrival; returns what its finish line shows (None: not logged)."""
        if prepared.obj is None or not self.request_logger.wants(prepared.rid):
            return None
        obj = dataclasses.replace(prepared.obj, rid=prepared.rid)
        self.request_logger.received(obj)
        return obj

    def _snapshot(self, state: ReqState, indexed: bool) -> dict[str, Any]:
        # SGLang's --stream-output: a streamed chunk carries only the ids new since the last one.
        return snapshot(state, indexed, not self.server_args.skip_tokenizer_init, self.server_args.stream_output)

    def _token_text(self, token_id: int) -> Optional[str]:
        # --skip-tokenizer-init: no text, as SGLang (return_text_in_logprobs gives null texts).
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else None


def _raise_if_refused(state: ReqState) -> None:
    reason = state.finished_reason
    if reason is not None and reason.get("err_type") == QUEUE_FULL:
        raise ServiceUnavailableError(reason["message"])


