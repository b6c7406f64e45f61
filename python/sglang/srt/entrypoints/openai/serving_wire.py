"""The HTTP side of the OpenAI routes: JSON and SSE bodies, error bodies, pydantic errors as 400s."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Optional, Union

import orjson
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from sglang.srt.entrypoints.openai.protocol import ErrorResponse, RequestError
from sglang.srt.managers.tokenizer_manager import ServiceUnavailableError

logger = logging.getLogger(__name__)

def json_response(body: BaseModel, status_code: int = 200) -> Response:
    # orjson writes NaN and +-inf as null, which is what clients of a JSON API can parse.
    return Response(orjson.dumps(body.model_dump()), status_code=status_code, media_type="application/json")


def error_body(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: Optional[str] = None
) -> ErrorResponse:
    return ErrorResponse(message=message, type=err_type, param=param, code=code)


def error_response(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: Optional[str] = None
) -> Response:
    return json_response(error_body(message, err_type, code, param), status_code=code)


def sse_event(body: Union[BaseModel, dict[str, Any]]) -> bytes:
    data = body.model_dump() if isinstance(body, BaseModel) else body
    return b"data: " + orjson.dumps(data) + b"\n\n"


def describe_failure(exc: Exception) -> ErrorResponse:
    """400 for what the engine rejected as invalid input, 500 (logged) for anything else."""
    if isinstance(exc, ValueError):
        return error_body(str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, ServiceUnavailableError):
        return error_body(str(exc), "ServiceUnavailable", 503)
    logger.error("OpenAI request failed", exc_info=exc)
    return error_body("internal server error", "InternalServerError", 500)


def validation_error(exc: ValidationError) -> RequestError:
    """One readable message naming the field, from pydantic's list of errors."""
    errors = exc.errors()
    # Union members each report a failure; the deepest location is the most specific one.
    depth = max(len(_clean_loc(e["loc"])) for e in errors)
    chosen = [e for e in errors if len(_clean_loc(e["loc"])) == depth]
    loc = _clean_loc(chosen[0]["loc"])
    messages = dict.fromkeys(_error_message(e) for e in chosen)
    path = _format_loc(loc)
    text = "; ".join(messages)
    param = str(loc[0]) if loc else getattr(chosen[0].get("ctx", {}).get("error"), "param", None)
    return RequestError(f"{path}: {text}" if path else text, param=param)


def _clean_loc(loc: tuple[Union[int, str], ...]) -> tuple[Union[int, str], ...]:
    # pydantic inserts union-member tags ("str", "list[int]", ...) into error locations.
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and p not in _TYPE_TAGS))


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _format_loc(loc: tuple[Union[int, str], ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_message(error: Mapping[str, Any]) -> str:
    if error["type"] == "value_error":  # our own validators: their text, without pydantic's prefix
        return str(error["ctx"]["error"])
    return error["msg"]


def client_closed_response() -> Response:
    return error_response("the client closed the request", "ClientClosedRequest", 499)
