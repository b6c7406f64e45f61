"""Drive a ModelRunner the way the scheduler does, without one: request slots, KV slots,
req_to_token and ForwardBatch. Shared by the model-runner and tensor-parallel tests (light to
import, so spawned TP workers start fast)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner


@dataclass
class Req:
    slot: int
    kv_len: int = 0


class Driver:
    """The scheduler's part of a step: request slots, KV slots, req_to_token, ForwardBatch."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.reqs: list[Req] = []

    def new_req(self) -> Req:
        req = Req(self.runner.req_to_token_pool.alloc())
        self.reqs.append(req)
        return req

    def extend(self, reqs: list[Req], chunks: list[list[int]], input_logits: bool = False) -> LogitsProcessorOutput:
        return self._step(ForwardMode.EXTEND, reqs, chunks, input_logits)

    def decode(self, reqs: list[Req], tokens: list[int]) -> torch.Tensor:
        return self._step(ForwardMode.DECODE, reqs, [[t] for t in tokens], False).next_token_logits

    def _step(
        self, mode: ForwardMode, reqs: list[Req], chunks: list[list[int]], input_logits: bool
    ) -> LogitsProcessorOutput:
        out = self.runner.forward(self.forward_batch(reqs, chunks, mode, input_logits))
        for req, chunk in zip(reqs, chunks):
            req.kv_len += len(chunk)
        return out

    def forward_batch(
        self, reqs: list[Req], chunks: list[list[int]], mode: ForwardMode = ForwardMode.EXTEND, input_logits: bool = False
    ) -> ForwardBatch:
        """KV slots allocated and req_to_token written for `chunks`, as the scheduler does; the
        requests' lengths advance only once the batch has run (see _step)."""
        lens = [len(c) for c in chunks]
        loc = self.runner.token_to_kv_pool_allocator.alloc(sum(lens))
        self.runner.req_to_token_pool.assign([r.slot for r in reqs], [r.kv_len for r in reqs], lens, loc)
        return ForwardBatch.init_new(
            mode, [t for c in chunks for t in c], [r.slot for r in reqs], [r.kv_len for r in reqs], lens, loc, self.runner.device,
            return_input_logits=input_logits,
        )

    def release(self) -> None:
        pool = self.runner.req_to_token_pool
        for req in self.reqs:
            self.runner.token_to_kv_pool_allocator.free(pool.slots_of(req.slot, req.kv_len).clone())
            self.runner.req_to_token_pool.free(req.slot)
        self.reqs.clear()
