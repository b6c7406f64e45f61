"""bad_words: a word's last token is -inf whenever the output ends with the rest of the word.

Each word is tokenized with and without a leading space (SamplingParams.normalize), at most
MAX_BAD_WORD_SEQUENCES sequences per request; a one-token word is banned at every step.
"""

from __future__ import annotations

from typing import Any, Sequence

from sglang.srt.sampling.logits_processor.row_state import BanningProcessor, RowState


class _Words(RowState):
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], sequences: list[list[int]]) -> None:
        super().__init__(prompt_ids, output_ids)
        self.always = sorted({seq[0] for seq in sequences if len(seq) == 1})
        # prefix length -> {prefix: last tokens}: one lookup per distinct length and step.
        self.by_length: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for seq in sequences:
            if len(seq) > 1:
                self.by_length.setdefault(len(seq) - 1, {}).setdefault(tuple(seq[:-1]), []).append(seq[-1])

    def banned(self) -> set[int]:
        banned = set(self.always)
        output = self.output_ids
        for n, prefixes in self.by_length.items():
            if len(output) >= n:
                banned.update(prefixes.get(tuple(output[len(output) - n :]), ()))
        return banned


class BadWordsLogitsProcessor(BanningProcessor):
    param = "bad_words_token_ids"

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> _Words:
        return _Words(prompt_ids, output_ids, params.bad_words_token_ids)
