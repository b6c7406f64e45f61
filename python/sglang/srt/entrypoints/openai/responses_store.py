"""Stored /v1/responses responses (store defaults to true): they live in this process's memory,
the most recent MAX_STORED_RESPONSES, the oldest evicted first, lost on restart."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.entrypoints.openai.protocol import ResponsesResponse

MAX_STORED_RESPONSES = 1024

Message = dict[str, Any]


@dataclass
class StoredResponse:
    response: ResponsesResponse
    # The conversation that produced it, without instructions (OpenAI does not carry those over
    # to a follow-up), ending with its output once it has finished.
    history: list[Message]


class ResponseStore:
    """The most recent `capacity` responses; putting one again makes it the most recent."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> Optional[StoredResponse]:
        return self._items.get(response_id)

    def put(self, stored: StoredResponse) -> None:
        self._items[stored.response.id] = stored
        self._items.move_to_end(stored.response.id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def pop(self, response_id: str) -> Optional[StoredResponse]:
        return self._items.pop(response_id, None)

    def __len__(self) -> int:
        return len(self._items)
