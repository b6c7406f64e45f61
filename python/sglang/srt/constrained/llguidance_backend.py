"""--grammar-backend llguidance: PyPI `llguidance`.

A compiled grammar is a matcher that has parsed the grammar once; each request deep-copies it.
EBNF is converted from GBNF (SGLang's and xgrammar's EBNF dialect) to Lark; structural_tag
takes SGLang's {"structures", "triggers"} form (xgrammar's newer "format" form needs xgrammar).
The grammar may end at the model's EOS tokens only: llguidance knows the tokenizer's ends, not a
request's extra stop_token_ids.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from llguidance.gbnf_to_lark import gbnf_to_lark

from sglang.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
    GrammarKey,
    parse_json_field,
)
from sglang.srt.constrained.json_schema_support import check_json_schema
from sglang.srt.constrained.repetition_bounds import check_grammar_bounds


class GuidanceObject(BaseGrammarObject):
    def __init__(self, matcher: llguidance.LLMatcher, stop_token_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.stop_token_ids = stop_token_ids
        self.accepted_stop = False

    def accept_token(self, token: int) -> bool:
        if token in self.stop_token_ids:
            # Ending is not a token of llguidance's parse (its rollback would not count it), so a
            # stop token is recorded here, allowed wherever the grammar may end.
            self.accepted_stop = self.matcher.is_accepting()
            return self.accepted_stop
        # try_consume_tokens leaves a refused token unconsumed; consume_token would enter an error state.
        return self.matcher.try_consume_tokens([token]) == 1

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0 and self.accepted_stop:
            self.accepted_stop = False
            num_tokens -= 1
        if num_tokens > 0:
            self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.accepted_stop

    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        llguidance.torch.fill_next_token_bitmask(self.matcher, bitmask, row)

    def fork(self) -> "GuidanceObject":
        copy = GuidanceObject(self.matcher.deep_copy(), self.stop_token_ids)
        copy.accepted_stop = self.accepted_stop
        return copy

    @classmethod
    def fill_vocab_masks_threaded(cls, grammars: list["GuidanceObject"], bitmask: torch.Tensor, rows: list[int]) -> None:
        pairs = [(g.matcher, row) for g, row in zip(grammars, rows)]
        llguidance.torch.fill_next_token_bitmask_par(_executor(), pairs, bitmask)


@functools.cache
def _executor() -> llguidance.LLExecutor:
    return llguidance.LLExecutor()


class GuidanceBackend(BaseGrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool = True) -> None:
        super().__init__(tokenizer, vocab_size, stop_token_ids, any_whitespace)
        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=self.stop_token_ids)

    def compile(self, key: GrammarKey) -> llguidance.LLMatcher:
        grammar = to_llguidance_grammar(key, self.any_whitespace)
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(key, matcher.get_error())
        return matcher

    def new_matcher(self, compiled: llguidance.LLMatcher, stop_token_ids: list[int]) -> GuidanceObject:
        return GuidanceObject(compiled.deep_copy(), frozenset(self.stop_token_ids))


def to_llguidance_grammar(key: GrammarKey, any_whitespace: bool = True) -> str:
    """The llguidance grammar of a request field; raises GrammarError."""
    check_grammar_bounds(key)
    try:
        if key.kind == "json_schema":
            schema = parse_json_field(key)
            check_json_schema(key, schema)
            return llguidance.LLMatcher.grammar_from_json_schema(key.text, defaults={"whitespace_flexible": any_whitespace})
        if key.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(key.text)
        if key.kind == "ebnf":
            return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(key.text))
        return llguidance.StructTag.to_grammar(_struct_tags(key))
    except GrammarError:
        raise
    except Exception as err:  # noqa: BLE001 - the library's reason goes to the client
        raise GrammarError(key, f"{type(err).__name__}: {err}") from None


def _struct_tags(key: GrammarKey) -> list[llguidance.StructTag]:
    tag = parse_json_field(key)
    if not isinstance(tag, dict) or "structures" not in tag:
        raise GrammarError(
            key, 'llguidance takes the {"structures": [...], "triggers": [...]} form; use --grammar-backend xgrammar for the "format" form'
        )
    triggers = list(tag.get("triggers") or [])
    tags = []
    for s in tag["structures"]:
        check_json_schema(key, s["schema"])
        trigger = _trigger_of(s["begin"], triggers)
        if trigger is None:
            raise GrammarError(key, f"the begin {s['begin']!r} starts with none of the triggers {triggers}")
        tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=s["schema"], end=s["end"]))
    return tags


def _trigger_of(begin: str, triggers: list[str]) -> Optional[str]:
    return next((t for t in triggers if begin.startswith(t)), None)


def validate(key: GrammarKey) -> None:
    """Build and check the grammar without a tokenizer: raises GrammarError."""
    error = llguidance.LLMatcher.validate_grammar(to_llguidance_grammar(key))
    if error:
        raise GrammarError(key, error)
