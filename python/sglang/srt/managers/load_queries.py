"""Load queries of a tokenizer manager: each /get_load-style query goes to every --dp-size
replica, and its answer is their loads summed once all have replied."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from sglang.srt.managers.io_struct import SchedulerLoad, sum_loads


class LoadQueries:
    def __init__(self, dp_size: int) -> None:
        self.dp_size = dp_size
        self._ids = itertools.count()
        self._waiters: dict[int, asyncio.Future] = {}
        self._replies: dict[int, list[SchedulerLoad]] = {}  # replicas' answers so far, per query

    async def ask(self, send: Callable[[int], None], timeout: float) -> SchedulerLoad:
        """send(query id) the query; the summed load, or TimeoutError when not every replica
        answers within `timeout` seconds."""
        req_id = next(self._ids)
        waiter = self._waiters[req_id] = asyncio.get_running_loop().create_future()
        self._replies[req_id] = []
        try:
            send(req_id)
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.pop(req_id, None)
            self._replies.pop(req_id, None)

    def on_reply(self, load: SchedulerLoad) -> None:
        waiter, replies = self._waiters.get(load.req_id), self._replies.get(load.req_id)
        if waiter is None or waiter.done() or replies is None:
            return
        replies.append(load)
        if len(replies) == self.dp_size:
            waiter.set_result(sum_loads(replies))
