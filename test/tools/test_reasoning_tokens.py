"""meta_info.reasoning_tokens: the output tokens up to and including the think-end marker."""

from __future__ import annotations

from sglang.srt.managers.reasoning_tokens import count_reasoning_tokens, think_end_ids


def test_counts_through_the_first_end_marker() -> None:
    assert count_reasoning_tokens([5, 6, 7, 8, 9, 7, 8], [7, 8]) == 4
    assert count_reasoning_tokens([7, 8, 1], [7, 8]) == 2


def test_an_open_section_is_all_reasoning() -> None:
    assert count_reasoning_tokens([5, 6, 7], [7, 8]) == 3
    assert count_reasoning_tokens([], [7, 8]) == 0


def test_nothing_is_counted_without_a_marker() -> None:
    assert count_reasoning_tokens([5, 6, 7], None) == 0


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_marker_ids_need_a_parser_and_a_tokenizer() -> None:
    assert think_end_ids(_Tokenizer(), "qwen3") == [ord(c) for c in "</think>"]
    assert think_end_ids(_Tokenizer(), None) is None
    assert think_end_ids(None, "deepseek-r1") is None
