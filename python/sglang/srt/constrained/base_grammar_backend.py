"""The grammar backends' one interface: compile a request's grammar, advance it with accepted
tokens, fill its row of the packed vocab bitmask, report termination, roll back.

A backend compiles on a small thread pool and caches compiled grammars by (kind, text), so a
request waits in the scheduler's grammar queue while its grammar compiles and the scheduler
never blocks on a compile. Each request gets its own matcher (`BaseGrammarObject`) over the
shared compiled grammar: `n > 1` children and requests with the same schema never share state.

The bitmask is the libraries' common layout: [B, ceil(V / 32)] int32, bit `t % 32` of word
`t // 32` set when token t is allowed (bitmask.py).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Optional

import torch

# The request fields that carry a grammar, at most one per request (SamplingParams checks it).
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
COMPILE_THREADS = 2


class GrammarKey(NamedTuple):
    kind: str  # one of GRAMMAR_FIELDS
    text: str


class GrammarError(ValueError):
    """A grammar the backend cannot use; the message names the request field and the library's reason."""

    def __init__(self, key: GrammarKey, reason: str) -> None:
        super().__init__(f"{key.kind} is not a valid grammar for this server: {reason}")
        self.key = key


def grammar_key(params: Any) -> Optional[GrammarKey]:
    """The (kind, text) of the one grammar field a SamplingParams sets, or None."""
    for kind in GRAMMAR_FIELDS:
        text = getattr(params, kind, None)
        if text is not None:
            return GrammarKey(kind, text)
    return None


def parse_json_field(key: GrammarKey) -> Any:
    """json_schema and structural_tag are JSON documents sent as strings."""
    if not isinstance(key.text, str):
        raise GrammarError(key, f"it must be a string holding a JSON document, got {type(key.text).__name__}")
    try:
        return json.loads(key.text)
    except json.JSONDecodeError as err:
        raise GrammarError(key, f"it is not valid JSON ({err})") from None


class BaseGrammarObject(ABC):
    """One request's grammar state (a matcher over a compiled grammar)."""

    @abstractmethod
    def accept_token(self, token: int) -> bool:
        """Advance by one sampled token; False when the grammar does not allow it (state unchanged)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar has accepted a stop token and allows nothing more."""

    @abstractmethod
    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of a host int32 bitmask [B, W]."""

    def fork(self) -> "BaseGrammarObject":
        """An independent matcher in this one's state (beam search forks a beam's grammar when
        another row takes over its continuation); advancing either leaves the other unchanged."""
        raise NotImplementedError(f"{type(self).__name__} cannot fork its grammar state.")

    @classmethod
    def fill_vocab_masks(cls, grammars: list["BaseGrammarObject"], bitmask: torch.Tensor, rows: list[int], parallel: bool) -> None:
        """Fill `rows` of a host bitmask from grammars of this class. `parallel`: the library may
        use its own threads (not when the model runs on the CPU, whose OpenMP team owns the cores and
        would make threaded fills wait; docs/structured_outputs.md)."""
        if parallel and len(grammars) > 1:
            cls.fill_vocab_masks_threaded(grammars, bitmask, rows)
            return
        for grammar, row in zip(grammars, rows):
            grammar.fill_vocab_mask(bitmask, row)

    @classmethod
    def fill_vocab_masks_threaded(cls, grammars: list["BaseGrammarObject"], bitmask: torch.Tensor, rows: list[int]) -> None:
        """The library's threaded fill of several rows."""
        raise NotImplementedError


class BaseGrammarBackend(ABC):
    """Compiles grammars off the caller's thread and caches them by (kind, text)."""

    name: str

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], any_whitespace: bool = True) -> None:
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        # False (--constrained-json-disable-any-whitespace): JSON has no free whitespace between
        # tokens, which keeps small models from filling max_new_tokens with blanks.
        self.any_whitespace = any_whitespace
        self._executor = ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._cache: dict[GrammarKey, Future] = {}

    def compile_async(self, key: GrammarKey) -> Future:
        """A future of the compiled grammar (its exception a GrammarError); shared by equal keys."""
        future = self._cache.get(key)
        if future is None:
            future = self._executor.submit(self._compile_checked, key)
            self._cache[key] = future
        return future

    def _compile_checked(self, key: GrammarKey) -> Any:
        try:
            return self.compile(key)
        except GrammarError:
            raise
        except Exception as err:  # noqa: BLE001 - the library's reason goes to the client
            raise GrammarError(key, f"{type(err).__name__}: {err}") from err

    @abstractmethod
    def compile(self, key: GrammarKey) -> Any:
        """Compile on the calling thread; raises GrammarError (or the library's error)."""

    @abstractmethod
    def new_matcher(self, compiled: Any, stop_token_ids: list[int]) -> BaseGrammarObject:
        """A fresh matcher; `stop_token_ids` end the grammar where it may end (EOS and the request's stop ids)."""

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
