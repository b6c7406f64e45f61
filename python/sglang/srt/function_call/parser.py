"""One choice's output split into message content and tool calls, as a stream or at once.

The stream re-reads the tool-call section as it grows and sends what is new: a call's name as
soon as it is whole, then its argument text. Parsing a whole output is the same machine fed once,
so a stream's pieces always add up to the non-streamed result.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.function_call.base_detector import ToolCallDetector
from sglang.srt.function_call.core_types import ParseResult, ToolCallDelta, ToolCallItem
from sglang.srt.function_call.json_detectors import (
    DeepSeekV3Detector,
    HermesDetector,
    JsonArrayDetector,
    Llama3Detector,
    MistralDetector,
)
from sglang.srt.function_call.pythonic_detector import PythonicDetector

# --tool-call-parser names (SGLang's), each with its format.
TOOL_CALL_PARSERS: dict[str, type[ToolCallDetector]] = {
    "hermes": HermesDetector,
    "qwen": HermesDetector,
    "qwen25": HermesDetector,
    "llama3": Llama3Detector,
    "mistral": MistralDetector,
    "deepseekv3": DeepSeekV3Detector,
    "pythonic": PythonicDetector,
}


def get_detector(name: str) -> ToolCallDetector:
    return TOOL_CALL_PARSERS[name]()


def json_array_detector() -> ToolCallDetector:
    """The format of an output constrained by a required or named tool_choice."""
    return JsonArrayDetector()


class ToolCallParser:
    """Feeds one choice's text pieces in order; each feed returns the content and call deltas
    that are new. Content ends where the tool-call section begins (trailing whitespace dropped)."""

    def __init__(self, detector: ToolCallDetector) -> None:
        self.detector = detector
        self.buffer = ""
        self.sent_text = 0  # characters of the buffer already returned as content
        self.section: Optional[int] = None  # where the tool-call section starts
        self.sent_args: list[int] = []  # per call already named: argument characters sent

    def feed(self, piece: str) -> ParseResult:
        self.buffer += piece
        if self.section is None:
            self.section = self.detector.section_start(self.buffer)
        if self.section is None:
            safe = len(self.buffer) - self.detector.holdback(self.buffer)
            return ParseResult(self._content_up_to(len(self.buffer[:safe].rstrip())), [])
        text = self._content_up_to(len(self.buffer[: self.section].rstrip()))
        return ParseResult(text, self._call_deltas())

    def finish(self) -> ParseResult:
        """What is still held back once the output is complete."""
        if self.section is None or not self.sent_args:
            # No call after all: the held text (a marker-like ending, whitespace) is content.
            return ParseResult(self._content_up_to(len(self.buffer)), [])
        return ParseResult("", [])

    def _content_up_to(self, end: int) -> str:
        if end <= self.sent_text:
            return ""
        text, self.sent_text = self.buffer[self.sent_text : end], end
        return text

    def _call_deltas(self) -> list[ToolCallDelta]:
        deltas = []
        for index, call in enumerate(self.detector.parse_section(self.buffer[self.section :])):
            if call.name is None:
                break
            is_new = index == len(self.sent_args)
            if is_new:
                self.sent_args.append(0)
            new_args = call.arguments[self.sent_args[index] :]
            self.sent_args[index] = max(self.sent_args[index], len(call.arguments))
            if is_new or new_args:
                deltas.append(ToolCallDelta(index, call.name if is_new else None, new_args))
        return deltas


def parse_tool_calls(detector: ToolCallDetector, text: str) -> tuple[str, list[ToolCallItem]]:
    """A whole output's content and calls."""
    parser = ToolCallParser(detector)
    results = [parser.feed(text), parser.finish()]
    return "".join(r.text for r in results), merge_deltas([d for r in results for d in r.calls])


def merge_deltas(deltas: list[ToolCallDelta]) -> list[ToolCallItem]:
    calls: dict[int, ToolCallItem] = {}
    for delta in deltas:
        if delta.name is not None:
            calls[delta.index] = ToolCallItem(delta.index, delta.name, "")
        calls[delta.index].arguments += delta.arguments
    return [calls[i] for i in sorted(calls)]
