"""thinking_token_budget (vLLM's name): at most that many tokens inside the think section, then the
end-of-think token sequence is forced one token per step (every other token -inf).

The section is delimited by the start and end markers (`--thinking-markers`, default `<think>`
`</think>`), tokenized by the server's tokenizer (one token each for Qwen3-style tokenizers,
several otherwise: both work). A prompt that ends inside a think section (a chat template that
opens `<think>`) counts its tokens after the start marker, as vLLM does.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor.row_state import RowState, RowStateProcessor, fill_at, to_device


@functools.lru_cache(maxsize=4)
def _tokenized_markers(tokenizer_path: str, trust_remote_code: bool, start: str, end: str) -> tuple[list[int], list[int]]:
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(tokenizer_path, trust_remote_code)
    return tokenizer.encode(start, add_special_tokens=False), tokenizer.encode(end, add_special_tokens=False)


def think_markers(server_args: Any) -> Optional[tuple[list[int], list[int]]]:
    """(start ids, end ids) of the think markers; None without a tokenizer."""
    if server_args.skip_tokenizer_init:
        return None
    start, end = server_args.thinking_markers
    return _tokenized_markers(server_args.tokenizer_path, server_args.trust_remote_code, start, end)


def _ends_with(tokens: Any, marker: list[int], at: int) -> bool:
    """Whether tokens[: at + 1] ends with `marker` (an empty marker always matches)."""
    n = len(marker)
    return at + 1 >= n and all(tokens[at - n + 1 + k] == marker[k] for k in range(n))


class _Thinking(RowState):
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], budget: int, start: list[int], end: list[int]) -> None:
        super().__init__(prompt_ids, output_ids)
        self.budget, self.start, self.end = budget, start, end
        self.inside = False
        self.count = 0  # tokens of the open think section
        self.scanned = 0  # tokens of prompt + output already scanned
        self._scan(_Joined(prompt_ids, output_ids))

    def forced_token(self) -> Optional[int]:
        """The end-marker token this row must take now, or None."""
        seq = _Joined(self.prompt_ids, self.output_ids)
        self._scan(seq)
        if not self.inside or self.count < self.budget:
            return None
        # Continue the end marker where the sequence already holds a part of it.
        done = max(k for k in range(len(self.end)) if _ends_with(seq, self.end[:k], len(seq) - 1))
        return self.end[done]

    def _scan(self, seq: "_Joined") -> None:
        for at in range(self.scanned, len(seq)):
            if _ends_with(seq, self.start, at):
                self.inside, self.count = True, 0
            elif _ends_with(seq, self.end, at):
                self.inside = False
            elif self.inside:
                self.count += 1
        self.scanned = len(seq)


class _Joined:
    """prompt + output read by position, without copying either."""

    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        self.prompt_ids, self.output_ids = prompt_ids, output_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def __getitem__(self, position: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.output_ids[position - n]


class ThinkingBudgetLogitsProcessor(RowStateProcessor):
    param = "thinking_token_budget"

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(server_args, device, is_pin_memory)
        markers = think_markers(server_args)
        if markers is None:
            raise ValueError("thinking_token_budget needs the tokenizer (the server runs with --skip-tokenizer-init)")
        self.start_ids, self.end_ids = markers

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> _Thinking:
        return _Thinking(prompt_ids, output_ids, params.thinking_token_budget, self.start_ids, self.end_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows, tokens = [], []
        for row, state in self.states.items():
            token = state.forced_token()
            if token is not None:
                rows.append(row)
                tokens.append(token)
        if rows:
            logits.index_fill_(0, to_device(rows, logits.device), float("-inf"))
            fill_at(logits, rows, tokens, 0.0)
        return logits
