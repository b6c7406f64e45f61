"""One chat choice's generated text split into reasoning, content and tool calls, piece by piece.

The reasoning parser (--reasoning-parser, with separate_reasoning) takes the text first; what it
leaves as content goes through the tool-call parser (a required or named tool_choice's JSON array,
or --tool-call-parser's format under tool_choice auto). A whole output is the same machine fed
once, so a stream's deltas add up to the non-streamed message.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.entrypoints.openai.serving_choices import ChoiceTracker, LogprobFormat, Piece
from sglang.srt.entrypoints.openai.tool_protocol import FunctionCallOut, ToolCallOut
from sglang.srt.function_call import ToolCallDelta, ToolCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)

    def add(self, other: "ChatDelta") -> "ChatDelta":
        return ChatDelta(self.reasoning + other.reasoning, self.content + other.content, self.tool_calls + other.tool_calls)


class ChatOutputParser:
    def __init__(self, reasoning: Optional[ReasoningParser], tools: Optional[ToolCallParser]) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.call_ids: list[str] = []

    def feed(self, text: str) -> ChatDelta:
        reasoning = ""
        if self.reasoning is not None:
            split = self.reasoning.feed(text)
            reasoning, text = split.reasoning, split.content
        return self._tool_step(reasoning, text, final=False)

    def finish(self) -> ChatDelta:
        reasoning, text = "", ""
        if self.reasoning is not None:
            split = self.reasoning.finish()
            reasoning, text = split.reasoning, split.content
        return self._tool_step(reasoning, text, final=True)

    @property
    def made_calls(self) -> bool:
        return bool(self.call_ids)

    def _tool_step(self, reasoning: str, text: str, final: bool) -> ChatDelta:
        if self.tools is None:
            return ChatDelta(reasoning, text)
        parsed = self.tools.feed(text)
        if final:
            rest = self.tools.finish()
            parsed.text += rest.text
            parsed.calls += rest.calls
        return ChatDelta(reasoning, parsed.text, [self._out(delta) for delta in parsed.calls])

    def _out(self, delta: ToolCallDelta) -> ToolCallOut:
        if delta.name is None:
            return ToolCallOut(index=delta.index, function=FunctionCallOut(arguments=delta.arguments))
        self.call_ids.append(f"call_{uuid.uuid4().hex[:24]}")
        return ToolCallOut(
            index=delta.index,
            id=self.call_ids[delta.index],
            type="function",
            function=FunctionCallOut(name=delta.name, arguments=delta.arguments),
        )


class ChatChoiceTracker(ChoiceTracker):
    """A choice's pieces with the reasoning and tool calls parsed out of the text; a choice that
    called tools and stopped by itself finishes with "tool_calls"."""

    def __init__(self, index: int, logprob_format: Optional[LogprobFormat], parser: ChatOutputParser) -> None:
        super().__init__(index, logprob_format)
        self.parser = parser

    def step(self, item: dict[str, Any]) -> Piece:
        piece = super().step(item)
        delta = self.parser.feed(piece.text)
        if piece.finish_reason is not None:
            delta = delta.add(self.parser.finish())
            if piece.finish_reason == "stop" and self.parser.made_calls:
                piece.finish_reason = "tool_calls"
        piece.text, piece.reasoning, piece.tool_calls = delta.content, delta.reasoning, delta.tool_calls
        return piece


def merge_calls(deltas: list[ToolCallOut]) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each call, from its deltas in order."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.id is not None:
            calls[delta.index] = [delta.id, delta.function.name or "", ""]
        calls[delta.index][2] += delta.function.arguments
    return [(c[0], c[1], c[2]) for _, c in sorted(calls.items())]
