"""Grammars under beam search: each beam row carries its own matcher.

The sampler masks every beam row with its own matcher before the row's top-2k candidates are
taken (constrained/bitmask.py reads `req.grammar` per row), so each beam only extends with tokens
its grammar allows. After a selection, row j continues beam parents[j] with token toks[j]: its
matcher becomes a fork of the parent's matcher (taken before any row advances) advanced by
toks[j]; a row that continues its own beam keeps its matcher. A candidate whose token ends the
grammar (one of the matcher's stop tokens) finishes its beam, so no live row holds a terminated
matcher.
"""

from __future__ import annotations

from typing import Any, Sequence

from sglang.srt.constrained.base_grammar_backend import grammar_key


def grammar_stop_ids(req: Any) -> set[int]:
    """The ids that end a grammar beam: those its matcher may end on (the request's stop ids and
    every EOS id, whatever ignore_eos says), none without a grammar."""
    if grammar_key(req.sampling_params) is None:
        return set()
    return req.stop_token_ids()


class GrammarRefused(ValueError):
    """A beam's matcher refused the token selected for it (its mask allowed it: an internal error)."""


def fork_grammars(grammars: Sequence[Any], parents: Sequence[int], toks: Sequence[int]) -> list[Any]:
    """The matchers of the rows after a selection: row j takes a fork of grammars[parents[j]]
    (the matcher itself when parents[j] == j), advanced by toks[j]. All forks are taken before
    any matcher advances. All None without a grammar; raises GrammarRefused."""
    if all(g is None for g in grammars):
        return [None] * len(parents)
    new = [grammars[p] if p == j else grammars[p].fork() for j, p in enumerate(parents)]
    for j, (grammar, tok) in enumerate(zip(new, toks)):
        if not grammar.accept_token(tok):
            raise GrammarRefused(f"The grammar of beam {j} rejected the selected token {tok}.")
    return new
