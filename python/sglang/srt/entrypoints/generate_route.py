"""SGLang's native /generate route: a body of one or several inputs, answered in full (JSON) or
streamed (server-sent events, one cumulative result dict per event).

A request that fails validation gets a plain error status (400, or 503 when refused for load)
before any stream starts: the first result is awaited before the 200 status line goes out.
Every error body and error event carries a meta_info (id, finish_reason of type abort with the
message, zero token counts), since SGLang's clients read meta_info from every response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Optional

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from sglang.srt.entrypoints.generate_body import split_generate_body
from sglang.srt.entrypoints.http_responses import SSE_DONE, json_response, sse, sse_error
from sglang.srt.managers.tokenizer_manager import PreparedRequest, ServiceUnavailableError, TokenizerManager

DISCONNECT_POLL_S = 1.0


def failed_meta_info(message: str, status_code: int, rid: Any = None) -> dict[str, Any]:
    """The meta_info of a request that failed before it produced anything."""
    err_type = "BadRequestError" if status_code == 400 else "ServiceUnavailable"
    return {
        "id": rid if isinstance(rid, str) else None,
        "finish_reason": {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type},
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
    }


def _failure(message: str, status_code: int, rid: Any) -> Response:
    body = {"error": {"message": message}, "meta_info": failed_meta_info(message, status_code, rid)}
    return json_response(body, status_code)


def _failure_event(message: str, status_code: int, rid: Any) -> bytes:
    event = orjson.loads(sse_error(message, status_code)[len(b"data: "):])
    return sse({**event, "meta_info": failed_meta_info(message, status_code, rid)})


async def _stream(
    first: dict[str, Any], results: AsyncIterator[dict[str, Any]], indexed: bool, rid: Any
) -> AsyncIterator[bytes]:
    try:
        async with contextlib.aclosing(results):
            out: Optional[dict[str, Any]] = first
            while out is not None:
                if not indexed:
                    del out["index"]
                yield sse(out)
                out = await anext(results, None)
    except ValueError as err:
        yield _failure_event(str(err), 400, rid)
    except ServiceUnavailableError as err:  # the 200 status line has gone out already
        yield _failure_event(str(err), 503, rid)
    yield SSE_DONE


async def _start_stream(
    tm: TokenizerManager, prepared: Sequence[PreparedRequest], indexed: bool, rid: Any
) -> Response:
    """The stream once its first result is in; a refusal before it is a plain error response."""
    results = tm.run_many(prepared)
    try:
        first = await anext(results)
    except ValueError as err:
        await results.aclose()
        return _failure(str(err), 400, rid)
    except ServiceUnavailableError as err:
        await results.aclose()
        return _failure(str(err), 503, rid)
    return StreamingResponse(_stream(first, results, indexed, rid), media_type="text/event-stream")


async def _until_disconnected(request: Request) -> None:
    # Starlette cancels streaming responses on disconnect; non-streaming ones must poll.
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def _collect_unless_disconnected(
    request: Request, tm: TokenizerManager, prepared: Sequence[PreparedRequest]
) -> Optional[list[dict[str, Any]]]:
    """The results, or None when the client went away first (its requests are aborted)."""
    work = asyncio.ensure_future(tm.collect(prepared))
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
        return _failure(str(err), 400, None)
    rid = body.get("rid") if isinstance(body, dict) else None
    try:
        items, batch = split_generate_body(body)
        prepared = [tm.prepare_request(item) for item in items]
    except ValueError as err:
        return _failure(str(err), 400, rid)
    many = batch or sum(len(p.children) for p in prepared) > 1
    if isinstance(body, dict) and body.get("stream") is True:
        return await _start_stream(tm, prepared, many, rid)
    try:
        outs = await _collect_unless_disconnected(request, tm, prepared)
    except ValueError as err:
        return _failure(str(err), 400, rid)
    except ServiceUnavailableError as err:
        return _failure(str(err), 503, rid)
    if outs is None:
        return Response(status_code=499)
    return json_response(outs if many else outs[0])
