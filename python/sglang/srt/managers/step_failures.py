"""A failing scheduler step fails its requests, not the server: the failure limit and the test hook.

A step whose device work (forward, sampling, processors) or result processing raises is failed:
its requests end with an abort naming the cause and the scheduler goes on. A server whose steps
keep failing is broken, not unlucky: StepFailureLimit ends it once --step-failure-limit steps
failed within the last --step-failure-window steps. The window counts steps, not seconds, so
that every TP rank, seeing the same steps, takes the same decision.
"""

from __future__ import annotations

import os
import random
from collections import deque
from typing import Optional

# Test hook, off unless set: "PROB" or "PROB:RANK". After a step's device work, the step fails
# with probability PROB (drawn from the step index, so the same steps on every run and rank) on
# every TP rank, or on rank RANK only (the other ranks must still fail it alike).
STEP_FAULT_ENV = "SGLANG_TEST_STEP_FAULT"
INJECTED_FAULT = "injected step fault (SGLANG_TEST_STEP_FAULT)"


class StepError(RuntimeError):
    """Raised by the fault hook; any exception fails a step the same way."""


class StepFaultHook:
    def __init__(self, spec: Optional[str], tp_rank: int) -> None:
        self.prob, self.active = 0.0, False
        if spec:
            prob, _, rank = spec.partition(":")
            self.prob = float(prob)
            self.active = not rank or int(rank) == tp_rank

    @classmethod
    def from_env(cls, tp_rank: int) -> "StepFaultHook":
        return cls(os.environ.get(STEP_FAULT_ENV), tp_rank)

    def check(self, step_index: int) -> None:
        if self.active and random.Random(f"step-fault:{step_index}").random() < self.prob:
            raise StepError(f"{INJECTED_FAULT} at step {step_index}")


class StepFailureLimit:
    """Counts failed steps; too many within the window is fatal."""

    def __init__(self, limit: int, window: int) -> None:
        self.limit, self.window = limit, window
        self.failed: deque[int] = deque()  # step indices of the recent failures
        self.total = 0

    def record(self, step_index: int, message: str) -> None:
        """Raise RuntimeError (ending the scheduler) when this failure reaches the limit."""
        self.total += 1
        self.failed.append(step_index)
        while self.failed and self.failed[0] <= step_index - self.window:
            self.failed.popleft()
        if len(self.failed) >= self.limit:
            raise RuntimeError(
                f"{len(self.failed)} scheduler steps failed within the last {self.window} steps "
                f"(--step-failure-limit {self.limit}, --step-failure-window {self.window}); the server stops "
                f"rather than fail every request. Last failure: {message}"
            )
