"""The pythonic tool-call format (Llama 4, some Llama 3.2 prompts): a Python list of calls with
keyword arguments, `[get_weather(city="Paris"), get_time(zone="CET")]`."""

from __future__ import annotations

import ast
import json
import re
from typing import Optional

from sglang.srt.function_call.base_detector import LeadingJsonDetector
from sglang.srt.function_call.core_types import PartialCall, StructureInfo

_NAME = re.compile(r"\s*([A-Za-z_][\w.]*)\s*\(")
_PYTHON_START = "<|python_start|>"


class PythonicDetector(LeadingJsonDetector):
    """A call's name is known once its `(` is written; its arguments (converted to JSON) once
    the call closes, since partial Python arguments are not JSON."""

    opening = "["
    markers = (_PYTHON_START,)

    def parse_section(self, section: str) -> list[PartialCall]:
        body = section[len(_PYTHON_START) :] if section.startswith(_PYTHON_START) else section
        start = body.find("[")
        if start == -1:
            return []
        calls: list[PartialCall] = []
        for element, complete in _elements(body, start + 1):
            call = _call(element, complete)
            if call is None:
                return calls
            calls.append(call)
        return calls

    def structure_info(self, name: str) -> StructureInfo:
        # No JSON arguments object to constrain: the begin text only names the function.
        return StructureInfo(f"[{name}(", ")]", "[")


def _elements(text: str, pos: int) -> list[tuple[str, bool]]:
    """The list's top-level elements from text[pos:], each with whether it is finished."""
    out: list[tuple[str, bool]] = []
    depth, quote, start = 0, "", pos
    i = pos
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char in ",]" and depth == 0:
            if text[start:i].strip():
                out.append((text[start:i], True))
            if char == "]":
                return out
            start = i + 1
        i += 1
    if text[start:].strip():
        out.append((text[start:], False))
    return out


def _call(element: str, complete: bool) -> Optional[PartialCall]:
    match = _NAME.match(element)
    if match is None:
        return None
    name = match.group(1)
    if not complete:
        return PartialCall(name, "", False)
    try:
        node = ast.parse(element.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or node.args or any(kw.arg is None for kw in node.keywords):
            return None
        # Python's True / None spellings become JSON's; a non-literal argument is not a call.
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except (SyntaxError, ValueError):
        return None
    return PartialCall(name, json.dumps(arguments, ensure_ascii=False), True)

