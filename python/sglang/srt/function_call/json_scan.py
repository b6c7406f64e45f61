"""Scanning JSON text that may still be growing (a streamed model output).

A value's raw text is taken as the model wrote it, so that what a stream emits piece by piece
and what one parse of the whole text returns are the same characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

_WHITESPACE = " \t\r\n"
_CLOSERS = {"{": "}", "[": "]"}


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def value_end(text: str, start: int) -> Optional[int]:
    """The index just past the JSON value starting at `start`; None while it is incomplete."""
    if start >= len(text):
        return None
    first = text[start]
    if first == '"':
        return _string_end(text, start)
    if first in _CLOSERS:
        return _container_end(text, start)
    return _scalar_end(text, start)


def _string_end(text: str, start: int) -> Optional[int]:
    pos = start + 1
    while pos < len(text):
        char = text[pos]
        if char == "\\":
            pos += 2
            continue
        if char == '"':
            return pos + 1
        pos += 1
    return None


def _container_end(text: str, start: int) -> Optional[int]:
    stack = [_CLOSERS[text[start]]]
    pos = start + 1
    while pos < len(text):
        char = text[pos]
        if char == '"':
            end = _string_end(text, pos)
            if end is None:
                return None
            pos = end
            continue
        if char in _CLOSERS:
            stack.append(_CLOSERS[char])
        elif char in "}]":
            if char != stack.pop():
                return None
            if not stack:
                return pos + 1
        pos += 1
    return None


def _scalar_end(text: str, start: int) -> Optional[int]:
    # A number or literal ends at the first character that cannot continue it; at the end of
    # the text it may still continue.
    pos = start
    while pos < len(text) and text[pos] not in _WHITESPACE + ",}]":
        pos += 1
    return pos if pos < len(text) else None


@dataclass
class RawField:
    """One key of an object being scanned: its value's raw text so far and whether it ended."""

    raw: str
    complete: bool


@dataclass
class ScannedObject:
    fields: dict[str, RawField]
    end: Optional[int]  # just past the closing brace; None while the object is open


def scan_object(text: str, start: int) -> Optional[ScannedObject]:
    """The fields of the object at text[start] ("{"), as far as the text goes; None if the text
    there is not (the start of) a JSON object."""
    if start >= len(text) or text[start] != "{":
        return None
    fields: dict[str, RawField] = {}
    pos = skip_ws(text, start + 1)
    while pos < len(text):
        if text[pos] == "}":
            return ScannedObject(fields, pos + 1)
        key_end = _string_end(text, pos) if text[pos] == '"' else None
        if key_end is None:
            return ScannedObject(fields, None) if text[pos] == '"' else None
        key = text[pos + 1 : key_end - 1]
        pos = skip_ws(text, key_end)
        if pos >= len(text):
            break
        if text[pos] != ":":
            return None
        pos = skip_ws(text, pos + 1)
        if pos >= len(text):
            break
        end = value_end(text, pos)
        fields[key] = RawField(text[pos : end if end is not None else len(text)], end is not None)
        if end is None:
            break
        pos = skip_ws(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(text, pos + 1)
    return ScannedObject(fields, None)
