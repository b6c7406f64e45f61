"""OpenAI tool-calling schemas for chat completions: tool definitions, tool_choice, the calls an
assistant message carries (in requests and in responses), and what tool_choice asks for."""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, model_serializer

from sglang.srt.entrypoints.openai.protocol_base import _Nested, _Strict


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    def parameter_schema(self) -> dict[str, Any]:
        """The arguments' JSON schema; a function without one takes an object of anything."""
        return self.parameters if self.parameters else {"type": "object", "properties": {}}


class ToolDefinition(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition

    def template_dict(self) -> dict[str, Any]:
        """The tool as chat templates read it (OpenAI's shape)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class ToolChoiceFunction(_Nested):
    name: str


class NamedToolChoice(_Nested):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class CalledFunction(_Nested):
    name: str
    arguments: str = "{}"


class RequestToolCall(_Nested):
    """A call of an earlier assistant message, as the client sends it back."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction
    index: Optional[int] = None  # present when a response's call is echoed back whole

    def template_dict(self) -> dict[str, Any]:
        # Templates write the arguments with tojson: an object, not its JSON text, when it parses.
        try:
            arguments: Any = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            arguments = self.function.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}


class FunctionCallOut(BaseModel):
    name: Optional[str] = None
    arguments: str = ""

    @model_serializer
    def _only_set(self) -> dict[str, Any]:
        # A stream's later deltas of a call carry argument text only.
        return {"name": self.name, "arguments": self.arguments} if self.name is not None else {"arguments": self.arguments}


class ToolCallOut(BaseModel):
    """A call in a response message or a stream delta (id and type only on its first delta)."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: FunctionCallOut

    @model_serializer
    def _only_set(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out |= {"id": self.id, "type": self.type or "function"}
        return out | {"function": self.function.model_dump()}


def check_tool_choice(tools: Optional[list[ToolDefinition]], choice: ToolChoice) -> Optional[str]:
    """SGLang's error for a tool_choice the tools cannot satisfy, or None."""
    if choice == "required" and not tools:
        return "Tools cannot be empty if tool choice is set to required."
    if isinstance(choice, NamedToolChoice):
        if not tools:
            return "Tools cannot be empty if tool choice is set to a specific tool."
        if all(t.function.name != choice.function.name for t in tools):
            return f"Tool '{choice.function.name}' not found in tools list."
    return None


def forced_tools(tools: list[ToolDefinition], choice: ToolChoice) -> list[FunctionDefinition]:
    """The functions a required (any of them) or named (that one) tool_choice makes the model call;
    empty for auto / none."""
    if choice == "required":
        return [t.function for t in tools]
    if isinstance(choice, NamedToolChoice):
        return [t.function for t in tools if t.function.name == choice.function.name]
    return []


def tool_call_schema(functions: list[FunctionDefinition], parallel: bool) -> dict[str, Any]:
    """The JSON schema of a forced call: an array of {"name", "parameters"} objects, one of the
    functions each (at most one with parallel_tool_calls false). The functions' `$defs` move to
    the top, where their `#/$defs/...` references point; two different definitions of one name
    are refused (ValueError)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [f.name]}, "parameters": _without_defs(f)},
            "required": ["name", "parameters"],
        }
        for f in functions
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    defs = _merged_defs(functions)
    if defs:
        schema["$defs"] = defs
    return schema


def _without_defs(function: FunctionDefinition) -> dict[str, Any]:
    return {k: v for k, v in function.parameter_schema().items() if k != "$defs"}


def _merged_defs(functions: list[FunctionDefinition]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for function in functions:
        for name, definition in function.parameter_schema().get("$defs", {}).items():
            if merged.setdefault(name, definition) != definition:
                raise ValueError(f"Tool definition '{name}' has multiple schemas, which is not supported.")
    return merged
