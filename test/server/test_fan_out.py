"""The one fan-out of n > 1 and the one merge of result streams (tokenizer_manager)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sglang.srt.managers.fan_out import child_rids, child_sampling_params, merge_indexed

# derive_child_seed(1234, i) for i < 3: the seeds /generate and /v1 give the children of seed 1234.
SEED_1234_CHILDREN = [-4968325692281840421, -7509856599009106652, 3728693401281897946]


def test_children_get_n_1_and_the_derived_seeds() -> None:
    children = child_sampling_params({"sampling_seed": 1234, "n": 3, "temperature": 0.5}, 3)
    assert [c["sampling_seed"] for c in children] == SEED_1234_CHILDREN
    assert all(c["n"] == 1 and c["temperature"] == 0.5 for c in children)
    assert child_rids("r", 3) == ["r_0", "r_1", "r_2"]


def test_n_1_keeps_the_request_as_it_is() -> None:
    params = {"sampling_seed": 1234, "n": 1}
    assert child_sampling_params(params, 1) == [params] and child_rids("r", 1) == ["r"]
    unseeded = child_sampling_params({"n": 2}, 2)
    assert [c.get("sampling_seed") for c in unseeded] == [None, None]


async def _stream(name: str, count: int, indexed: bool, fail: bool = False,
                  closed: list[str] | None = None) -> AsyncIterator[dict[str, Any]]:
    try:
        for i in range(count):
            await asyncio.sleep(0)
            if fail:
                raise ValueError(f"{name} failed")
            yield {"name": name, **({"index": i} if indexed else {})}
        if closed is not None:  # runs until closed
            await asyncio.Event().wait()
    finally:
        if closed is not None:
            closed.append(name)


def _collect(streams: list, sizes: list[int]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return [out async for out in merge_indexed(streams, sizes)]

    return asyncio.run(run())


def test_merge_tags_each_result_with_its_child_position() -> None:
    outs = _collect([_stream("a", 1, False), _stream("b", 2, True), _stream("c", 1, False)], [1, 2, 1])
    assert sorted((o["name"], o["index"]) for o in outs) == [("a", 0), ("b", 1), ("b", 2), ("c", 3)]
    (single,) = _collect([_stream("a", 1, False)], [1])
    assert single["index"] == 0


def test_merge_raises_the_first_error_and_closes_the_other_streams() -> None:
    closed: list[str] = []
    with pytest.raises(ValueError, match="b failed"):
        _collect([_stream("a", 1, False, closed=closed), _stream("b", 1, False, fail=True)], [1, 1])
    assert closed == ["a"]
