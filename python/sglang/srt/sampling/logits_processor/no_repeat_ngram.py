"""no_repeat_ngram_size = n (Hugging Face semantics): a token is -inf when it would complete an
n-gram that already occurs in prompt + output; n = 1 bans every token seen.

Each row indexes its n-grams incrementally ((n-1)-gram -> tokens that followed it), so a step
costs one lookup per row, not a scan of the sequence.
"""

from __future__ import annotations

from typing import Any, Sequence

from sglang.srt.sampling.logits_processor.row_state import BanningProcessor, RowState


class _NGrams(RowState):
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], n: int) -> None:
        super().__init__(prompt_ids, output_ids)
        self.n = n
        self.following: dict[tuple[int, ...], set[int]] = {}
        self.indexed = 0  # tokens of prompt + output whose n-gram (ending there) is indexed

    def token(self, position: int) -> int:
        prompt_len = len(self.prompt_ids)
        return self.prompt_ids[position] if position < prompt_len else self.output_ids[position - prompt_len]

    def banned(self) -> set[int]:
        length = len(self.prompt_ids) + len(self.output_ids)
        n = self.n
        for end in range(max(self.indexed, n - 1), length):
            key = tuple(self.token(p) for p in range(end - n + 1, end))
            self.following.setdefault(key, set()).add(self.token(end))
        self.indexed = length
        last = tuple(self.token(p) for p in range(length - n + 1, length)) if length >= n - 1 else None
        return self.following.get(last, set()) if last is not None else set()


class NoRepeatNGramLogitsProcessor(BanningProcessor):
    param = "no_repeat_ngram_size"

    @classmethod
    def acts_on(cls, params: Any) -> bool:
        return bool(getattr(params, cls.param, 0))

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> _NGrams:
        return _NGrams(prompt_ids, output_ids, params.no_repeat_ngram_size)
