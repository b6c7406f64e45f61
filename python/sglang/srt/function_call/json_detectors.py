"""Tool-call formats whose calls are JSON objects: Hermes / Qwen2.5, Llama 3, Mistral, DeepSeek-V3,
and the plain JSON array that a required or named tool_choice constrains the output to."""

from __future__ import annotations

from sglang.srt.function_call.base_detector import LeadingJsonDetector, ToolCallDetector, parse_json_objects
from sglang.srt.function_call.core_types import PartialCall, StructureInfo
from sglang.srt.function_call.json_scan import scan_object, skip_ws, value_end


class HermesDetector(ToolCallDetector):
    """<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, repeated for parallel calls."""

    markers = ("<tool_call>",)

    def parse_section(self, section: str) -> list[PartialCall]:
        calls: list[PartialCall] = []
        pos = 0
        while (found := section.find(self.markers[0], pos)) != -1:
            body = found + len(self.markers[0])
            first = parse_json_objects(section, body, "")[:1]
            calls += first
            if not first or not first[0].complete:
                return calls
            pos = _object_end(section, body)
        return calls

    def structure_info(self, name: str) -> StructureInfo:
        return StructureInfo(f'<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>", "<tool_call>")


def _object_end(text: str, pos: int) -> int:
    start = skip_ws(text, pos)
    obj = scan_object(text, start)
    return obj.end if obj is not None and obj.end is not None else len(text)


class Llama3Detector(LeadingJsonDetector):
    """<|python_tag|>{"name": ..., "parameters": {...}} or the bare object; `;` between calls."""

    markers = ("<|python_tag|>",)

    def parse_section(self, section: str) -> list[PartialCall]:
        pos = len(self.markers[0]) if section.startswith(self.markers[0]) else 0
        return parse_json_objects(section, pos, ";")

    def structure_info(self, name: str) -> StructureInfo:
        return StructureInfo(f'<|python_tag|>{{"name": "{name}", "arguments": ', "}", "<|python_tag|>")


class JsonArrayDetector(LeadingJsonDetector):
    """[{"name": ..., "parameters": {...}}, ...]: the output a required or named tool_choice's
    JSON-schema grammar allows."""

    opening = "["
    markers: tuple[str, ...] = ()

    def parse_section(self, section: str) -> list[PartialCall]:
        pos = skip_ws(section, 0)
        if not section.startswith("[", pos):
            return []
        return parse_json_objects(section, pos + 1, ",", closer="]")

    def structure_info(self, name: str) -> StructureInfo:
        return StructureInfo(f'[{{"name": "{name}", "parameters": ', "}]", "[")


class MistralDetector(ToolCallDetector):
    """[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]"""

    markers = ("[TOOL_CALLS]",)

    def parse_section(self, section: str) -> list[PartialCall]:
        return JsonArrayDetector().parse_section(section[len(self.markers[0]) :])

    def structure_info(self, name: str) -> StructureInfo:
        return StructureInfo(f'[TOOL_CALLS] [{{"name": "{name}", "arguments": ', "}]", "[TOOL_CALLS]")


_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_SEP = "<｜tool▁sep｜>"
_FENCE = "```json\n"


class DeepSeekV3Detector(ToolCallDetector):
    """<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>..., one call block per call."""

    markers = (_CALLS_BEGIN, _CALL_BEGIN)

    def parse_section(self, section: str) -> list[PartialCall]:
        calls: list[PartialCall] = []
        pos = 0
        while (found := section.find(_CALL_BEGIN, pos)) != -1:
            call, pos = _deepseek_call(section, found + len(_CALL_BEGIN))
            if call is None:
                return calls
            calls.append(call)
            if not call.complete:
                return calls
        return calls

    def structure_info(self, name: str) -> StructureInfo:
        begin = f"{_CALLS_BEGIN}{_CALL_BEGIN}function{_SEP}{name}\n{_FENCE}"
        return StructureInfo(begin, "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", _CALLS_BEGIN)


def _deepseek_call(text: str, pos: int) -> tuple[PartialCall | None, int]:
    """The call whose block body starts at text[pos], and where scanning goes on."""
    sep = text.find(_SEP, pos)
    if sep == -1:
        return None, len(text)
    name_start = sep + len(_SEP)
    newline = text.find("\n", name_start)
    if newline == -1:
        return None, len(text)
    name = text[name_start:newline].strip()
    fence_at = newline + 1
    if not text.startswith(_FENCE, fence_at):
        # The fence may still be arriving; anything else is not this format.
        return (PartialCall(name, "", False) if _FENCE.startswith(text[fence_at:]) else None), len(text)
    args_start = skip_ws(text, fence_at + len(_FENCE))
    end = value_end(text, args_start)
    if end is None:
        return PartialCall(name, text[args_start:], False), len(text)
    return PartialCall(name, text[args_start:end], True), end
