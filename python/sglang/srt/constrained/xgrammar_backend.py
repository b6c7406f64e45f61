"""--grammar-backend xgrammar (the default): PyPI `xgrammar`."""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

import torch
import xgrammar as xgr

from sglang.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
    GrammarKey,
    parse_json_field,
)
from sglang.srt.constrained.json_schema_support import check_json_schema
from sglang.srt.constrained.repetition_bounds import check_grammar_bounds


_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class XGrammarObject(BaseGrammarObject):
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    def accept_token(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def fork(self) -> "XGrammarObject":
        return XGrammarObject(self.matcher.fork())

    @classmethod
    def fill_vocab_masks_threaded(cls, grammars: list["XGrammarObject"], bitmask: torch.Tensor, rows: list[int]) -> None:
        # One row can take milliseconds (inside a string near its maxLength): rows fill in
        # parallel on a GPU host's spare cores.
        _batch_matcher().batch_fill_next_token_bitmask([g.matcher for g in grammars], bitmask, rows)


@functools.cache
def _batch_matcher() -> xgr.BatchGrammarMatcher:
    return xgr.BatchGrammarMatcher()


class XGrammarBackend(BaseGrammarBackend):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool = True) -> None:
        super().__init__(tokenizer, vocab_size, stop_token_ids, any_whitespace)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_token_ids)
        # Compiles run off the scheduler thread already (our executor, which also caches); the
        # compiler's threads shorten a large schema's compile several-fold.
        self.compiler = xgr.GrammarCompiler(info, max_threads=min(8, os.cpu_count() or 1), cache_enabled=False)

    def compile(self, key: GrammarKey) -> xgr.CompiledGrammar:
        validate(key)
        if key.kind == "json_schema":
            return self.compiler.compile_json_schema(key.text, any_whitespace=self.any_whitespace)
        if key.kind == "regex":
            return self.compiler.compile_regex(key.text)
        if key.kind == "ebnf":
            return self.compiler.compile_grammar(key.text)
        return self.compiler.compile_structural_tag(*_structural_tag_args(key))

    def new_matcher(self, compiled: xgr.CompiledGrammar, stop_token_ids: list[int]) -> XGrammarObject:
        return XGrammarObject(xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_token_ids)))


def validate(key: GrammarKey) -> None:
    """Parse without a tokenizer (cheap): raises GrammarError naming the field and the reason."""
    check_grammar_bounds(key)
    if key.kind == "json_schema":
        schema = parse_json_field(key)
        check_json_schema(key, schema)
    try:
        if key.kind == "json_schema":
            xgr.Grammar.from_json_schema(key.text)
        elif key.kind == "regex":
            xgr.Grammar.from_regex(key.text)
        elif key.kind == "ebnf":
            xgr.Grammar.from_ebnf(key.text)
        else:
            xgr.Grammar.from_structural_tag(*_structural_tag_args(key))
    except GrammarError:
        raise
    except Exception as err:  # noqa: BLE001 - the library's reason goes to the client
        raise GrammarError(key, _reason(err)) from None


def _structural_tag_args(key: GrammarKey) -> tuple:
    """SGLang's two structural_tag forms: {"structures": [{begin, schema, end}], "triggers"}
    (the legacy one its OpenAI path builds) or xgrammar's own {"type": "structural_tag", "format": ...}."""
    tag = parse_json_field(key)
    if not isinstance(tag, dict):
        raise GrammarError(key, "it must be a JSON object")
    if "structures" not in tag:
        return (key.text,)
    try:
        for s in tag["structures"]:
            check_json_schema(key, s["schema"])
        items = [
            xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
            for s in tag["structures"]
        ]
        triggers = list(tag["triggers"])
    except (KeyError, TypeError) as err:
        raise GrammarError(
            key, f"each of its structures needs begin, schema and end, and it needs triggers ({type(err).__name__}: {err})"
        ) from None
    return items, triggers


def _reason(err: Exception) -> str:
    """The library's message without its log prefix ("[12:00:00] /project/cpp/x.cc:83: ")."""
    text = str(err).strip() or type(err).__name__
    return _LOG_PREFIX.sub("", text.splitlines()[0] if len(text) > 500 else text)
