"""Custom logit processors: per-request logits transforms chosen by the client.

A request names its processor with a string in one of two forms:
- `{"name": "<registered name>"}`: a processor the operator registered at start-up; no code
  travels with the request.
- `{"callable": "<hex of dill.dumps(cls)>"}` (what `to_str()` produces): a serialized class.
  Unpickling runs arbitrary code, so the engine only accepts it when the operator enabled
  custom processors, and with an allowlist it inspects the pickle statically and accepts
  only a by-reference pickle of an allowlisted class before unpickling anything
  (custom_logit_processor_payload decodes both forms).

Per-request parameters arrive as `custom_params` dicts (one per row, or None); the
scheduler adds `"__req__"`, a proxy to the request (`origin_input_ids`, `output_ids`, ...).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Optional

import torch

from sglang.srt.sampling.custom_logit_processor_payload import (
    CustomLogitProcessorError,
    check_allowed,
    decode_callable,
    encode_callable,
    parse_reference,
)

logger = logging.getLogger(__name__)

DISABLED_MESSAGE = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)

CustomParamList = Optional[list[Optional[dict[str, Any]]]]

# Bounded so that a stream of distinct payloads cannot grow the cache without limit.
_CACHE_SIZE = 1024


class CustomLogitProcessor(ABC):
    """A stateless logits transform; per-request state comes through custom_params."""

    @abstractmethod
    def __call__(
        self, logits: torch.Tensor, custom_param_list: CustomParamList = None
    ) -> torch.Tensor:
        """Return logits [rows, V] transformed row by row (may modify `logits` in place)."""

    @classmethod
    def to_str(cls) -> str:
        """The class (not an instance) as `{"callable": "<hex of dill.dumps(cls)>"}`."""
        return encode_callable(cls)

    @classmethod
    def from_str(cls, s: str) -> CustomLogitProcessor:
        """Load either string form without an allowlist (trusted input only).

        Cached by the exact string: the same string gives the same class, a new instance.
        """
        return _resolve_class(s, None)()


# ----------------------------------------------------------------------------------------
# Registry and loading
# ----------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[CustomLogitProcessor]] = {}


def qualified_name(cls: type) -> str:
    """`module.QualName`, the form the allowlist holds."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register_custom_logit_processor(name: str, cls: type[CustomLogitProcessor]) -> None:
    """Make `cls` loadable as `{"name": name}`. Re-registering the same class is a no-op."""
    if not (isinstance(cls, type) and issubclass(cls, CustomLogitProcessor)):
        raise CustomLogitProcessorError(f"{cls!r} is not a CustomLogitProcessor subclass")
    if inspect.isabstract(cls):
        raise CustomLogitProcessorError(f"cannot register abstract class {qualified_name(cls)!r}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise CustomLogitProcessorError(
            f"name {name!r} is already registered to {qualified_name(existing)!r}"
        )
    _REGISTRY[name] = cls


def load_custom_logit_processor(
    s: str, *, allowlist: Optional[frozenset[str]] = None
) -> CustomLogitProcessor:
    """Instantiate the processor a request names.

    allowlist=None: unrestricted (the operator trusts clients with code). Otherwise only
    classes whose `module.QualName` is in the allowlist load, by name or by callable.
    """
    return _resolve_class(s, None if allowlist is None else frozenset(allowlist))()


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _resolve_class(s: str, allowlist: Optional[frozenset[str]]) -> type[CustomLogitProcessor]:
    kind, value = parse_reference(s)
    if kind == "name":
        cls = _lookup(value)
        check_allowed(qualified_name(cls), allowlist)
        return cls
    cls = _as_processor_class(decode_callable(value, allowlist))
    logger.info("Loaded serialized custom logit processor %s", qualified_name(cls))
    return cls


def _lookup(name: str) -> type[CustomLogitProcessor]:
    cls = _REGISTRY.get(name)
    if cls is None:
        raise CustomLogitProcessorError(
            f"unknown processor name {name!r}; registered: {sorted(_REGISTRY)}"
        )
    return cls


def _as_processor_class(obj: Any) -> type[CustomLogitProcessor]:
    if not (isinstance(obj, type) and issubclass(obj, CustomLogitProcessor)):
        raise CustomLogitProcessorError(
            f"the callable must be a CustomLogitProcessor subclass, got {obj!r}"
        )
    if inspect.isabstract(obj):
        raise CustomLogitProcessorError(f"class {qualified_name(obj)!r} is abstract")
    return obj


# ----------------------------------------------------------------------------------------
# Built-in processors
# ----------------------------------------------------------------------------------------


def _ban_tokens(logits: torch.Tensor, bans: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor:
    """logits[row, token] = -inf for every (row, tokens) entry, in one indexed write.

    Ids outside [0, V) are skipped: rejecting them is request validation's job, and an
    exception here would fail every request in the batch.
    """
    nonempty = [(row, tokens) for row, tokens in bans if len(tokens)]
    if not nonempty:
        return logits
    flat = list(itertools.chain.from_iterable(tokens for _, tokens in nonempty))
    cols = torch.tensor(flat, dtype=torch.int64)  # [T]
    counts = torch.tensor([len(tokens) for _, tokens in nonempty])  # [k]
    rows = torch.repeat_interleave(torch.tensor([row for row, _ in nonempty]), counts)  # [T]
    keep = (cols >= 0) & (cols < logits.shape[-1])
    logits[rows[keep].to(logits.device), cols[keep].to(logits.device)] = float("-inf")
    return logits


def _force_token(logits: torch.Tensor, rows: list[int], token_id: int) -> None:
    """Leave `token_id` as the only candidate in each of `rows`."""
    if rows:
        idx = torch.tensor(rows, device=logits.device)  # [k]
        logits[idx] = float("-inf")
        logits[idx, token_id] = 0.0


class DisallowedTokensLogitsProcessor(CustomLogitProcessor):
    """Bans custom_params["token_ids"] per row (lists may differ; rows without one untouched)."""

    def __call__(
        self, logits: torch.Tensor, custom_param_list: CustomParamList = None
    ) -> torch.Tensor:
        bans = [
            (row, list(params["token_ids"]))
            for row, params in enumerate(custom_param_list or ())
            if params and params.get("token_ids")
        ]
        return _ban_tokens(logits, bans)


def _reverse_find(seq: list[int], value: int) -> Optional[int]:
    """Distance of the last `value` from the end of `seq` (0 = last element), or None."""
    try:
        return operator.indexOf(reversed(seq), value)  # C-speed scan that stops at the hit
    except ValueError:
        return None


class ThinkingBudgetLogitProcessor(CustomLogitProcessor):
    """Caps the tokens inside an open thinking block at custom_params["thinking_budget"].

    Once the budget is spent the row is forced to a newline and then to the end token.
    """

    @property
    @abstractmethod
    def THINKING_START_TOKEN_ID(self) -> int: ...

    @property
    @abstractmethod
    def THINKING_END_TOKEN_ID(self) -> int: ...

    @property
    @abstractmethod
    def NEW_LINE_TOKEN_ID(self) -> int: ...

    def __call__(
        self, logits: torch.Tensor, custom_param_list: CustomParamList = None
    ) -> torch.Tensor:
        force_newline: list[int] = []
        force_end: list[int] = []
        for row, params in enumerate(custom_param_list or ()):
            budget = params.get("thinking_budget") if params else None
            # bool is an int subclass, but JSON true is not a budget.
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
                continue
            req = params.get("__req__")
            if req is None:
                continue
            tokens_after_start = self._tokens_in_open_block(req.origin_input_ids, req.output_ids)
            if tokens_after_start is None or tokens_after_start < budget:
                continue
            if req.output_ids and req.output_ids[-1] == self.NEW_LINE_TOKEN_ID:
                force_end.append(row)
            else:
                force_newline.append(row)
        _force_token(logits, force_newline, self.NEW_LINE_TOKEN_ID)
        _force_token(logits, force_end, self.THINKING_END_TOKEN_ID)
        return logits

    def _tokens_in_open_block(self, prompt: list[int], output: list[int]) -> Optional[int]:
        """Tokens after the START of the open thinking block, or None when no block is open.

        Scans back from the end so an END from an earlier turn does not close a later block.
        """
        offset = 0  # tokens of prompt + output after the segment being scanned
        for seq in (output, prompt):
            start = _reverse_find(seq, self.THINKING_START_TOKEN_ID)
            end = _reverse_find(seq, self.THINKING_END_TOKEN_ID)
            if start is not None and (end is None or start < end):
                return offset + start
            if end is not None:
                return None
            offset += len(seq)
        return None


class Glm4MoeThinkingBudgetLogitProcessor(ThinkingBudgetLogitProcessor):
    THINKING_START_TOKEN_ID = 151350
    THINKING_END_TOKEN_ID = 151351
    NEW_LINE_TOKEN_ID = 198


class Qwen3ThinkingBudgetLogitProcessor(ThinkingBudgetLogitProcessor):
    THINKING_START_TOKEN_ID = 151667
    THINKING_END_TOKEN_ID = 151668
    NEW_LINE_TOKEN_ID = 198


class DeepSeekR1ThinkingBudgetLogitProcessor(ThinkingBudgetLogitProcessor):
    THINKING_START_TOKEN_ID = 128798
    THINKING_END_TOKEN_ID = 128799
    NEW_LINE_TOKEN_ID = 201


class InklingThinkingBudgetLogitProcessor(ThinkingBudgetLogitProcessor):
    THINKING_START_TOKEN_ID = 200008
    THINKING_END_TOKEN_ID = 200010
    NEW_LINE_TOKEN_ID = 198


def _last_tokens(prompt: list[int], output: list[int], k: int) -> list[int]:
    """The last k tokens of prompt + output, without copying the whole prompt."""
    if k <= len(output):
        return output[len(output) - k :]
    return prompt[max(0, len(prompt) - (k - len(output))) :] + output


class DeepseekOCRNoRepeatNGramLogitProcessor(CustomLogitProcessor):
    """Bans tokens that would repeat an n-gram seen in the last `window_size` tokens.

    custom_params: ngram_size, window_size (> 0), optional whitelist_token_ids never banned.
    Example: sequence [1, 2, 3, 1, 2] with ngram_size 2 bans 3.
    """

    def __call__(
        self, logits: torch.Tensor, custom_param_list: CustomParamList = None
    ) -> torch.Tensor:
        bans = [
            (row, self._banned(params))
            for row, params in enumerate(custom_param_list or ())
            if params and params.get("__req__") is not None
        ]
        return _ban_tokens(logits, bans)

    @staticmethod
    def _banned(params: dict[str, Any]) -> list[int]:
        try:
            n = int(params.get("ngram_size"))
            window = int(params.get("window_size"))
        except (TypeError, ValueError):
            return []
        if n <= 0 or window <= 0:
            return []
        req = params["__req__"]
        length = len(req.origin_input_ids) + len(req.output_ids)
        start = max(0, length - window)
        if length < n or length - n + 1 <= start:
            return []
        # n-grams starting in [start, length - n] all lie inside the last length - start tokens.
        tail = _last_tokens(req.origin_input_ids, req.output_ids, length - start)
        prefix = tail[len(tail) - n + 1 :]  # the last n - 1 tokens; empty for n = 1
        banned = {
            tail[i + n - 1]
            for i in range(len(tail) - n + 1)
            if tail[i : i + n - 1] == prefix
        }
        return list(banned - _whitelist(params.get("whitelist_token_ids")))


def _whitelist(ids: Any) -> set[int]:
    try:
        return {int(t) for t in ids or ()}
    except (TypeError, ValueError):
        return set()


for _builtin in (
    DisallowedTokensLogitsProcessor,
    Glm4MoeThinkingBudgetLogitProcessor,
    Qwen3ThinkingBudgetLogitProcessor,
    DeepSeekR1ThinkingBudgetLogitProcessor,
    InklingThinkingBudgetLogitProcessor,
    DeepseekOCRNoRepeatNGramLogitProcessor,
):
    register_custom_logit_processor(_builtin.__name__, _builtin)
