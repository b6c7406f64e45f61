"""The HTTP app: middlewares, the native routes and the OpenAI routes (mounted).

create_app builds it around a TokenizerManager; entrypoints.serve runs it with uvicorn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import importlib
import importlib.metadata
import importlib.util
import logging
from collections.abc import Callable
from typing import Any, Optional

import msgspec
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from sglang.srt.entrypoints.generate_route import handle_generate
from sglang.srt.entrypoints.http_responses import error_response, json_response
from sglang.srt.entrypoints.openapi_bodies import document_request_bodies
from sglang.srt.entrypoints.tokenization import detokenize, tokenize
from sglang.srt.entrypoints.watermark_detect import detect_watermark
from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReady
from sglang.srt.managers.replica_load import ReplicaLoadTable
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.sampling.watermarking.config import redact as redact_watermark
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import hf_tokenizer_folder

logger = logging.getLogger(__name__)

LOAD_TIMEOUT_MESSAGE = "The scheduler did not report its load in time (it reads requests between steps); retry."


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
        tm.abort_all(server_wide=True)
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
        render_chat = getattr(app.state, "render_chat", None)
        return await _json_call(request, lambda body: tokenize(body, tm.tokenizer, ready.context_len, render_chat))

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize_route(request: Request) -> Response:
        return await _json_call(request, lambda body: detokenize(body, tm.tokenizer, ready.vocab_size))

    @app.post("/watermark/detect")
    async def watermark_detect_route(request: Request) -> Response:
        return await _json_call(request, lambda body: detect_watermark(body, tm.tokenizer))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await tm.flush_cache_server_wide():
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
        info = redact_watermark(info)
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
