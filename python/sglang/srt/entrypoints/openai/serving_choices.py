"""Per-choice progress: the engine's native items of each choice turned into what is new, the
last item of every choice collected, and the usage over all of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from fastapi import Request
from pydantic import BaseModel

from sglang.srt.entrypoints.openai.protocol import CompletionTokensDetails, PromptTokensDetails, UsageInfo

# A native logprob entry: [logprob, token_id, text_or_None].
LogprobEntry = list[Any]
TopEntries = Optional[list[LogprobEntry]]
LogprobFormat = Callable[[list[LogprobEntry], list[TopEntries], int], BaseModel]
# The tokenizer manager's merged native items, each with "index" = its choice.
Events = AsyncIterator[dict[str, Any]]


@dataclass
class Piece:
    """What one native item adds to one choice."""

    index: int
    text: str
    logprobs: Optional[BaseModel]
    has_tokens: bool
    finish_reason: Optional[str]
    matched_stop: Union[int, str, None]
    # Chat only: what the reasoning and tool-call parsers took out of the text.
    reasoning: str = ""
    tool_calls: list[Any] = field(default_factory=list)
    prompt_token_ids: Optional[list[int]] = None  # chat's return_prompt_token_ids

    def is_empty(self) -> bool:
        return not (self.text or self.reasoning or self.tool_calls or self.has_tokens) and self.finish_reason is None


class ChoiceTracker:
    """Turns one choice's cumulative native items into pieces that are new since the last one."""

    def __init__(
        self, index: int, logprob_format: Optional[LogprobFormat], echo: Optional[str] = None
    ) -> None:
        self.index = index
        self.logprob_format = logprob_format
        self.echo = echo  # prompt text still to emit, ahead of the first generated text
        self.text_len = 0
        self.logprob_len = 0
        self.offset = 0  # characters emitted so far, for completion text_offset

    def step(self, item: dict[str, Any]) -> Piece:
        meta = item["meta_info"]
        text = item["text"][self.text_len :]
        self.text_len = max(self.text_len, len(item["text"]))
        entries, tops = self._new_logprobs(meta)
        if self.echo is not None:
            text = self.echo + text
            entries, tops = _input_logprobs(meta, entries, tops)
            self.echo = None
        logprobs = self.logprob_format(entries, tops, self.offset) if self.logprob_format else None
        self.offset += len(text)
        finish = meta.get("finish_reason") or {}
        return Piece(
            self.index, text, logprobs, bool(entries), finish.get("type"), finish.get("matched"),
            prompt_token_ids=item.get("prompt_token_ids"),
        )

    def _new_logprobs(self, meta: Mapping[str, Any]) -> tuple[list[LogprobEntry], list[TopEntries]]:
        entries = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        start, self.logprob_len = self.logprob_len, len(entries)
        return entries[start:], _pad(tops[start : len(entries)], len(entries) - start)


def _input_logprobs(
    meta: Mapping[str, Any], entries: list[LogprobEntry], tops: list[TopEntries]
) -> tuple[list[LogprobEntry], list[TopEntries]]:
    """Prompt logprobs (echo) ahead of the output ones."""
    prompt = meta.get("input_token_logprobs") or []
    prompt_tops = _pad(meta.get("input_top_logprobs") or [], len(prompt))
    return prompt + entries, prompt_tops + tops


def _pad(tops: list[TopEntries], length: int) -> list[TopEntries]:
    return list(tops[:length]) + [None] * (length - len(tops))


async def _collect(events: Events, count: int) -> list[dict[str, Any]]:
    """The last (complete) item of every choice."""
    finals: dict[int, dict[str, Any]] = {}
    async for item in events:
        finals[item["index"]] = item
    if len(finals) != count:
        raise RuntimeError("the engine ended a request without output")
    return [finals[i] for i in range(count)]


async def collect_unless_disconnected(
    raw_request: Request, events: Events, count: int
) -> Optional[list[dict[str, Any]]]:
    """The last item of every choice, or None when the client left first; raises what the engine
    raised. Nothing else notices a client that leaves a non-stream request, so it is watched here
    and the engine streams are closed at once (aborting their requests)."""
    work = asyncio.ensure_future(_collect(events, count))
    watch = asyncio.ensure_future(_until_disconnected(raw_request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        work.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    return None if work.cancelled() else work.result()


async def _until_disconnected(raw_request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the client's disconnect.
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass


async def prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def usage_of(finals: list[dict[str, Any]], n: int) -> UsageInfo:
    """Usage over all choices; a prompt shared by its n choices is counted once."""
    metas = [item["meta_info"] for item in finals]
    groups = [metas[i : i + n] for i in range(0, len(metas), n)]
    prompt = sum(group[0]["prompt_tokens"] for group in groups)
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(max(m.get("cached_tokens", 0) for m in group) for group in groups)
    reasoning = sum(m.get("reasoning_tokens", 0) for m in metas)
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        reasoning_tokens=reasoning,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning) if reasoning else None,
    )
