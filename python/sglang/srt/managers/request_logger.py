"""--log-requests: a log line when a request arrives and one when it finishes (SGLang's format).

    Receive: obj=GenerateReqInput(text='Hello', input_ids=None, sampling_params={...}, rid='abc', ...)
    Finish: obj=GenerateReqInput(...), out={'text': ' world', 'output_ids': [...], 'meta_info': {...}}

--log-requests-level picks what the lines show, as in SGLang:
  0: metadata only: the request without text, input_ids and sampling_params; the output
     without text and output_ids (meta_info: rid, finish reason, token counts, ...);
  1: level 0 plus the sampling params;
  2: everything, each string cut to 2048 characters and each list to 2048 items (head ... tail);
  3: everything, uncut.
The lines go to this module's logger at INFO. Health checks (/health) are not logged.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any, Optional

from sglang.srt.sampling.watermarking.config import redact as redact_watermark

logger = logging.getLogger(__name__)

HEALTH_CHECK_PREFIX = "HEALTH_CHECK_"
LEVEL_2_MAX_LENGTH = 2048
_INPUT_DATA = frozenset({"text", "input_ids"})
_OUTPUT_DATA = frozenset({"text", "output_ids"})


class RequestLogger:
    def __init__(self, enabled: bool, level: int = 2) -> None:
        if level not in (0, 1, 2, 3):
            raise ValueError(f"--log-requests-level must be one of 0, 1, 2, 3, got {level!r}.")
        self.enabled = enabled
        self.level = level
        self.max_length: Optional[int] = LEVEL_2_MAX_LENGTH if level == 2 else None
        self.skip_in: frozenset[str] = frozenset()
        self.skip_out: frozenset[str] = frozenset()
        if level <= 1:
            self.skip_in = _INPUT_DATA | ({"sampling_params"} if level == 0 else set())
            self.skip_out = _OUTPUT_DATA

    def wants(self, rid: str) -> bool:
        return self.enabled and not rid.startswith(HEALTH_CHECK_PREFIX)

    def received(self, obj: Any) -> None:
        logger.info("Receive: obj=%s", self.format_input(obj))

    def finished(self, obj: Any, out: dict[str, Any]) -> None:
        logger.info("Finish: obj=%s, out=%s", self.format_input(obj), self.format_output(out))

    def format_input(self, obj: Any) -> str:
        return truncated_repr(without_watermark_keys(obj), self.max_length, self.skip_in)

    def format_output(self, out: dict[str, Any]) -> str:
        return truncated_repr(out, self.max_length, self.skip_out)


def without_watermark_keys(obj: Any) -> Any:
    """A copy of a request whose watermark objects (top level or in sampling_params) show no key."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        return redact_watermark(obj)
    copied = copy.copy(obj)
    for name in ("watermark", "sampling_params"):
        if hasattr(obj, name):
            object.__setattr__(copied, name, redact_watermark({name: getattr(obj, name)})[name])
    return copied


def truncated_repr(value: Any, max_length: Optional[int], skip: frozenset[str] = frozenset()) -> str:
    """repr-like text of a dataclass, dict, list or scalar; `skip` drops top-level fields or keys;
    a string longer than max_length shows its head and tail, and so does a longer list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = (f.name for f in dataclasses.fields(value) if f.name not in skip)
        inner = ", ".join(f"{name}={truncated_repr(getattr(value, name), max_length)}" for name in fields)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, dict):
        items = (f"{k!r}: {truncated_repr(v, max_length)}" for k, v in value.items() if k not in skip)
        return "{" + ", ".join(items) + "}"
    if isinstance(value, str):
        if max_length is not None and len(value) > max_length:
            half = max_length // 2
            return f"{value[:half]!r} ... {value[-half:]!r}"
        return repr(value)
    if isinstance(value, (list, tuple)):
        if max_length is not None and len(value) > max_length:
            half = max_length // 2
            head = ", ".join(truncated_repr(v, max_length) for v in value[:half])
            tail = ", ".join(truncated_repr(v, max_length) for v in value[-half:])
            return f"[{head}, ... {tail}]"
        return "[" + ", ".join(truncated_repr(v, max_length) for v in value) + "]"
    return repr(value)
