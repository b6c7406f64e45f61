"""n > 1 fan-out and the merge of several requests' result streams.

A request with n > 1 becomes n scheduler requests (its children, fan_out); the streams of
several requests come back as one (merge_indexed). ManyRequests gives the tokenizer manager
generate_many / run_many / collect on top of them: /generate, the OpenAI routes and the
offline Engine all go through these.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import msgspec

from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput

_MASK64 = (1 << 64) - 1


def derive_child_seed(seed: int, index: int) -> int:
    """Seed of child `index` of a seeded n > 1 request: a splitmix64 mix, signed 64-bit.

    The mix is a bijection of seed + (index + 1) * golden, so children of one seed never collide
    and the same (seed, index) gives the same child seed on every call and every server.
    """
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


@dataclass
class PreparedRequest:
    """A validated request: one scheduler message per child (n of them)."""

    rid: str
    stream: bool
    children: list[TokenizedGenerateReqInput]
    return_text_in_logprobs: bool
    obj: Optional[GenerateReqInput] = None  # the request as received, for --log-requests


def child_rids(rid: str, n: int) -> list[str]:
    """The rids of a request's n children: the request's own for n = 1, else `{rid}_{i}`."""
    return [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]


def child_sampling_params(params: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The sampling params of a request's n children: n = 1 each and, when seeded, distinct
    derived seeds (child i gets derive_child_seed(seed, i)); n = 1 keeps the request's own."""
    if n == 1:
        return [params]
    seed = params.get("sampling_seed")
    children = []
    for i in range(n):
        child = {**params, "n": 1}
        if seed is not None:
            child["sampling_seed"] = derive_child_seed(seed, i)
        children.append(child)
    return children


def fan_out(base: TokenizedGenerateReqInput, n: int) -> list[TokenizedGenerateReqInput]:
    """The scheduler messages of a request's n children."""
    if n == 1:
        return [base]
    return [
        msgspec.structs.replace(base, rid=rid, sampling_params=params)
        for rid, params in zip(child_rids(base.rid, n), child_sampling_params(base.sampling_params, n))
    ]


async def merge_indexed(
    streams: Sequence[AsyncIterator[dict[str, Any]]], sizes: Sequence[int]
) -> AsyncIterator[dict[str, Any]]:
    """Several requests' result streams as one, in arrival order; every dict gets "index" = its
    child's position among all children (stream k has sizes[k] children, in order).

    The first exception of any stream is raised here; leaving early (error, client gone) closes
    the streams still running, which aborts their requests.
    """
    offsets = list(itertools.accumulate(sizes, initial=0))
    if len(streams) == 1:
        # The common case: read it here, without a pump task and a queue between it and the caller.
        async with contextlib.aclosing(streams[0]) as results:
            async for out in results:
                out["index"] = out.get("index", 0)
                yield out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, stream: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async with contextlib.aclosing(stream) as results:
                async for out in results:
                    out["index"] = offsets[k] + out.get("index", 0)
                    queue.put_nowait(out)
        except Exception as err:  # handed to the consumer, which raises it
            queue.put_nowait(err)
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(k, stream)) for k, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:  # cancelling a pump aborts its unfinished requests
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ManyRequests:
    """Several requests as one stream or one list; the class using it provides prepare_request
    (validate and fan out one request) and run_prepared (send one, yield its results)."""

    def prepare_request(self, obj: GenerateReqInput, grammar_checked: bool = False) -> PreparedRequest:
        raise NotImplementedError

    def run_prepared(self, prepared: PreparedRequest) -> AsyncIterator[dict[str, Any]]:
        raise NotImplementedError

    async def generate_many(
        self, objs: Sequence[GenerateReqInput], grammar_checked: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        """Several requests (each fanned out into its n children) as one stream of result dicts,
        each with "index" = its child's position: the requests in order, each one's children
        in order. A ValueError for any invalid request is raised on the first iteration, before
        anything is sent. grammar_checked: as for prepare_request."""
        prepared = [self.prepare_request(obj, grammar_checked) for obj in objs]
        async with contextlib.aclosing(self.run_many(prepared)) as results:
            async for out in results:
                yield out

    def run_many(self, prepared: Sequence[PreparedRequest]) -> AsyncIterator[dict[str, Any]]:
        """Send prepared requests; their results merged as generate_many yields them."""
        return merge_indexed([self.run_prepared(p) for p in prepared], [len(p.children) for p in prepared])

    async def collect(self, prepared: Sequence[PreparedRequest]) -> list[dict[str, Any]]:
        """The final result of every child of the prepared requests, in child order, without "index"."""
        async with contextlib.aclosing(self.run_many(prepared)) as results:
            outs = [out async for out in results]
        outs.sort(key=lambda out: out["index"])
        for out in outs:
            del out["index"]
        return outs
