"""Refuse JSON-schema keywords a grammar library would drop without a word (and length bounds
too large to fill masks for cheaply, repetition_bounds.py).

A library that ignores a keyword it does not implement gives an output that parses but does not
validate against the schema the client sent: a silently unconstrained field. Every keyword of
every subschema must be one the backends enforce, or an annotation that constrains nothing.
The lists were found by feeding xgrammar 0.2.8 a violating and a valid instance for each
keyword (test_structured_outputs_units keeps that check): it ignores uniqueItems, contains, not,
if/then/else, dependentRequired/dependentSchemas, unevaluated*, unknown formats and allOf with
several subschemas. llguidance refuses most of those itself but ignores unknown keywords,
so the same allowlist guards it; it also refuses propertyNames on its own.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.constrained.base_grammar_backend import GrammarError, GrammarKey
from sglang.srt.constrained.repetition_bounds import check_schema_bounds

# Keywords that constrain the output and that the backends enforce.
ENFORCED = frozenset({
    "type", "enum", "const",
    "properties", "required", "additionalProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minProperties", "maxProperties", "patternProperties", "propertyNames",
    "anyOf", "oneOf", "allOf",
    "$ref", "$defs", "definitions",
})
# The string formats xgrammar enforces (an unknown one would match any string).
FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "uri", "uri-reference", "uuid", "ipv4", "ipv6", "hostname",
})
# Keywords that describe without constraining.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
})
# Where subschemas sit: a schema, a list of schemas, or a map of name -> schema.
_SCHEMA_VALUED = ("items", "additionalProperties", "propertyNames")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def check_json_schema(key: GrammarKey, schema: Any) -> None:
    """Raise GrammarError naming the first keyword (with its path) that would not be enforced."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(key, f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
    _walk(key, schema, "#")


def _walk(key: GrammarKey, schema: Any, path: str) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError(key, f"the subschema at {path} must be an object or a boolean")
    for name in schema:
        if name not in ENFORCED and name not in ANNOTATIONS:
            raise GrammarError(
                key,
                f"the keyword {name!r} at {path} is not supported by the grammar backends (it would be ignored, "
                f"leaving the output unconstrained by it); supported keywords: {', '.join(sorted(ENFORCED))}",
            )
    if "format" in schema and schema["format"] not in FORMATS:
        raise GrammarError(
            key, f"the format {schema['format']!r} at {path} is not enforced by the grammar backends; supported: {', '.join(sorted(FORMATS))}"
        )
    check_schema_bounds(key, schema, path)
    if len(schema.get("allOf") or []) > 1:
        raise GrammarError(key, f"allOf with more than one subschema at {path} is not enforced by the grammar backends; merge them into one")
    for name in _SCHEMA_VALUED:
        if name in schema:
            _walk(key, schema[name], f"{path}/{name}")
    for name in _SCHEMA_LISTS:
        for i, sub in enumerate(_as_list(key, schema.get(name, []), f"{path}/{name}")):
            _walk(key, sub, f"{path}/{name}/{i}")
    for name in _SCHEMA_MAPS:
        subs = schema.get(name, {})
        if not isinstance(subs, dict):
            raise GrammarError(key, f"{path}/{name} must be an object")
        for prop, sub in subs.items():
            _walk(key, sub, f"{path}/{name}/{prop}")


def _as_list(key: GrammarKey, value: Any, path: str) -> list:
    if not isinstance(value, list):
        raise GrammarError(key, f"{path} must be an array")
    return value
