"""JSON and server-sent-event bodies of the native routes."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response


def json_response(content: Any, status_code: int = 200) -> Response:
    """orjson writes NaN and +-inf as null, which keeps every response valid JSON."""
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def error_response(message: str, status_code: int = 400) -> Response:
    return json_response({"error": {"message": message}}, status_code)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_error(message: str, code: int = 400) -> bytes:
    kind = "invalid_request_error" if code == 400 else "service_unavailable"
    error = {"message": message, "type": kind, "code": code, "retryable": code == 503}
    return sse({"error": error})
