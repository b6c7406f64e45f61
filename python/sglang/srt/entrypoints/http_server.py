"""HTTP server: the FastAPI app (native routes, OpenAI routes mounted) and the process launcher.

launch_server starts one scheduler process per TP rank and, unless --detokenizer-mode inline,
the detokenizer (multiprocessing, spawn), waits for scheduler rank 0 to report SchedulerReady,
then serves HTTP in this process with the TokenizerManager. A watchdog thread stops the server
when a child dies; shutdown (SIGINT/SIGTERM, errors) sends the children SIGTERM, then SIGKILL
after a grace period, and Linux children also die with this process (PR_SET_PDEATHSIG) if it
is killed outright.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import hmac
import importlib
import importlib.metadata
import importlib.util
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Optional

import msgspec
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from sglang.srt.entrypoints.openapi_bodies import document_request_bodies
from sglang.srt.entrypoints.tokenization import detokenize, tokenize
from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReady, decoder
from sglang.srt.managers.tokenizer_manager import (
    ABORTED_BY_SHUTDOWN,
    PreparedRequest,
    ServiceUnavailableError,
    TokenizerManager,
)
from sglang.srt.distributed.placement import node_tp_ranks, replica_dist_init_method, scheduler_name
from sglang.srt.managers.data_parallel_controller import replica_port_args
from sglang.srt.managers.replica_load import ReplicaLoadTable
from sglang.srt.server_args import PortArgs, ServerArgs, _free_local_port
from sglang.srt.utils.hf_transformers_utils import get_tokenizer, hf_tokenizer_folder, load_chat_template

logger = logging.getLogger(__name__)

# Tests point this at a fake scheduler ("module:function", same signature as the real one).
SCHEDULER_ENTRY_ENV = "SGLANG_TEST_SCHEDULER_ENTRY"
DEFAULT_SCHEDULER_ENTRY = "sglang.srt.managers.scheduler:run_scheduler_process"
DETOKENIZER_ENTRY = "sglang.srt.managers.detokenizer_manager:run_detokenizer_process"
DP_CONTROLLER_ENTRY = "sglang.srt.managers.data_parallel_controller:run_data_parallel_controller_process"
READY_TIMEOUT_ENV = "SGLANG_SCHEDULER_READY_TIMEOUT"
DEFAULT_READY_TIMEOUT_S = 900.0
SHUTDOWN_GRACE_S = 5.0
DISCONNECT_POLL_S = 1.0
DRAIN_POLL_S = 0.05
LOAD_TIMEOUT_MESSAGE = "The scheduler did not report its load in time (it reads requests between steps); retry."
_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """The server could not start, or a child process died; the message says which and why."""


# ---------------------------------------------------------------------------------- JSON


def json_response(content: Any, status_code: int = 200) -> Response:
    """orjson writes NaN and +-inf as null, which keeps every response valid JSON."""
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def error_response(message: str, status_code: int = 400) -> Response:
    return json_response({"error": {"message": message}}, status_code)


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_SSE_DONE = b"data: [DONE]\n\n"


def _sse_error(message: str, code: int = 400) -> bytes:
    kind = "invalid_request_error" if code == 400 else "service_unavailable"
    error = {"message": message, "type": kind, "code": code, "retryable": code == 503}
    return _sse({"error": error})


# ---------------------------------------------------------------------------------- auth


class ApiKeyMiddleware:
    """Every HTTP route, /health included, needs `Authorization: Bearer <key>`.

    Plain ASGI (not BaseHTTPMiddleware) so streaming responses and disconnects pass untouched.
    """

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            message = "Unauthorized: send the server's API key as 'Authorization: Bearer <key>'."
            await error_response(message, 401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: dict) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        return hmac.compare_digest(given, self._expected)


class BodySizeLimitMiddleware:
    """--max-request-body-bytes: a larger body is refused with 413, by its Content-Length before
    anything is read, else as soon as the bytes received pass the limit."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:  # chunked bodies carry no Content-Length; nothing was sent yet
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: dict, receive: Callable, send: Callable) -> None:
        message = f"The request body is larger than the server's limit of {self.max_bytes} bytes (--max-request-body-bytes)."
        await error_response(message, 413)(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class ShutdownGateMiddleware:
    """During a graceful shutdown new work is refused with 503; aborts still go through."""

    def __init__(self, app: Any, tm: TokenizerManager) -> None:
        self.app = app
        self.tm = tm

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and not self.tm.accepting and scope.get("path") != "/abort_request" and scope.get("method") == "POST":
            await error_response("The server is shutting down and accepts no new requests.", 503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class TokenizerRequiredMiddleware:
    """--skip-tokenizer-init: the routes that cannot work without a tokenizer answer a 400 naming
    the flag (/generate with text says so itself; with input_ids it works)."""

    PATHS = frozenset({
        "/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize",
        "/v1/completions", "/v1/chat/completions", "/v1/responses",
    })

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope.get("path") in self.PATHS:
            message = (
                f"{scope['path']} needs a tokenizer, and this server runs with --skip-tokenizer-init; "
                "use /generate with input_ids."
            )
            await error_response(message, 400)(scope, receive, send)
            return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------------------- /generate

# Per-input fields of a /generate body (a value, or a list with one per input in a batch).
_ITEM_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(GenerateReqInput) if f.name not in ("text", "input_ids", "stream")
}
_ITEM_DEFAULTS["sampling_params"] = None  # -> {} in the tokenizer manager
_GENERATE_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerateReqInput))
# SGLang's other /generate fields that sglang-router writes into every request it forwards, each
# at a value that asks for nothing beyond what this server does; any other value is a 400.
ROUTER_FIELD_DEFAULTS = {
    "log_metrics": True, "no_logs": False, "background": False,
    "return_hidden_states": False, "return_bytes": False, "return_entropy": False,
}


def split_generate_body(body: Any) -> tuple[list[GenerateReqInput], bool]:
    """A /generate JSON body -> (one GenerateReqInput per input, whether it was a batch)."""
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    body = _without_router_defaults(body)
    # A field we do not know would be silently dropped; null is the same as absent.
    unknown = sorted(k for k, v in body.items() if k not in _GENERATE_FIELDS and v is not None)
    if unknown:
        raise ValueError(
            f"Unknown or unsupported field(s) {', '.join(unknown)} in /generate; supported: {', '.join(sorted(_GENERATE_FIELDS))}."
        )
    inputs, key, batch = _generate_inputs(body)
    size = len(inputs)
    stream = body.get("stream", False)
    fields = {name: _per_item(body, name, size, batch) for name in _ITEM_DEFAULTS}
    items = []
    for i, value in enumerate(inputs):
        item = {name: values[i] for name, values in fields.items()}
        items.append(GenerateReqInput(**{key: value}, stream=stream, **item))
    return items, batch


def _without_router_defaults(body: dict) -> dict:
    for name, default in ROUTER_FIELD_DEFAULTS.items():
        if name in body and body[name] != default:
            raise ValueError(f"{name}={body[name]!r} is not supported by this server (only {default!r}).")
    return {k: v for k, v in body.items() if k not in ROUTER_FIELD_DEFAULTS}


def _generate_inputs(body: dict) -> tuple[list[Any], str, bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise ValueError("Exactly one of text or input_ids must be given.")
    if text is not None:
        return _as_batch(text, "text", isinstance(text, list))
    is_batch = isinstance(input_ids, list) and bool(input_ids) and all(isinstance(x, list) for x in input_ids)
    return _as_batch(input_ids, "input_ids", is_batch)


def _as_batch(value: Any, key: str, is_batch: bool) -> tuple[list[Any], str, bool]:
    if not is_batch:
        return [value], key, False
    if not value:
        raise ValueError(f"{key} must not be an empty list.")
    return list(value), key, True


def _per_item(body: dict, name: str, size: int, batch: bool) -> list[Any]:
    value = body.get(name)
    if value is None:
        return [_ITEM_DEFAULTS[name]] * size
    if batch and _is_per_item_list(name, value):
        if len(value) != size:
            raise ValueError(f"{name} has {len(value)} entries but the batch has {size} inputs.")
        return list(value)
    if batch and name == "rid":
        return [f"{value}_{i}" for i in range(size)]
    return [value] * size


def _is_per_item_list(name: str, value: Any) -> bool:
    if not isinstance(value, list):
        return False
    if name == "token_ids_logprob":  # a flat list is shared by every input
        return bool(value) and all(v is None or isinstance(v, list) for v in value)
    return True


def _child_offsets(prepared: Sequence[PreparedRequest]) -> list[int]:
    offsets, total = [], 0
    for p in prepared:
        offsets.append(total)
        total += len(p.children)
    return offsets


async def _merged(tm: TokenizerManager, prepared: Sequence[PreparedRequest]) -> AsyncIterator[dict[str, Any]]:
    """All requests' results as they come, each with "index" = its position among all children."""
    queue: asyncio.Queue = asyncio.Queue()
    offsets = _child_offsets(prepared)

    async def pump(i: int, request: PreparedRequest) -> None:
        try:
            async for out in tm.run_prepared(request):
                out["index"] = offsets[i] + out.get("index", 0)
                queue.put_nowait(out)
        except Exception as err:  # handed to the consumer, which raises it
            queue.put_nowait(err)
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prepared)]
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


async def _collect(tm: TokenizerManager, prepared: Sequence[PreparedRequest]) -> list[dict[str, Any]]:
    async with contextlib.aclosing(_merged(tm, prepared)) as results:
        outs = [out async for out in results]
    outs.sort(key=lambda out: out["index"])
    for out in outs:
        del out["index"]
    return outs


async def _stream(
    tm: TokenizerManager, prepared: Sequence[PreparedRequest], indexed: bool
) -> AsyncIterator[bytes]:
    try:
        async with contextlib.aclosing(_merged(tm, prepared)) as results:
            async for out in results:
                if not indexed:
                    del out["index"]
                yield _sse(out)
    except ValueError as err:
        yield _sse_error(str(err))
    except ServiceUnavailableError as err:  # the 200 status line has gone out already
        yield _sse_error(str(err), 503)
    yield _SSE_DONE


async def _error_stream(message: str) -> AsyncIterator[bytes]:
    yield _sse_error(message)
    yield _SSE_DONE


async def _until_disconnected(request: Request) -> None:
    # Starlette cancels streaming responses on disconnect; non-streaming ones must poll.
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def _collect_unless_disconnected(
    request: Request, tm: TokenizerManager, prepared: Sequence[PreparedRequest]
) -> Optional[list[dict[str, Any]]]:
    """The results, or None when the client went away first (its requests are aborted)."""
    work = asyncio.ensure_future(_collect(tm, prepared))
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    return work.result() if work in done else None


async def _read_json(request: Request) -> Any:
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError as err:
        raise ValueError(f"The request body is not valid JSON: {err}") from None


async def handle_generate(request: Request, tm: TokenizerManager) -> Response:
    try:
        body = await _read_json(request)
    except ValueError as err:
        return error_response(str(err))
    stream = isinstance(body, dict) and body.get("stream") is True
    try:
        items, batch = split_generate_body(body)
        prepared = [tm.prepare_request(item) for item in items]
    except ValueError as err:
        if stream:
            return StreamingResponse(_error_stream(str(err)), media_type="text/event-stream")
        return error_response(str(err))
    many = batch or sum(len(p.children) for p in prepared) > 1
    if stream:
        return StreamingResponse(_stream(tm, prepared, many), media_type="text/event-stream")
    try:
        outs = await _collect_unless_disconnected(request, tm, prepared)
    except ValueError as err:
        return error_response(str(err))
    except ServiceUnavailableError as err:
        return error_response(str(err), 503)
    if outs is None:
        return Response(status_code=499)
    return json_response(outs if many else outs[0])


# ---------------------------------------------------------------------------------- app


def _version() -> str:
    try:
        return importlib.metadata.version("sglang-sampling-engine")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


async def _json_call(request: Request, handle: Callable[[Any], dict]) -> Response:
    """Parse the JSON body, answer handle(body); a ValueError (a bad field) is a 400 naming it."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as err:
        return error_response(f"The request body is not valid JSON: {err}")
    try:
        return json_response(handle(body))
    except ValueError as err:
        return error_response(str(err))



ABORT_FIELDS = {"rid": str, "abort_all": bool}


def _abort(body: Any, tm: TokenizerManager) -> dict:
    """SGLang's /abort_request: {"rid": str} aborts that request (all its n children), {"abort_all":
    true} every request; an unknown rid is not an error (it may have just finished)."""
    if not isinstance(body, dict):
        raise ValueError("The body must be a JSON object with rid or abort_all.")
    for key, value in body.items():
        if key not in ABORT_FIELDS:
            raise ValueError(f"Unknown field {key!r} for /abort_request (allowed: rid, abort_all).")
        if not isinstance(value, ABORT_FIELDS[key]):
            raise ValueError(f"{key} must be a {ABORT_FIELDS[key].__name__}.")
    if body.get("abort_all"):
        tm.abort_all()
    elif body.get("rid"):
        tm.abort_request(body["rid"])
    else:
        raise ValueError("/abort_request needs rid or abort_all: true.")
    return {}


def create_app(
    tm: TokenizerManager, server_args: ServerArgs, ready: SchedulerReady, loads: Optional[ReplicaLoadTable] = None
) -> FastAPI:
    """The FastAPI app with the native routes and, when present, the OpenAI routes; `loads` (the
    replicas' load reports) feeds /get_load."""
    app = FastAPI(title="sglang", docs_url=None, redoc_url=None)
    # The last added runs first: the API key, then the body limit, before anything else.
    if server_args.skip_tokenizer_init:
        app.add_middleware(TokenizerRequiredMiddleware)
    app.add_middleware(ShutdownGateMiddleware, tm=tm)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=server_args.max_request_body_bytes)
    if server_args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=server_args.api_key)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        return await handle_generate(request, tm)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        return await _json_call(request, lambda body: _abort(body, tm))

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200 if tm.accepting and await tm.health() else 503)

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize_route(request: Request) -> Response:
        return await _json_call(request, lambda body: tokenize(body, tm.tokenizer, ready.context_len))

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize_route(request: Request) -> Response:
        return await _json_call(request, lambda body: detokenize(body, tm.tokenizer, ready.vocab_size))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if tm.flush_cache():
            return Response("Cache flushed.\n", media_type="text/plain")
        return Response(
            "Cache not flushed: requests are running or waiting (the operation is not performed while they are).\n",
            status_code=400, media_type="text/plain",
        )

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info() -> Response:
        return json_response(
            {
                "model_path": server_args.model_path,
                "tokenizer_path": hf_tokenizer_folder(server_args.tokenizer_path),
                "is_generation": True,
                "preferred_sampling_params": server_args.preferred_sampling_params,
            }
        )

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> Response:
        info = dataclasses.asdict(server_args)
        if info["api_key"]:
            info["api_key"] = "<hidden>"
        info["scheduler_info"] = msgspec.structs.asdict(ready)
        # Top-level fields that SGLang's clients and router read.
        info.update(version=_version(), max_total_num_tokens=ready.max_total_num_tokens,
                    max_running_requests=ready.max_running_requests)
        # The live gauges (SchedulerLoad's fields; /metrics exports the same).
        try:
            info["load"] = msgspec.structs.asdict(await tm.get_load())
        except asyncio.TimeoutError:
            return error_response(LOAD_TIMEOUT_MESSAGE, 503)
        if loads is not None:
            info["replica_loads"] = loads.snapshot()  # one entry per --dp-size replica
        return json_response(info)

    if loads is not None:

        @app.get("/get_load")
        async def get_load() -> Response:
            """SGLang's answer, read by sglang-router's power_of_two policy: one entry per replica."""
            return json_response(loads.snapshot())

    if server_args.enable_metrics:

        @app.get("/metrics")
        async def metrics() -> Response:
            from prometheus_client import CONTENT_TYPE_LATEST

            try:
                load = await tm.get_load()
            except asyncio.TimeoutError:
                return error_response(LOAD_TIMEOUT_MESSAGE, 503)
            return Response(tm.metrics.render(load), media_type=CONTENT_TYPE_LATEST)

    document_request_bodies(app, {"/generate": GenerateReqInput})
    _register_openai_routes(app, tm, server_args)
    return app


def _register_openai_routes(app: FastAPI, tm: TokenizerManager, server_args: ServerArgs) -> None:
    module = "sglang.srt.entrypoints.openai"
    if importlib.util.find_spec(module) is None:
        logger.warning("%s is not installed: the OpenAI routes (/v1/...) are not served.", module)
        return
    importlib.import_module(module).register_openai_routes(app, tm, server_args)


# ---------------------------------------------------------------------------------- processes


def _child_main(entry: str, args: tuple, parent_pid: int) -> None:
    """Spawned child: die with the launcher, then run `module:function`(*args)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the launcher died before prctl took effect
        os._exit(1)
    module, function = entry.split(":")
    getattr(importlib.import_module(module), function)(*args)


class ChildProcesses:
    """The scheduler ranks and the detokenizer process (if any), from start to SIGKILL."""

    def __init__(self, server_args: ServerArgs, port_args: PortArgs) -> None:
        self.server_args = server_args
        self.port_args = port_args
        self.failure: Optional[str] = None
        self._procs: list[tuple[str, multiprocessing.process.BaseProcess]] = []
        self._readers: dict[multiprocessing.connection.Connection, tuple[int, int]] = {}  # -> (dp rank, TP rank)
        self._pipes: dict[str, multiprocessing.connection.Connection] = {}  # child name -> its pipe
        self._stopping = threading.Event()

    def start(self) -> None:
        """This node's scheduler ranks of every replica; on node 0 also the detokenizer (unless
        --detokenizer-mode inline) and, with several replicas, the data-parallel controller."""
        ctx = multiprocessing.get_context("spawn")
        args = self.server_args
        if args.dp_size > 1 and args.node_rank == 0:
            self._spawn(ctx, "data-parallel controller", DP_CONTROLLER_ENTRY, (args, self.port_args))
        for dp_rank in range(args.dp_size):
            ports = replica_port_args(self.port_args, dp_rank, args.dp_size, self._dist_init_method(dp_rank))
            for rank in node_tp_ranks(args.tp_size, args.nnodes, args.node_rank):
                self._spawn_scheduler(ctx, ports, dp_rank, rank)
        if args.node_rank == 0 and args.detokenizer_process():
            self._spawn(ctx, "detokenizer", DETOKENIZER_ENTRY, (args, self.port_args))

    def _dist_init_method(self, dp_rank: int) -> str:
        """Where replica dp_rank's TP group meets: --dist-init-addr's port + dp_rank, else a free local port."""
        if self.server_args.dist_init_addr is not None:
            return replica_dist_init_method(self.server_args.dist_init_addr, dp_rank)
        return self.port_args.dist_init_method if dp_rank == 0 else f"tcp://127.0.0.1:{_free_local_port()}"

    def _spawn_scheduler(self, ctx: Any, ports: PortArgs, dp_rank: int, rank: int) -> None:
        name = scheduler_name(dp_rank, rank, self.server_args.dp_size)
        entry = os.environ.get(SCHEDULER_ENTRY_ENV, DEFAULT_SCHEDULER_ENTRY)
        reader, writer = ctx.Pipe(duplex=False)
        self._spawn(ctx, name, entry, (self.server_args, ports, rank, writer, dp_rank))
        writer.close()  # only the child's copy stays open, so its death reads as EOF
        self._readers[reader] = (dp_rank, rank)
        self._pipes[name] = reader

    def _spawn(self, ctx: Any, name: str, entry: str, args: tuple) -> None:
        proc = ctx.Process(target=_child_main, args=(entry, args, os.getpid()), name=name)
        proc.start()
        self._procs.append((name, proc))

    def wait_ready(self, timeout: float) -> SchedulerReady:
        """The SchedulerReady of replica 0's rank 0, once every replica's rank 0 sent its own;
        LaunchError on a start-up error, death or timeout."""
        deadline = time.monotonic() + timeout
        ready: dict[int, SchedulerReady] = {}
        while (remaining := deadline - time.monotonic()) > 0:
            sentinels = [proc.sentinel for _, proc in self._procs]
            signalled = multiprocessing.connection.wait([*self._readers, *sentinels], timeout=remaining)
            for conn in [c for c in signalled if c in self._readers]:
                dp_rank = self._readers[conn][0]
                message = self._read_ready(conn)
                if message is not None:
                    ready[dp_rank] = message
            if len(ready) == self.server_args.dp_size:
                return ready[0]
            if (dead := self._exited(signalled)) is not None:
                raise LaunchError(f"{dead} before the scheduler was ready")
        raise LaunchError(
            f"The scheduler was not ready after {timeout:.0f} s (set {READY_TIMEOUT_ENV} to wait longer)."
        )

    def _read_ready(self, conn: multiprocessing.connection.Connection) -> Optional[SchedulerReady]:
        _, rank = self._readers[conn]
        try:
            message = conn.recv()
        except EOFError:  # the child exited; its sentinel reports how
            del self._readers[conn]
            return None
        if isinstance(message, str):
            raise LaunchError(message)
        if rank != 0:
            raise LaunchError(f"scheduler rank {rank} sent an unexpected ready message.")
        try:
            return decoder(SchedulerReady).decode(message)
        except (msgspec.DecodeError, TypeError) as err:
            raise LaunchError(f"scheduler rank 0 sent an invalid ready message: {err}") from None

    def _exited(self, signalled: Sequence[Any]) -> Optional[str]:
        """Which child exited, given the objects multiprocessing.connection.wait returned."""
        for name, proc in self._procs:
            if proc.sentinel in signalled:
                # The sentinel fires when the child's fds close, a moment before it can be
                # reaped: join, so the exit code is there to report.
                proc.join()
                return f"{name} exited with code {proc.exitcode}{self._last_words(name)}"
        return None

    def _last_words(self, name: str) -> str:
        """': reason' when the child sent why it failed before exiting (scheduler ranks do)."""
        conn = self._pipes.get(name)
        if conn is None or not conn.poll():
            return ""
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return ""
        return f": {message}" if isinstance(message, str) else ""

    def watch(self, on_failure: Callable[[str], None]) -> None:
        """Call on_failure(reason) from a thread when a child dies before shutdown."""
        threading.Thread(target=self._watch, args=(on_failure,), name="child-watchdog", daemon=True).start()

    def _watch(self, on_failure: Callable[[str], None]) -> None:
        signalled = multiprocessing.connection.wait([proc.sentinel for _, proc in self._procs])
        if self._stopping.is_set():
            return
        self.failure = self._exited(signalled)
        logger.error("%s; shutting the server down.", self.failure)
        on_failure(self.failure)

    def wait_first_exit(self) -> None:
        """Block until a child exits (nodes other than 0); a non-zero exit is the failure."""
        signalled = multiprocessing.connection.wait([proc.sentinel for _, proc in self._procs])
        reason = self._exited(signalled)  # joins the first of them
        if next(proc for _, proc in self._procs if proc.sentinel in signalled).exitcode != 0:
            self.failure = reason
        logger.info("%s; stopping this node.", reason)

    def shutdown(self) -> None:
        self._stopping.set()
        for _, proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for _, proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for name, proc in self._procs:
            if proc.is_alive():
                logger.warning("%s did not exit on SIGTERM within %.0f s; killing it.", name, SHUTDOWN_GRACE_S)
                proc.kill()
                proc.join()
        # PortArgs.init_new puts every ipc endpoint in one fresh temporary folder.
        shutil.rmtree(os.path.dirname(self.port_args.scheduler_input_ipc.removeprefix("ipc://")), ignore_errors=True)


def _load_in_background(path: str, trust_remote_code: bool) -> concurrent.futures.Future:
    """Load the tokenizer while the scheduler loads the model (GGUF parsing takes seconds)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work() -> None:
        try:
            future.set_result(get_tokenizer(path, trust_remote_code))
        except BaseException as err:  # noqa: BLE001 - re-raised by future.result()
            future.set_exception(err)

    threading.Thread(target=work, name="tokenizer-load", daemon=True).start()
    return future


def _exit_on_signal(signum: int, frame: Any) -> None:
    # SystemExit unwinds through launch_server's finally, which stops the children.
    raise SystemExit(0)


def launch_server(server_args: ServerArgs) -> None:
    """Start the children, wait for the scheduler, serve HTTP until a signal or a child's death.

    Raises LaunchError when start-up fails or a child process dies.
    """
    logging.basicConfig(level=server_args.log_level.upper(), format="[server] %(asctime)s %(levelname)s %(message)s")
    if server_args.ignored_flags:
        logger.warning("These SGLang flags have no effect in this server and are ignored: %s", " ".join(server_args.ignored_flags))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_on_signal)
    port_args = PortArgs.init_new()
    children = ChildProcesses(server_args, port_args)
    if server_args.node_rank > 0:
        _run_scheduler_node(children)
        return
    loads = ReplicaLoadTable(port_args.load_ipc, server_args.dp_size)
    tm: Optional[TokenizerManager] = None
    try:
        children.start()
        tokenizer = None if server_args.skip_tokenizer_init else _load_in_background(server_args.tokenizer_path, server_args.trust_remote_code)
        ready = children.wait_ready(float(os.environ.get(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT_S)))
        logger.info("Scheduler ready: %s", ready)
        tokenizer = load_chat_template(tokenizer.result(), server_args.chat_template) if tokenizer is not None else None
        tm = TokenizerManager(server_args, port_args, ready, tokenizer)
        _serve(create_app(tm, server_args, ready, loads), tm, server_args, children)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        children.shutdown()
        loads.close()
        if tm is not None:
            tm.close()
    if children.failure is not None:
        raise LaunchError(children.failure)


def _run_scheduler_node(children: ChildProcesses) -> None:
    """--node-rank > 0: this node's scheduler ranks only, until one exits. They all do when node 0
    stops (their TP group closes under them, which they treat as a clean stop); raises LaunchError
    when a rank failed."""
    args = children.server_args
    try:
        children.start()
        logger.info("Node %d of %d: scheduler ranks %s of %d replica(s) started; node 0 at %s serves HTTP.",
                    args.node_rank, args.nnodes, list(node_tp_ranks(args.tp_size, args.nnodes, args.node_rank)),
                    args.dp_size, args.dist_init_addr)
        children.wait_first_exit()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        children.shutdown()
    if children.failure is not None:
        raise LaunchError(children.failure)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a graceful shutdown: the first SIGTERM/SIGINT stops admission (503),
    lets running requests finish for up to --graceful-shutdown-timeout seconds, aborts the rest
    (their clients get the abort), then stops serving; launch_server then exits 0. A second
    signal stops at once."""

    def __init__(self, config: uvicorn.Config, tm: TokenizerManager, timeout: float) -> None:
        super().__init__(config)
        self.tm = tm
        self.timeout = timeout
        self._drain: Optional[asyncio.Task] = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._drain is not None or not self.started:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # re-raised when serving ends: launch_server's exit
        self.tm.accepting = False
        logger.info("Signal %d: refusing new requests; %d running may finish within %.0f s.", sig, self.tm.num_requests(), self.timeout)
        self._drain = asyncio.get_event_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        deadline = time.monotonic() + self.timeout
        while self.tm.num_requests() and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if self.tm.num_requests():
            logger.warning("Aborting %d requests still running after %.0f s.", self.tm.num_requests(), self.timeout)
            self.tm.abort_all(ABORTED_BY_SHUTDOWN)
        self.should_exit = True


def _serve(app: FastAPI, tm: TokenizerManager, server_args: ServerArgs, children: ChildProcesses) -> None:
    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
    )
    server = DrainingServer(config, tm, server_args.graceful_shutdown_timeout)

    def stop(reason: str) -> None:
        tm.fail_all(reason)  # their results would never come
        server.should_exit = True

    children.watch(stop)
    logger.info("Serving on http://%s:%d", server_args.host, server_args.port)
    server.run()
