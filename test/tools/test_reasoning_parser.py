"""--reasoning-parser qwen3 and deepseek-r1: the think section split from the answer, whole and
streamed in pieces (with stream_reasoning on and off) alike."""

from __future__ import annotations

import pytest

from sglang.srt.parser.reasoning_parser import REASONING_PARSERS, ReasoningParser, prompt_opens_reasoning, split_reasoning

CASES = [
    # (parser, prompt opened the section, output, reasoning, content)
    ("qwen3", False, "<think>\nWhy? Because.</think>\n\nThe sky is blue.", "\nWhy? Because.", "\n\nThe sky is blue."),
    ("qwen3", False, "No thinking here, <think> mid-text stays.", "", "No thinking here, <think> mid-text stays."),
    ("qwen3", True, "Step one.</think>Answer.", "Step one.", "Answer."),
    ("qwen3", False, "<think>cut off before the end </thi", "cut off before the end </thi", ""),
    ("deepseek-r1", False, "Thinking without an opening tag.</think>Answer.", "Thinking without an opening tag.", "Answer."),
    ("deepseek-r1", False, "<think>With one.</think>Answer.", "With one.", "Answer."),
    ("deepseek-r1", False, "Never ends", "Never ends", ""),
]


@pytest.mark.parametrize("name, opened, text, reasoning, content", CASES)
def test_whole_output(name: str, opened: bool, text: str, reasoning: str, content: str) -> None:
    assert split_reasoning(name, text, opened) == (reasoning, content)


@pytest.mark.parametrize("stream_reasoning", [True, False])
@pytest.mark.parametrize("name, opened, text, reasoning, content", CASES)
def test_streamed_pieces_add_up(name, opened, text, reasoning, content, stream_reasoning) -> None:
    for size in (1, 2, 3, 7):
        parser = ReasoningParser(name, opened, stream_reasoning)
        parts = [parser.feed(text[i : i + size]) for i in range(0, len(text), size)] + [parser.finish()]
        assert "".join(p.reasoning for p in parts) == reasoning
        assert "".join(p.content for p in parts) == content
        if not stream_reasoning:  # the reasoning arrives in one piece
            assert sum(bool(p.reasoning) for p in parts) <= 1


def test_reasoning_streams_before_the_section_ends() -> None:
    parser = ReasoningParser("qwen3")
    assert parser.feed("<think>abc</th").reasoning == "abc"
    delta = parser.feed("ink>Hi")
    assert (delta.reasoning, delta.content) == ("", "Hi")


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def test_parser_names() -> None:
    assert set(REASONING_PARSERS) == {"qwen3", "deepseek-r1"}
