"""The running (decode) batch and the prefilled batches waiting to join it.

The requests whose prompt a prefill step completes sample in a ScheduleBatch of their own. Once
that step's result is read the batch waits in `to_merge`; before the next step is built it joins
the running batch, and the finished requests leave it. Both change the sampling state the
in-flight step still reads, so they wait for that step's device work first."""

from __future__ import annotations

from typing import Callable, Optional

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch


class RunningBatch:
    def __init__(self) -> None:
        self.batch: Optional[ScheduleBatch] = None  # the requests the next decode step runs
        self.to_merge: list[ScheduleBatch] = []  # prefilled, joining before the next step

    def empty(self) -> bool:
        return self.batch is None and not self.to_merge

    def reqs(self) -> list[Req]:
        """The running requests, then those waiting to join."""
        reqs = list(self.batch.reqs) if self.batch is not None else []
        return reqs + [r for batch in self.to_merge for r in batch.reqs]

    def update(self, wait_in_flight: Callable[[], None]) -> list[Req]:
        """Merge the waiting batches, drop the finished requests and return them (to release)."""
        finished = self.batch is not None and any(r.finished() for r in self.batch.reqs)
        if not self.to_merge and not finished:
            return []
        wait_in_flight()
        for batch in self.to_merge:
            self._merge(batch)
        self.to_merge = []
        return self._drop_finished()

    def _merge(self, batch: ScheduleBatch) -> None:
        if self.batch is None:
            self.batch = batch
        else:
            self.batch.merge(batch)

    def remove(self, reqs: list[Req]) -> None:
        """Take `reqs` out of the running batch (priority preemption retracts them). Call it after
        update(), with no step in flight: nothing is waiting to merge, nothing reads the batch."""
        gone = {id(r) for r in reqs}
        self._keep_only(lambda r: id(r) not in gone)

    def _drop_finished(self) -> list[Req]:
        if self.batch is None:
            return []
        finished = [r for r in self.batch.reqs if r.finished()]
        if finished:
            self._keep_only(lambda r: not r.finished())
        return finished

    def _keep_only(self, keep_req: Callable[[Req], bool]) -> None:
        if self.batch is None:
            return
        keep = [i for i, r in enumerate(self.batch.reqs) if keep_req(r)]
        if not keep:
            self.batch = None
        elif len(keep) < len(self.batch.reqs):
            self.batch.reqs = [self.batch.reqs[i] for i in keep]
            self.batch.sampling_info.filter_batch(keep)
