"""Grammar after reasoning: a request whose output starts with a reasoning section (a server with
--reasoning-parser and a reasoning-enabled request, SGLang's `require_reasoning`) thinks freely
and only its answer follows the grammar.

`ReasoningGate` wraps the request's matcher. Until the output holds the think-end marker (the
parser's `</think>`, one or several token ids) every token is allowed and nothing reaches the
inner matcher; the token that completes the marker opens the gate, and from the next token on the
inner matcher masks, accepts and terminates as it would from a first token. A think-end forced by
the thinking budget (max_thinking_tokens / thinking_token_budget) opens it the same way, since the
forced token is accepted like any other. Rolling back past the marker closes the gate again.
"""

from __future__ import annotations

from typing import Sequence

import torch

from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject
from sglang.srt.constrained.bitmask import ALL_ALLOWED


class ReasoningGate(BaseGrammarObject):
    def __init__(self, inner: BaseGrammarObject, think_end_ids: Sequence[int]) -> None:
        if not think_end_ids:
            raise ValueError("the think-end marker must be at least one token id")
        self.inner = inner
        self.think_end_ids = tuple(think_end_ids)
        # Tokens accepted while closed, the marker's last one included (kept for rollback).
        self.reasoning: list[int] = []
        self.opened = False
        self.answer_len = 0  # tokens the inner matcher accepted since the gate opened

    def accept_token(self, token: int) -> bool:
        if self.opened:
            if not self.inner.accept_token(token):
                return False
            self.answer_len += 1
            return True
        self.reasoning.append(token)
        width = len(self.think_end_ids)
        self.opened = tuple(self.reasoning[-width:]) == self.think_end_ids
        return True

    def rollback(self, num_tokens: int) -> None:
        from_answer = min(num_tokens, self.answer_len)
        if from_answer:
            self.inner.rollback(from_answer)
            self.answer_len -= from_answer
        from_reasoning = num_tokens - from_answer
        if from_reasoning:
            del self.reasoning[len(self.reasoning) - from_reasoning :]
            self.opened = False

    def is_terminated(self) -> bool:
        return self.opened and self.inner.is_terminated()

    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.opened:
            self.inner.fill_vocab_mask(bitmask, row)
        else:
            bitmask[row].fill_(ALL_ALLOWED)

    @classmethod
    def fill_vocab_masks(cls, grammars: list["ReasoningGate"], bitmask: torch.Tensor, rows: list[int], parallel: bool) -> None:
        """Closed gates' rows allow everything; open gates' rows are filled by their inner
        matchers, one batched call per inner class."""
        by_type: dict[type, tuple[list[BaseGrammarObject], list[int]]] = {}
        for gate, row in zip(grammars, rows):
            if gate.opened:
                inners, inner_rows = by_type.setdefault(type(gate.inner), ([], []))
                inners.append(gate.inner)
                inner_rows.append(row)
            else:
                bitmask[row].fill_(ALL_ALLOWED)
        for kind, (inners, inner_rows) in by_type.items():
            kind.fill_vocab_masks(inners, bitmask, inner_rows, parallel)

    def fork(self) -> "ReasoningGate":
        """An independent copy in the same state (a beam's new branch)."""
        twin = ReasoningGate(self.inner.fork(), self.think_end_ids)
        twin.reasoning = list(self.reasoning)
        twin.opened = self.opened
        twin.answer_len = self.answer_len
        return twin
