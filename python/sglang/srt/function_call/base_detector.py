"""The interface of one model family's tool-call format."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Optional

from sglang.srt.function_call.core_types import PartialCall, StructureInfo
from sglang.srt.function_call.json_scan import ScannedObject, scan_object, skip_ws


class ToolCallDetector(ABC):
    """Finds where a model's output turns into tool calls and reads the calls from there.

    `markers` open the tool-call section; the text before the first one is the message content.
    """

    markers: tuple[str, ...] = ()

    def section_start(self, text: str) -> Optional[int]:
        """Where the tool-call section begins in `text`, or None if it has not (yet)."""
        found = [i for i in (text.find(m) for m in self.markers) if i != -1]
        return min(found) if found else None

    def holdback(self, text: str) -> int:
        """How many trailing characters of `text` (no section yet) might still open one."""
        best = 0
        for marker in self.markers:
            for size in range(min(len(marker) - 1, len(text)), best, -1):
                if text.endswith(marker[:size]):
                    best = size
                    break
        return best

    @abstractmethod
    def parse_section(self, section: str) -> list[PartialCall]:
        """The calls in the section text (from its marker on), in order, as far as it goes."""

    @abstractmethod
    def structure_info(self, name: str) -> StructureInfo:
        """The text this format writes around function `name`'s arguments object."""


class LeadingJsonDetector(ToolCallDetector):
    """A format whose calls may also start the output bare, with no marker (`opening` first)."""

    opening = "{"

    def section_start(self, text: str) -> Optional[int]:
        start = skip_ws(text, 0)
        if text.startswith(self.opening, start):
            return start
        return super().section_start(text)

    def holdback(self, text: str) -> int:
        # Only whitespace so far: the output may still open with a bare call.
        return len(text) if not text.strip() else super().holdback(text)


ARGUMENT_KEYS = ("arguments", "parameters")


def call_from_object(obj: ScannedObject) -> PartialCall:
    """A call from a scanned {"name": ..., "arguments" | "parameters": {...}} object."""
    name_field = obj.fields.get("name")
    name = None
    if name_field is not None and name_field.complete:
        value = json.loads(name_field.raw)
        name = value if isinstance(value, str) else None
    args = next((obj.fields[k] for k in ARGUMENT_KEYS if k in obj.fields), None)
    complete = obj.end is not None
    if args is None:
        return PartialCall(name, "{}" if complete else "", complete)
    return PartialCall(name, args.raw, complete)


def parse_json_objects(text: str, pos: int, separators: str, closer: str = "") -> list[PartialCall]:
    """Call objects from text[pos:], separated by any of `separators`, up to `closer` if given."""
    calls: list[PartialCall] = []
    while True:
        pos = skip_ws(text, pos)
        while pos < len(text) and text[pos] in separators:
            pos = skip_ws(text, pos + 1)
        if pos >= len(text) or (closer and text[pos] == closer):
            return calls
        obj = scan_object(text, pos)
        if obj is None:
            return calls
        calls.append(call_from_object(obj))
        if obj.end is None:
            return calls
        pos = obj.end
