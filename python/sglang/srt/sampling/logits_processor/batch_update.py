"""BatchUpdateBuilder: the BatchUpdate that takes the rows a processor knows to the rows sampled now.

The scheduler changes a batch through ScheduleBatch filter/merge, and SamplingBatchInfo keeps its
row list in the same order as the batch's requests. Rather than record each change, the builder
compares the row list the processors saw at their last step with the one being sampled (rows are
matched by identity), so a step always describes exactly the batch it samples, however many
filters and merges happened in between, and overlap or not.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from sglang.srt.sampling.logits_processor.interface import BatchUpdate, MoveDirectionality


class BatchUpdateBuilder:
    @staticmethod
    def full(rows: Sequence[Any]) -> BatchUpdate:
        """Every row added (a processor that starts serving a batch mid-way)."""
        return BatchUpdate(len(rows), removed=[], added=[_added(i, row) for i, row in enumerate(rows)], moved=[])

    @staticmethod
    def build(previous: Sequence[Any], current: Sequence[Any]) -> Optional[BatchUpdate]:
        """removed -> added -> moved from `previous` to `current`; None when they are the same rows."""
        if previous is current or (len(previous) == len(current) and all(a is b for a, b in zip(previous, current))):
            return None
        old_index = {id(row): i for i, row in enumerate(previous)}
        kept = {id(row) for row in current if id(row) in old_index}
        removed = [i for i, row in enumerate(previous) if id(row) not in kept]
        slot_of = {id(row): old_index[id(row)] for row in current if id(row) in kept}  # row -> its slot now
        occupied = set(slot_of.values())
        # A new row goes straight to its final index when that slot is free, else to the lowest free slot.
        fresh = [(j, row) for j, row in enumerate(current) if id(row) not in kept]
        for j, row in fresh:
            if j not in occupied:
                slot_of[id(row)] = j
                occupied.add(j)
        free = (s for s in range(len(previous) + len(current)) if s not in occupied)
        for j, row in fresh:
            if id(row) not in slot_of:
                slot_of[id(row)] = next(free)
                occupied.add(slot_of[id(row)])
        added = [_added(slot_of[id(row)], row) for _, row in fresh]
        return BatchUpdate(len(current), removed=removed, added=added, moved=_moves(current, slot_of))


def _moves(current: Sequence[Any], slot_of: dict[int, int]) -> list[tuple[int, int, MoveDirectionality]]:
    """Moves (one at a time, in order) that put row j of `current` at slot j."""
    holder = {slot: key for key, slot in slot_of.items()}  # slot -> the row key in it
    moved = []
    for j, row in enumerate(current):
        s = slot_of[id(row)]
        if s == j:
            continue
        other = holder.get(j)
        moved.append((s, j, MoveDirectionality.UNIDIRECTIONAL if other is None else MoveDirectionality.SWAP))
        holder[j] = id(row)
        slot_of[id(row)] = j
        if other is None:
            del holder[s]
        else:
            holder[s] = other
            slot_of[other] = s
    return moved


def _added(index: int, row: Any) -> tuple:
    return (index, row.params, row.prompt_ids, row.output_ids)
