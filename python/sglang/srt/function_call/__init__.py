"""Tool calling: per model family, where an output's tool calls are and what they say
(`--tool-call-parser`), and the grammar that makes a required or named call."""

from sglang.srt.function_call.core_types import ParseResult, ToolCallDelta, ToolCallItem
from sglang.srt.function_call.parser import (
    TOOL_CALL_PARSERS,
    ToolCallParser,
    get_detector,
    json_array_detector,
    parse_tool_calls,
)

__all__ = [
    "TOOL_CALL_PARSERS",
    "ParseResult",
    "ToolCallDelta",
    "ToolCallItem",
    "ToolCallParser",
    "get_detector",
    "json_array_detector",
    "parse_tool_calls",
]
