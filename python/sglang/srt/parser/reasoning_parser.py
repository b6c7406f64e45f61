"""The reasoning section of a model's output, split from the answer (`--reasoning-parser`).

qwen3: the output may open with `<think>` and the section ends at `</think>`; when the prompt
itself opened the section (a template that writes `<think>` after the assistant header) the
output starts inside it. deepseek-r1: the output always starts inside the section (its template
opens it), with or without a repeated `<think>`. A section that never ends is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"

# --reasoning-parser names -> whether the output starts inside the section whatever the prompt.
REASONING_PARSERS: dict[str, bool] = {"qwen3": False, "deepseek-r1": True}


@dataclass
class ReasoningDelta:
    reasoning: str
    content: str


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open think section."""
    opened = prompt.rfind(THINK_START)
    return opened != -1 and prompt.find(THINK_END, opened) == -1 and not prompt[opened + len(THINK_START) :].strip()


class ReasoningParser:
    """Feeds one choice's text pieces in order; each feed returns the reasoning and the content
    that are new. With stream_reasoning false the reasoning comes in one piece, when the section
    ends (or at finish)."""

    def __init__(self, name: str, prompt_opened: bool = False, stream_reasoning: bool = True) -> None:
        self.forced = REASONING_PARSERS[name] or prompt_opened
        self.stream_reasoning = stream_reasoning
        self.buffer = ""
        self.state = "reasoning" if self.forced else "start"  # start | reasoning | content
        self.held_reasoning = ""
        self.opening = True  # nothing of the section taken yet: an opening tag is skipped

    def feed(self, piece: str) -> ReasoningDelta:
        self.buffer += piece
        reasoning, content = "", ""
        if self.state == "start":
            self._leave_start()
        if self.state == "reasoning":
            reasoning = self._take_reasoning()
        if self.state == "content":
            content, self.buffer = self.buffer, ""
        return self._out(reasoning, content)

    def finish(self) -> ReasoningDelta:
        """The held text once the output is complete."""
        rest, self.buffer = self.buffer, ""
        if self.state == "reasoning":
            return self._out(rest, "", ended=True)
        return ReasoningDelta("", rest)

    def _leave_start(self) -> None:
        # Before any text: the output opens the section or it has none.
        stripped = self.buffer.lstrip()
        if stripped.startswith(THINK_START):
            self.state = "reasoning"
        elif not THINK_START.startswith(stripped):
            self.state = "content"

    def _take_reasoning(self) -> str:
        """Reasoning text that is certain so far; switches to content at the section's end."""
        if self.opening:
            if self.buffer.lstrip().startswith(THINK_START):
                self.buffer = self.buffer.lstrip()[len(THINK_START) :]
            elif THINK_START.startswith(self.buffer.lstrip()):
                return ""  # the opening tag may be arriving
            self.opening = False
        end = self.buffer.find(THINK_END)
        if end != -1:
            reasoning, self.buffer = self.buffer[:end], self.buffer[end + len(THINK_END) :]
            self.state = "content"
            return reasoning
        keep = _partial_suffix(self.buffer, THINK_END)
        reasoning, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
        return reasoning

    def _out(self, reasoning: str, content: str, ended: bool = False) -> ReasoningDelta:
        if self.stream_reasoning:
            return ReasoningDelta(reasoning, content)
        self.held_reasoning += reasoning
        if self.state == "content" or ended:
            reasoning, self.held_reasoning = self.held_reasoning, ""
            return ReasoningDelta(reasoning, content)
        return ReasoningDelta("", content)


def _partial_suffix(text: str, marker: str) -> int:
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def split_reasoning(name: str, text: str, prompt_opened: bool = False) -> tuple[str, str]:
    """A whole output's (reasoning, content)."""
    parser = ReasoningParser(name, prompt_opened)
    parts = [parser.feed(text), parser.finish()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)
