"""response_format: the structured-output formats a request may ask for, and the grammar each sets."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, NamedTuple, Optional, Union

from pydantic import Discriminator, Field, Tag, model_validator

from sglang.srt.entrypoints.openai.protocol_base import _Nested

class Grammar(NamedTuple):
    """The one grammar sampling param a response format sets: its name and its text."""

    kind: Literal["json_schema", "structural_tag"]
    text: str


# SGLang's mapping of json_object: any JSON object.
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# The engine's rule (SamplingParams): at most one of these per request.
GRAMMAR_PARAMS = ("json_schema", "regex", "ebnf", "structural_tag")


class TextFormat(_Nested):
    type: Literal["text"]

    def grammar(self) -> Optional[Grammar]:
        return None


class JsonObjectFormat(_Nested):
    type: Literal["json_object"]

    def grammar(self) -> Optional[Grammar]:
        return Grammar("json_schema", JSON_OBJECT_SCHEMA)


class _SchemaFields(_Nested):
    """OpenAI's json_schema description (nested under `json_schema` in chat, flat in Responses)."""

    name: str = Field(min_length=1)
    description: Optional[str] = None
    # `schema` would shadow a BaseModel attribute; the wire name is kept through the alias.
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    # Accepted for OpenAI compatibility only: the grammar always enforces the whole schema, so
    # strict=false gets the same (stricter than asked) output.
    strict: Optional[bool] = None

    def grammar(self) -> Optional[Grammar]:
        # Without a schema nothing is asked beyond a JSON object: json_object's mapping.
        if self.schema_ is None:
            return Grammar("json_schema", JSON_OBJECT_SCHEMA)
        return Grammar("json_schema", json.dumps(self.schema_))


class JsonSchemaFormat(_Nested):
    type: Literal["json_schema"]
    json_schema: _SchemaFields

    def grammar(self) -> Optional[Grammar]:
        return self.json_schema.grammar()


class StructuralTagStructure(_Nested):
    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class StructuralTagFormat(_Nested):
    """SGLang's form (structures + triggers), or xgrammar's own (`format`), passed on as JSON."""

    type: Literal["structural_tag"]
    structures: Optional[list[StructuralTagStructure]] = None
    triggers: Optional[list[str]] = None
    format: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _one_form(self) -> "StructuralTagFormat":
        legacy = (self.structures is not None, self.triggers is not None)
        if self.format is not None and any(legacy):
            raise ValueError("give either structures and triggers (SGLang's form) or format (xgrammar's), not both")
        if self.format is None and not all(legacy):
            raise ValueError("a structural_tag needs structures and triggers (or xgrammar's format)")
        return self

    def grammar(self) -> Optional[Grammar]:
        return Grammar("structural_tag", json.dumps(self.model_dump(by_alias=True, exclude_none=True)))


def _format_union(members: dict[str, type[_Nested]]) -> Any:
    """A union picked by `type` (the keys). Tags contain "[" so that error locations drop them,
    as they drop pydantic's own union-member tags (serving_wire._clean_loc)."""

    def tag(value: Any) -> Optional[str]:
        return f"format[{value.get('type')}]" if isinstance(value, dict) else None

    tagged = tuple(Annotated[model, Tag(f"format[{kind}]")] for kind, model in members.items())
    return Annotated[Union[tagged], Discriminator(tag)]


def _check_format_type(value: Any, allowed: tuple[str, ...]) -> Any:
    """One message listing the allowed types, instead of pydantic's about discriminator tags."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in allowed:
        listed = ", ".join(repr(t) for t in allowed)
        got = f"got type {kind!r}" if isinstance(value, dict) else f"got {type(value).__name__}"
        raise ValueError(f"must be an object whose type is one of {listed}; {got}")
    return value


_RESPONSE_FORMATS: dict[str, type[_Nested]] = {
    "text": TextFormat,
    "json_object": JsonObjectFormat,
    "json_schema": JsonSchemaFormat,
    "structural_tag": StructuralTagFormat,
}
RESPONSE_FORMAT_TYPES = tuple(_RESPONSE_FORMATS)
ResponseFormat = _format_union(_RESPONSE_FORMATS)
