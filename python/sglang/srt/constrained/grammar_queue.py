"""The scheduler's grammar queue: requests wait here while their grammar compiles off-thread.

Every TP rank compiles its own copy of each grammar (compiling is deterministic) and advances
its own matchers; which requests leave the queue at a step must still be the same on every rank,
or their batches would differ. Each rank's queue holds the same requests in the same order (they
come from rank 0's broadcast), so one all-reduce(MIN) over the "compiled here" flags decides.

With --reasoning-parser, a request that starts in its reasoning (require_reasoning) gets its
matcher behind a ReasoningGate: the grammar applies from the think-end marker on.
"""

from __future__ import annotations

import concurrent.futures
from concurrent.futures import Future
from typing import Any, Optional

import torch
import torch.distributed as dist

from sglang.srt.constrained.base_grammar_backend import BaseGrammarBackend, GrammarKey
from sglang.srt.constrained.reasoning_gate import ReasoningGate


class GrammarQueue:
    def __init__(self, backend: BaseGrammarBackend, tp_group: Optional[Any], think_end_ids: Optional[list[int]] = None) -> None:
        self.backend = backend
        self.tp_group = tp_group  # the CPU (gloo) group when TP > 1
        self.think_end_ids = think_end_ids  # the reasoning parser's think-end marker; None without one
        self.entries: list[tuple[Any, Future]] = []  # (Req, future of the compiled grammar)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, req: Any, key: GrammarKey) -> None:
        self.entries.append((req, self.backend.compile_async(key)))

    def remove(self, req: Any) -> bool:
        """Drop an aborted request; False when it was not queued."""
        before = len(self.entries)
        self.entries = [(r, f) for r, f in self.entries if r is not req]
        return len(self.entries) < before

    def pop_ready(self) -> tuple[list[Any], list[tuple[Any, str]]]:
        """Requests whose grammar compiled on every rank, each now holding its own matcher, and
        (request, reason) for those whose grammar failed to compile; the rest stay queued."""
        if not self.entries:
            return [], []
        done = torch.tensor([f.done() for _, f in self.entries], dtype=torch.int32)  # [Q]
        if self.tp_group is not None:
            dist.all_reduce(done, op=dist.ReduceOp.MIN, group=self.tp_group)
        ready, failed, waiting = [], [], []
        for (req, future), is_done in zip(self.entries, done.tolist()):
            if not is_done:
                waiting.append((req, future))
            elif future.exception() is not None:
                failed.append((req, str(future.exception())))
            else:
                matcher = self.backend.new_matcher(future.result(), sorted(req.stop_token_ids()))
                if self.think_end_ids is not None and req.require_reasoning:
                    matcher = ReasoningGate(matcher, self.think_end_ids)
                req.grammar = matcher
                ready.append(req)
        self.entries = waiting
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block until some queued grammar finishes compiling or `timeout` seconds pass (the
        scheduler's idle wait when nothing else can run)."""
        concurrent.futures.wait([f for _, f in self.entries], timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
