"""Watermark keys, the server's watermark settings (--enable-watermark, --watermark-config) and the
resolution of a request's `watermark` object against them. Standard library only.

A key is 1 to 16 hex digits (optional 0x prefix), read as an unsigned 64-bit integer and held as
its signed two's-complement value (the int64 the device tensors store). A resolved request
watermark is the dict {"key": HEX, "context_window": h}: what the scheduler builds its rows from.
No message here ever contains a key.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any, Optional

MAX_CONTEXT_WINDOW = 64
MAX_CONTEXTS_PER_REQUEST = 4096
MAX_CONFIG_BYTES = 4096
REDACTED = "<redacted>"
_HEX = frozenset("0123456789abcdefABCDEF")
_SERVER_FIELDS = (
    "key", "key_b", "context_window", "mixing_probability", "max_probability", "default_enabled", "enforce_all",
)
_REQUEST_FIELDS = ("enabled", "key", "context_window")


def parse_key(value: Any, name: str = "watermark.key") -> int:
    """The signed int64 of a hex key; ValueError naming `name` (never echoing the value)."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a hex string.")
    digits = value[2:] if value[:2].lower() == "0x" else value
    if not 1 <= len(digits) <= 16 or not _HEX.issuperset(digits):
        raise ValueError(f"{name} must be 1 to 16 hex digits, with an optional 0x prefix.")
    key = int(digits, 16)
    return key - (1 << 64) if key >= (1 << 63) else key


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class WatermarkSettings:
    """The server's watermark policy (--watermark-config's fields, defaults filled)."""

    key: Optional[str] = None
    key_b: Optional[str] = None
    context_window: int = 4
    mixing_probability: float = 0.5
    max_probability: float = 1.0
    default_enabled: bool = False
    enforce_all: bool = False

    def __repr__(self) -> str:
        shown = {name: getattr(self, name) for name in _SERVER_FIELDS}
        for name in ("key", "key_b"):
            shown[name] = None if shown[name] is None else REDACTED
        return "WatermarkSettings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def mixing_threshold(self) -> int:
        """Key A is used where the context's coin is below this (floor(P * 2**32))."""
        return int(self.mixing_probability * (1 << 32))

    @classmethod
    def from_json(cls, source: str) -> "WatermarkSettings":
        """--watermark-config: inline JSON (starting with '{') or a file path."""
        payload = source if source.lstrip().startswith("{") else _read_config_file(source)
        if len(payload.encode("utf-8")) > MAX_CONFIG_BYTES:
            raise ValueError(f"--watermark-config exceeds {MAX_CONFIG_BYTES} bytes.")
        try:
            raw = json.loads(payload)
        except json.JSONDecodeError:
            raise ValueError("--watermark-config is not valid JSON.") from None
        if not isinstance(raw, dict):
            raise ValueError("--watermark-config must be a JSON object.")
        unknown = sorted(set(raw) - set(_SERVER_FIELDS))
        if unknown:
            raise ValueError(f"--watermark-config has unknown field(s) {', '.join(unknown)}; known: {', '.join(_SERVER_FIELDS)}.")
        settings = cls(**{k: v for k, v in raw.items() if v is not None})
        settings.check()
        return settings

    def check(self) -> None:
        """ValueError naming the first invalid field."""
        for name in ("key", "key_b"):
            if getattr(self, name) is not None:
                parse_key(getattr(self, name), f"--watermark-config {name}")
        if self.key_b is not None and self.key is None:
            raise ValueError("--watermark-config key_b requires key.")
        window = self.context_window
        if not (_is_int(window) and 1 <= window <= MAX_CONTEXT_WINDOW):
            raise ValueError(f"--watermark-config context_window must be an integer from 1 to {MAX_CONTEXT_WINDOW}.")
        p = self.mixing_probability
        if not (_is_number(p) and 0 < p < 1):
            raise ValueError("--watermark-config mixing_probability must be strictly between 0 and 1.")
        if p != 0.5 and self.key_b is None:
            raise ValueError("--watermark-config mixing_probability needs key_b.")
        if not (_is_number(self.max_probability) and 0 < self.max_probability <= 1):
            raise ValueError("--watermark-config max_probability must be greater than 0 and at most 1.")
        for name in ("default_enabled", "enforce_all"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"--watermark-config {name} must be a boolean.")
            if getattr(self, name) and self.key is None:
                raise ValueError(f"--watermark-config {name} requires key.")


def _read_config_file(path: str) -> str:
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ValueError("--watermark-config must name a regular file.")
            return handle.read(MAX_CONFIG_BYTES + 1)
    except (OSError, UnicodeError):
        raise ValueError("--watermark-config: cannot read the file.") from None


def check_request(value: Any) -> None:
    """The shape of a request's `watermark` object (ValueError naming watermark and the sub-field)."""
    if not isinstance(value, dict):
        raise ValueError("watermark must be an object with fields enabled, key, context_window.")
    unknown = sorted(set(value) - set(_REQUEST_FIELDS))
    if unknown:
        raise ValueError(f"watermark has unknown field(s) {', '.join(unknown)}; known: {', '.join(_REQUEST_FIELDS)}.")
    enabled, key, window = (value.get(name) for name in _REQUEST_FIELDS)
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError("watermark.enabled must be a boolean.")
    if key is not None:
        parse_key(key)
    if window is not None and not (_is_int(window) and window >= 1):
        raise ValueError("watermark.context_window must be a positive integer.")


def resolve_request(value: Optional[dict], settings: Optional[WatermarkSettings]) -> Optional[dict]:
    """A request's (checked) `watermark` object under the server policy (None: --enable-watermark
    off): {"key": HEX, "context_window": h}, or None when the request is not watermarked."""
    if value is None:
        if settings is None or not (settings.default_enabled or settings.enforce_all):
            return None
        return {"key": settings.key, "context_window": settings.context_window}
    enabled, key, window = (value.get(name) for name in _REQUEST_FIELDS)
    if enabled is False:
        if key is not None:
            raise ValueError("watermark.key cannot be combined with watermark.enabled=false.")
        if settings is not None and settings.enforce_all:
            raise ValueError("watermark.enabled=false is not allowed: the server watermarks every request (enforce_all).")
        return None
    if enabled is None and key is None:
        raise ValueError("watermark must set watermark.enabled or watermark.key.")
    if settings is None:
        raise ValueError("watermark needs a server started with --enable-watermark.")
    if window is not None and window > settings.context_window:
        raise ValueError(f"watermark.context_window cannot exceed the server's context_window ({settings.context_window}).")
    key = key if key is not None else settings.key
    if key is None:
        raise ValueError("watermark.enabled=true needs a server key (--watermark-config key) or watermark.key.")
    return {"key": key, "context_window": window or settings.context_window}


def redact(value: Any, in_watermark: bool = False) -> Any:
    """A copy of a JSON-like value with every watermark key replaced by <redacted>: the fields
    `key` / `key_b` inside a `watermark` object, and the whole `watermark_config` value."""
    if isinstance(value, dict):
        out = {}
        for name, item in value.items():
            if name == "watermark_config" and item is not None:
                out[name] = REDACTED
            elif in_watermark and name in ("key", "key_b") and item is not None:
                out[name] = REDACTED
            else:
                out[name] = redact(item, in_watermark or name == "watermark")
        return out
    if isinstance(value, (list, tuple)):
        return type(value)(redact(item, in_watermark) for item in value)
    return value
