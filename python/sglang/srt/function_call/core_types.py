"""What tool-call parsing produces: calls found in model text, and stream deltas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class PartialCall:
    """One call as far as the text goes. `arguments` is the JSON text of the arguments written so
    far; it only grows as more text arrives (so a stream can send the new part)."""

    name: Optional[str]  # None until the whole name is written
    arguments: str
    complete: bool


@dataclass
class ToolCallItem:
    """A parsed call: its position among the response's calls, name and JSON arguments."""

    index: int
    name: str
    arguments: str


@dataclass
class ToolCallDelta:
    """What a stream adds to call `index`: its name once (the first delta), then argument text."""

    index: int
    name: Optional[str]
    arguments: str


@dataclass
class ParseResult:
    """Text for the client's `content`, and the calls (whole, or the new part when streaming)."""

    text: str
    calls: list[ToolCallDelta]


@dataclass(frozen=True)
class StructureInfo:
    """The text around one call's arguments object in a format, for a structural-tag grammar."""

    begin: str
    end: str
    trigger: str
