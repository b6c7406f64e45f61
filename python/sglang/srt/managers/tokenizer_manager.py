"""TokenizerManager: request validation, tokenization, fan-out and result streaming (main process).

A request travels as TokenizedGenerateReqInput over ZMQ to scheduler rank 0; its results come
back on a socket this class binds: from the detokenizer process as BatchStrOut, or with
--detokenizer-mode inline from the scheduler as BatchTokenOut, detokenized here. Every request
has a _ReqState per child (n > 1 fans out into n children) that the socket's reader updates;
the generator of the request wakes on its group's event and yields cumulative SGLang-native dicts.
This is the one place where n is fanned out (_fan_out, with derive_child_seed) and where the
streams of several requests are merged (merge_indexed): /generate, the OpenAI routes and the
offline Engine all go through generate_many / run_many.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import itertools
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec
import zmq

from sglang.srt.managers.detokenizer_manager import DETOKENIZATION_ERROR, DetokenizerManager
from sglang.srt.managers.io_struct import (
    QUEUE_FULL,
    AbortReq,
    BatchStrOut,
    BatchTokenOut,
    FlushCacheReq,
    GenerateReqInput,
    GetLoadReq,
    SchedulerLoad,
    SchedulerReady,
    StrOut,
    TokenizedGenerateReqInput,
    decoder,
    encode,
    sum_loads,
)
from sglang.srt.managers.request_logger import RequestLogger
from sglang.srt.managers.results_channel import results_source
from sglang.srt.sampling.logits_processor.loader import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_S = 20.0
LOAD_TIMEOUT_S = 60.0  # the scheduler answers between steps; a loaded CPU step can take seconds
ABORTED_BY_CLIENT = {
    "type": "abort",
    "message": "The request was aborted.",
    "status_code": 499,
    "err_type": "ClientClosedRequest",
}

ABORTED_BY_SHUTDOWN = {
    "type": "abort",
    "message": "The server is shutting down: the request did not finish within --graceful-shutdown-timeout.",
    "status_code": 503,
    "err_type": "ServerShutdown",
}

_MASK64 = (1 << 64) - 1


def derive_child_seed(seed: int, index: int) -> int:
    """Seed of child `index` of a seeded n > 1 request: a splitmix64 mix, signed 64-bit.

    The mix is a bijection of seed + (index + 1) * golden, so children of one seed never collide
    and the same (seed, index) gives the same child seed on every call and every server.
    """
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


class ServiceUnavailableError(RuntimeError):
    """The scheduler refused the request for load (--max-queued-requests), or is gone: HTTP 503."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class _Group:
    """The children of one request share an event, so one waiter serves all of them."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    children: list["_ReqState"] = field(default_factory=list)

    def unfinished(self) -> list["_ReqState"]:
        return [c for c in self.children if c.finished_reason is None]


@dataclass
class _ReqState:
    rid: str
    index: int
    group: _Group
    stream: bool
    return_logprob: bool
    want_top: bool
    want_token_ids: bool
    text_in_logprobs: bool
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished_reason: Optional[dict[str, Any]] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    sampling_seed: Optional[int] = None
    logprobs: dict[str, list[Any]] = field(default_factory=dict)
    dirty: bool = False
    streamed_ids: int = 0  # output ids already sent in chunks (--stream-output)
    created_at: float = field(default_factory=time.perf_counter)
    last_token_at: Optional[float] = None  # when output ids last arrived (--enable-metrics)


@dataclass
class PreparedRequest:
    """A validated request: one scheduler message per child (n of them)."""

    rid: str
    stream: bool
    children: list[TokenizedGenerateReqInput]
    return_text_in_logprobs: bool
    obj: Optional[GenerateReqInput] = None  # the request as received, for --log-requests


class TokenizerManager:
    def __init__(
        self, server_args: ServerArgs, port_args: PortArgs, ready: SchedulerReady, tokenizer: Any
    ) -> None:
        self.server_args = server_args
        self.ready = ready
        self.tokenizer = tokenizer  # None with --skip-tokenizer-init
        self.request_logger = RequestLogger(server_args.log_requests, server_args.log_requests_level)
        self.preferred_sampling_params = server_args.preferred_sampling_params_dict()
        # The batch-level processor classes, for their validate_params (the scheduler runs them).
        self.logits_processors = LoadedLogitsProcessors.from_server_args(server_args, "cpu")
        # Sends never block: PUSH to a connected endpoint queues and the HWM is unlimited, so
        # abort can be sent from a generator's finally (even during garbage collection).
        self._sync_ctx = zmq.Context()
        self._send_sock = self._sync_ctx.socket(zmq.PUSH)
        self._send_sock.setsockopt(zmq.SNDHWM, 0)
        self._send_sock.setsockopt(zmq.LINGER, 0)
        self._send_sock.connect(port_args.scheduler_input_ipc)
        # Read from the loop's own reader callbacks, not zmq.asyncio, whose futures and flag
        # enums cost CPU on every streamed token's message (docs/serving.md).
        self._decode_results = _results_decoder(server_args.detokenizer_process(), tokenizer)
        self._results = results_source(server_args, port_args, self._sync_ctx, self._on_results)
        self._states: dict[str, _ReqState] = {}
        self._children_of: dict[str, list[str]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the loop whose reader receives
        self._load_ids = itertools.count()
        self._load_waiters: dict[int, asyncio.Future] = {}
        self._down_message: Optional[str] = None  # set when the scheduler died (fail_all)
        self._load_replies: dict[int, list[SchedulerLoad]] = {}  # replicas' answers so far, per query
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
        input_ids = self._tokenize(obj)
        params = self._sampling_params(obj.sampling_params)
        if self.server_args.enable_deterministic_inference and params.sampling_seed is None:
            # Every sampled row takes the seeded path in this mode; a fresh seed per request (not
            # one shared by all) keeps unseeded requests independent, and meta_info reports it.
            params.sampling_seed = secrets.randbits(63)
        self._check_context(len(input_ids), params.max_new_tokens)
        self._check_custom_logit_processor(obj.custom_logit_processor)
        if not grammar_checked:
            self._check_grammar(params)
        self._check_flags(obj)
        self._check_logprob_args(obj, len(input_ids))
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
        )
        return PreparedRequest(rid, obj.stream, _fan_out(base, params.n), obj.return_text_in_logprobs, obj)

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
            while group.unfinished():
                await group.event.wait()
                group.event.clear()
                for state in self._take_dirty(group):
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

    async def generate_many(
        self, objs: Sequence[GenerateReqInput], grammar_checked: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        """Several requests (each fanned out into its n children) as one stream of result dicts,
        each with "index" = its child's position: the requests in order, each one's children
        in order. A ValueError for any invalid request is raised on the first iteration, before
        anything is sent. grammar_checked: as for prepare_request."""
        prepared = [self.prepare_request(obj, grammar_checked) for obj in objs]
        async with contextlib.aclosing(self.run_many(prepared)) as results:
            async for out in results:
                yield out

    def run_many(self, prepared: Sequence[PreparedRequest]) -> AsyncIterator[dict[str, Any]]:
        """Send prepared requests; their results merged as generate_many yields them."""
        return merge_indexed([self.run_prepared(p) for p in prepared], [len(p.children) for p in prepared])

    async def collect(self, prepared: Sequence[PreparedRequest]) -> list[dict[str, Any]]:
        """The final result of every child of the prepared requests, in child order, without "index"."""
        async with contextlib.aclosing(self.run_many(prepared)) as results:
            outs = [out async for out in results]
        outs.sort(key=lambda out: out["index"])
        for out in outs:
            del out["index"]
        return outs

    def abort_request(self, rid: str) -> None:
        """Abort a request (all its children when n > 1); its generator finishes with abort."""
        for child_rid in self._children_of.get(rid, [rid]):
            state = self._states.get(child_rid)
            if state is not None:
                self._abort_child(state, notify=True)

    def abort_all(self, reason: dict[str, Any] = ABORTED_BY_CLIENT) -> None:
        """SGLang's abort_all: every running or waiting request finishes with abort."""
        for state in list(self._states.values()):
            self._abort_child(state, notify=True, reason=reason)

    def num_requests(self) -> int:
        """Children sent to the scheduler and not yet finished."""
        return len(self._states)

    async def get_load(self, timeout: float = LOAD_TIMEOUT_S) -> SchedulerLoad:
        """The schedulers' live state, summed over the --dp-size replicas (each answers the
        query once); TimeoutError when they do not all answer in time."""
        self._ensure_receiving()
        req_id = next(self._load_ids)
        waiter = self._load_waiters[req_id] = asyncio.get_running_loop().create_future()
        self._load_replies[req_id] = []
        try:
            self._send_sock.send(encode(GetLoadReq(req_id=req_id)))
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._load_waiters.pop(req_id, None)
            self._load_replies.pop(req_id, None)

    def _on_load_reply(self, load: SchedulerLoad) -> None:
        waiter, replies = self._load_waiters.get(load.req_id), self._load_replies.get(load.req_id)
        if waiter is None or waiter.done() or replies is None:
            return
        replies.append(load)
        if len(replies) == self.server_args.dp_size:
            waiter.set_result(sum_loads(replies))

    async def health(self, timeout: float = HEALTH_CHECK_TIMEOUT_S) -> bool:
        """True when a one-token generation makes the round trip within `timeout` seconds."""
        obj = GenerateReqInput(
            input_ids=[0],
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
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

    # ------------------------------------------------------------------ validation

    def _tokenize(self, obj: GenerateReqInput) -> list[int]:
        if (obj.text is None) == (obj.input_ids is None):
            raise ValueError("Exactly one of text or input_ids must be given.")
        if obj.text is not None:
            if not isinstance(obj.text, str):
                raise ValueError(f"text must be a string, got {type(obj.text).__name__}.")
            if not obj.text:  # checked before encoding, which may add a BOS token
                raise ValueError("The input is empty: text must not be an empty string.")
            if self.tokenizer is None:
                raise ValueError(
                    "This server runs with --skip-tokenizer-init and cannot tokenize text: send input_ids instead."
                )
            ids = self.tokenizer.encode(obj.text)
        else:
            ids = obj.input_ids
            if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
                raise ValueError("input_ids must be a flat list of integers.")
            self._check_vocab("input_ids", ids)
        if not ids:
            raise ValueError("The input is empty: text or input_ids must contain at least one token.")
        return list(ids)

    def _check_vocab(self, name: str, ids: Sequence[int]) -> None:
        vocab = self.ready.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise ValueError(f"{name} contains out-of-vocabulary token id {t}; valid range is [0, {vocab}).")

    def _sampling_params(self, raw: Any) -> SamplingParams:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ValueError(f"sampling_params must be an object, got {type(raw).__name__}.")
        params = SamplingParams.from_dict({**self.preferred_sampling_params, **raw})
        params.normalize(self.tokenizer)
        params.verify(self.ready.vocab_size)
        if params.thinking_token_budget is not None and self.tokenizer is None:
            raise ValueError("thinking_token_budget needs the tokenizer to find the think markers, which --skip-tokenizer-init leaves unloaded.")
        self.logits_processors.validate(params)
        return params

    def _check_context(self, input_len: int, max_new_tokens: Optional[int]) -> None:
        context = self.ready.context_len
        if input_len >= context:
            raise ValueError(
                f"The input ({input_len} tokens) is longer than the model's context length ({context} tokens)."
            )
        if max_new_tokens is not None and input_len + max_new_tokens > context:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {context} tokens: "
                f"{input_len} input tokens + max_new_tokens={max_new_tokens}. Reduce the input or max_new_tokens."
            )

    def _check_grammar(self, params: SamplingParams) -> None:
        """A grammar this server cannot enforce, or that does not parse, is a 400 before anything is queued."""
        from sglang.srt.constrained.base_grammar_backend import grammar_key
        from sglang.srt.constrained.grammar_backends import validate_grammar

        key = grammar_key(params)
        if key is None:
            return
        if self.tokenizer is None:
            raise ValueError(f"{key.kind} needs the tokenizer, which --skip-tokenizer-init leaves unloaded.")
        if self.server_args.grammar_backend == "none":
            raise ValueError(f"{key.kind} needs a grammar backend; this server runs with --grammar-backend none.")
        validate_grammar(self.server_args.grammar_backend, key)

    def _check_custom_logit_processor(self, processor: Optional[str]) -> None:
        if processor is None:
            return
        # torch-heavy module, and a request with a processor is the rare case.
        from sglang.srt.sampling import custom_logit_processor as clp

        if not self.server_args.enable_custom_logit_processor:
            raise ValueError(clp.DISABLED_MESSAGE)  # before any deserialisation
        if not isinstance(processor, str):
            raise ValueError(f"custom_logit_processor must be a string, got {type(processor).__name__}.")
        try:
            clp.load_custom_logit_processor(processor, allowlist=self.server_args.allowlist())
        except clp.CustomLogitProcessorError:
            raise
        except Exception as err:  # a processor's own constructor may raise anything
            raise ValueError(f"custom_logit_processor: cannot instantiate ({type(err).__name__}: {err})") from None

    @staticmethod
    def _check_flags(obj: GenerateReqInput) -> None:
        for name in ("return_logprob", "return_text_in_logprobs", "stream"):
            if not isinstance(getattr(obj, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(obj, name)!r}.")
        if obj.extra_key is not None and not isinstance(obj.extra_key, str):
            raise ValueError(f"extra_key must be a string, got {obj.extra_key!r}.")

    def _check_logprob_args(self, obj: GenerateReqInput, input_len: int) -> None:
        top, top_max = obj.top_logprobs_num, self.server_args.max_top_logprobs_num
        if not (_is_int(top) and 0 <= top <= top_max):
            raise ValueError(
                f"top_logprobs_num must be an integer in [0, {top_max}] (--max-top-logprobs-num), got {top!r}."
            )
        start = obj.logprob_start_len
        if not (_is_int(start) and -1 <= start <= input_len):
            raise ValueError(
                f"logprob_start_len must be -1 or an integer in [0, {input_len}] (the prompt length), got {start!r}."
            )
        ids = obj.token_ids_logprob
        if ids is not None:
            if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
                raise ValueError("token_ids_logprob must be a flat list of integers.")
            self._check_vocab("token_ids_logprob", ids)

    # ------------------------------------------------------------------ request state

    def _register(self, prepared: PreparedRequest) -> _Group:
        group = _Group()
        for rid in [prepared.rid] + [child.rid for child in prepared.children]:
            if rid in self._states or rid in self._children_of:
                raise ValueError(f"rid {rid!r} is already in use by a running request.")
        for index, child in enumerate(prepared.children):
            state = _ReqState(
                rid=child.rid,
                index=index,
                group=group,
                stream=child.stream,
                return_logprob=child.return_logprob,
                want_top=child.top_logprobs_num > 0,
                want_token_ids=child.token_ids_logprob is not None,
                text_in_logprobs=prepared.return_text_in_logprobs,
                sampling_seed=child.sampling_params.get("sampling_seed"),
            )
            group.children.append(state)
            self._states[state.rid] = state
        self._children_of[prepared.rid] = [s.rid for s in group.children]
        return group

    def _abort_child(self, state: _ReqState, notify: bool, reason: dict[str, Any] = ABORTED_BY_CLIENT) -> None:
        self._send_sock.send(encode(AbortReq(rid=state.rid)))
        self._states.pop(state.rid, None)
        state.finished_reason = dict(reason)
        self._record_finish(state)
        state.dirty = notify
        if notify:
            state.group.event.set()

    @staticmethod
    def _take_dirty(group: _Group) -> list[_ReqState]:
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
            self._on_load_reply(batch.load)
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
        state.text = out.text if out.text is not None else state.text + out.new_text
        state.output_ids.extend(token.new_output_ids)
        if token.new_output_ids:
            self._record_tokens(state, len(token.new_output_ids))
        state.prompt_tokens = token.prompt_tokens
        state.completion_tokens = token.completion_tokens
        state.cached_tokens = token.cached_tokens
        if state.return_logprob:
            self._append_logprobs(state, out)
        if token.finished_reason is not None:
            state.finished_reason = token.finished_reason
            del self._states[token.rid]
            self._record_finish(state)
            if token.finished_reason.get("err_type") == DETOKENIZATION_ERROR:
                self._send_sock.send(encode(AbortReq(rid=token.rid)))  # the scheduler still runs it
        state.dirty = True
        state.group.event.set()

    def _record_tokens(self, state: _ReqState, count: int) -> None:
        now = time.perf_counter()
        if self.metrics is not None:
            if state.last_token_at is None:
                self.metrics.first_token(now - state.created_at)
            else:
                self.metrics.later_tokens(now - state.last_token_at, count)
        state.last_token_at = now

    def _record_finish(self, state: _ReqState) -> None:
        if self.metrics is not None:
            elapsed = time.perf_counter() - state.created_at
            self.metrics.finished(state.prompt_tokens, state.completion_tokens, elapsed, state.finished_reason)

    def _append_logprobs(self, state: _ReqState, out: StrOut) -> None:
        token, text = out.token, state.text_in_logprobs
        lists = {
            "input_token_logprobs": (token.input_token_logprobs, True, self._pair_rows),
            "output_token_logprobs": (token.output_token_logprobs, True, self._pair_rows),
            "input_top_logprobs": (token.input_top_logprobs, state.want_top, self._nested_rows),
            "output_top_logprobs": (token.output_top_logprobs, state.want_top, self._nested_rows),
            "input_token_ids_logprobs": (token.input_token_ids_logprobs, state.want_token_ids, self._nested_rows),
            "output_token_ids_logprobs": (token.output_token_ids_logprobs, state.want_token_ids, self._nested_rows),
        }
        for key, (rows, wanted, convert) in lists.items():
            if wanted:
                state.logprobs.setdefault(key, []).extend(convert(rows or [], text))

    def _pair_rows(self, pairs: list[list[Any]], with_text: bool) -> list[list[Any]]:
        """[logprob, token_id] pairs -> [logprob, token_id, text_or_null] triples."""
        return [[lp, tid, self._token_text(tid) if with_text else None] for lp, tid in pairs]

    def _nested_rows(self, rows: list[Optional[list[list[Any]]]], with_text: bool) -> list[Any]:
        return [None if row is None else self._pair_rows(row, with_text) for row in rows]

    def _token_text(self, token_id: int) -> Optional[str]:
        # --skip-tokenizer-init: no text, as SGLang (return_text_in_logprobs gives null texts).
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else None

    def _logged_request(self, prepared: PreparedRequest) -> Optional[GenerateReqInput]:
        """--log-requests: log the request's arrival; returns what its finish line shows (None: not logged)."""
        if prepared.obj is None or not self.request_logger.wants(prepared.rid):
            return None
        obj = dataclasses.replace(prepared.obj, rid=prepared.rid)
        self.request_logger.received(obj)
        return obj

    def _snapshot(self, state: _ReqState, indexed: bool) -> dict[str, Any]:
        # Copies, because the state keeps growing after the dict is handed out.
        meta: dict[str, Any] = {
            "id": state.rid,
            "finish_reason": state.finished_reason,
            "prompt_tokens": state.prompt_tokens,
            "completion_tokens": state.completion_tokens,
            "cached_tokens": state.cached_tokens,
        }
        meta.update({key: list(rows) for key, rows in state.logprobs.items()})
        if state.sampling_seed is not None:
            meta["sampling_seed"] = state.sampling_seed
        out: dict[str, Any] = {}
        if not self.server_args.skip_tokenizer_init:  # SGLang's token-only responses have no "text"
            out["text"] = state.text
        if self.server_args.stream_output and state.stream:
            # SGLang's --stream-output: a streamed chunk carries only the ids new since the last one.
            out["output_ids"] = state.output_ids[state.streamed_ids :]
            state.streamed_ids = len(state.output_ids)
        else:
            out["output_ids"] = list(state.output_ids)
        out["meta_info"] = meta
        if indexed:
            out["index"] = state.index
        return out


def _results_decoder(detokenizer_process: bool, tokenizer: Any) -> Callable[[bytes], BatchStrOut]:
    """A results message -> BatchStrOut: the detokenizer process's as they are, the scheduler's
    BatchTokenOut (--detokenizer-mode inline) through a DetokenizerManager of this process."""
    if detokenizer_process:
        return decoder(BatchStrOut).decode
    detokenizer = DetokenizerManager(tokenizer)
    token_decoder = decoder(BatchTokenOut)
    return lambda data: detokenizer.handle(token_decoder.decode(data))


def _raise_if_refused(state: _ReqState) -> None:
    reason = state.finished_reason
    if reason is not None and reason.get("err_type") == QUEUE_FULL:
        raise ServiceUnavailableError(reason["message"])


def child_rids(rid: str, n: int) -> list[str]:
    """The rids of a request's n children: the request's own for n = 1, else `{rid}_{i}`."""
    return [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]


def child_sampling_params(params: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The sampling params of a request's n children: n = 1 each and, when seeded, distinct
    derived seeds (child i gets derive_child_seed(seed, i)); n = 1 keeps the request's own."""
    if n == 1:
        return [params]
    seed = params.get("sampling_seed")
    children = []
    for i in range(n):
        child = {**params, "n": 1}
        if seed is not None:
            child["sampling_seed"] = derive_child_seed(seed, i)
        children.append(child)
    return children


def _fan_out(base: TokenizedGenerateReqInput, n: int) -> list[TokenizedGenerateReqInput]:
    if n == 1:
        return [base]
    return [
        msgspec.structs.replace(base, rid=rid, sampling_params=params)
        for rid, params in zip(child_rids(base.rid, n), child_sampling_params(base.sampling_params, n))
    ]


async def merge_indexed(
    streams: Sequence[AsyncIterator[dict[str, Any]]], sizes: Sequence[int]
) -> AsyncIterator[dict[str, Any]]:
    """Several requests' result streams as one, in arrival order; every dict gets "index" = its
    child's position among all children (stream k has sizes[k] children, in order).

    The first exception of any stream is raised here; leaving early (error, client gone) closes
    the streams still running, which aborts their requests.
    """
    offsets = list(itertools.accumulate(sizes, initial=0))
    if len(streams) == 1:
        # The common case: read it here, without a pump task and a queue between it and the caller.
        async with contextlib.aclosing(streams[0]) as results:
            async for out in results:
                out["index"] = out.get("index", 0)
                yield out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, stream: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async with contextlib.aclosing(stream) as results:
                async for out in results:
                    out["index"] = offsets[k] + out.get("index", 0)
                    queue.put_nowait(out)
        except Exception as err:  # handed to the consumer, which raises it
            queue.put_nowait(err)
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(k, stream)) for k, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:  # cancelling a pump aborts its unfinished requests
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
