"""Refuse grammars whose bounded repetitions are too long, before they compile.

While a request's matcher is inside a bounded repetition (a regex's `{m,n}`, EBNF's `{m,n}`, a
JSON string's minLength/maxLength, an array's minItems/maxItems), filling its vocab mask costs
both backends far more per step than inside the unbounded `*`/`+`, and every request in the
same batch waits for that fill. The bound decides how many steps a request can spend there, so
bounds above MAX_REPETITION_BOUND are refused with a 400 naming the bound
(docs/structured_outputs.md, "Bounded repetitions").
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from sglang.srt.constrained.base_grammar_backend import GrammarError, GrammarKey

# The largest bound accepted in a repetition or a JSON length keyword.
MAX_REPETITION_BOUND = 1024
JSON_BOUND_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")

_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def repetition_bounds(text: str, quoted_literals: bool) -> Iterator[int]:
    """Every number in the `{m}`, `{m,}`, `{m,n}` quantifiers of a regex (or, with
    quoted_literals, of an EBNF grammar, whose "..." literals are text, not quantifiers); braces
    escaped or inside a character class are characters."""
    i, in_class, quote = 0, False, None
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if quote is not None:
            quote = None if char == quote else quote
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if text.startswith("]", i + 1) or text.startswith("^]", i + 1):  # a leading ] is a member
                i += 2 if text[i + 1] == "]" else 3
                continue
        elif quoted_literals and char == '"':
            quote = char
        elif char == "{" and (match := _QUANTIFIER.match(text, i)):
            yield from (int(n) for n in match.groups() if n)
            i = match.end()
            continue
        i += 1


def check_grammar_bounds(key: GrammarKey) -> None:
    """The check for a regex or ebnf field (a JSON schema's bounds are checked as its keywords
    are, check_json_schema)."""
    if key.kind in ("regex", "ebnf") and isinstance(key.text, str):
        check_text_bounds(key, key.text, f"the {key.kind}")


def check_text_bounds(key: GrammarKey, text: str, where: str) -> None:
    """GrammarError when a regex (an EBNF grammar for the ebnf field) repeats more than
    MAX_REPETITION_BOUND times; `where` names the place in the request."""
    for bound in repetition_bounds(text, quoted_literals=key.kind == "ebnf"):
        if bound > MAX_REPETITION_BOUND:
            raise GrammarError(key, _too_large(f"the repetition bound {bound} in {where}"))


def check_schema_bounds(key: GrammarKey, schema: dict, path: str) -> None:
    """GrammarError when one subschema's length keywords or pattern exceed MAX_REPETITION_BOUND."""
    for name in JSON_BOUND_KEYWORDS:
        value = schema.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_REPETITION_BOUND:
            raise GrammarError(key, _too_large(f"{name} {value} at {path}"))
    if isinstance(schema.get("pattern"), str):
        check_text_bounds(key, schema["pattern"], f"the pattern at {path}")


def _too_large(what: str) -> str:
    return (
        f"{what} exceeds {MAX_REPETITION_BOUND}: a request inside a long bounded repetition slows every step of "
        f"its batch; use * or + (or a smaller bound)"
    )
