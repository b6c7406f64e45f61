"""STANDALONE drafting: a smaller model with the target's tokenizer proposes each request's drafts
greedily, --speculative-num-steps tokens per verify step.

The draft model has its own ModelRunner, request rows and KV pool in the scheduler process and
runs on the same forward worker thread as the target (the scheduler is idle meanwhile: spec
steps are not overlapped). Each request's draft KV covers the tokens the target has confirmed;
before drafting, one extend catches it up with the tokens accepted since (its whole prompt the
first time), and its logits at the last token give the first draft; each further draft is one
decode step. The K/V written for drafts is given back at once: the next catch-up rewrites those
positions with the tokens the target actually emitted.

Under tensor parallelism every rank runs its shard of the draft model (same TP size and groups
as the target, its own tp_rank) on the same requests, so the draft forwards' collectives pair
up across ranks. The drafts are the argmax of the all-gathered logits on every rank; rank 0's
draft matrix is broadcast once per verify step, so all ranks verify the very same drafts even
where their logits differ by the all-reduce's rounding.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import tp_device_group
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler_process import runner_execution_args
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs

# On CUDA the draft's KV pool takes this share of the memory free once the target is loaded.
DRAFT_CUDA_KV_FRACTION = 0.5


@dataclass
class _DraftRow:
    pool_idx: int
    kv_len: int = 0  # confirmed tokens whose draft K/V are cached


class DraftModel:
    """A DraftSource over a draft ModelRunner (managers/spec_decode.py)."""

    def __init__(self, server_args: ServerArgs, worker: ThreadPoolExecutor, device: torch.device, tp_rank: int,
                 max_total_tokens: int, max_running: int, context_len: int) -> None:
        self.worker = worker
        self.device = device
        args = server_args
        execution = runner_execution_args(args, device, tp_rank)
        # The draft's own positions bound it (a --context-length beyond them is the target's). Its
        # extends are catch-ups of the tokens accepted since the last step, up to k + 1 a request
        # over a speculating batch: piecewise graphs up to that many tokens (a first catch-up over
        # a whole prompt beyond them runs eagerly).
        execution.update(context_length=None, piecewise_cuda_graph_tokens=None,
                         piecewise_cuda_graph_max_tokens=args.speculative_disable_batch_size * (args.speculative_num_steps + 1))
        self.runner: ModelRunner = worker.submit(
            ModelRunner,
            args.speculative_draft_model_path,
            # CPU: room for every confirmed token plus the drafts in flight. CUDA: a share of the
            # memory the target's pool left free.
            max_total_tokens=None if device.type == "cuda" else max_total_tokens + max_running * (args.speculative_num_steps + 1),
            mem_fraction_static=DRAFT_CUDA_KV_FRACTION if device.type == "cuda" else None,
            max_running_requests=max_running,
            **execution,
        ).result()
        self.tp_group = tp_device_group() if args.tp_size > 1 else None
        # Requests longer than the draft's own context get no drafts.
        self.context_len = min(context_len, self.runner.model_config.context_len)
        self.rows: dict[str, _DraftRow] = {}

    def propose(self, reqs: list[Req], caps: list[int]) -> list[list[int]]:
        self._drop_gone(reqs)
        caps = [cap if len(req.origin_input_ids) + len(req.output_ids) + cap <= self.context_len else 0
                for req, cap in zip(reqs, caps)]
        active = [i for i, cap in enumerate(caps) if cap > 0]
        out: list[list[int]] = [[] for _ in reqs]
        if not active:
            return out
        width = max(caps)
        drafts = self.worker.submit(self._draft, [reqs[i] for i in active], width).result()  # [A, width] host
        for i, row in zip(active, drafts):
            out[i] = row[: caps[i]]
        return out

    def _drop_gone(self, reqs: list[Req]) -> None:
        """Free the draft rows of requests that left the running batch (finished)."""
        live = {req.rid for req in reqs}
        for rid in [rid for rid in self.rows if rid not in live]:
            row = self.rows.pop(rid)
            pool = self.runner.req_to_token_pool
            self.runner.token_to_kv_pool_allocator.free(pool.slots_of(row.pool_idx, row.kv_len))
            pool.free(row.pool_idx)

    @torch.inference_mode()
    def _draft(self, reqs: list[Req], width: int) -> list[list[int]]:
        rows = [self._row(req) for req in reqs]
        histories = [req.fill_ids for req in reqs]
        new = [h[row.kv_len :] for h, row in zip(histories, rows)]
        logits = self._forward(ForwardMode.EXTEND, rows, [t for n in new for t in n], [len(n) for n in new])
        tokens = [logits.argmax(dim=-1)]  # [B] greedy: argmax, lowest id on ties
        for row, history in zip(rows, histories):
            row.kv_len = len(history)
        confirmed = [row.kv_len for row in rows]
        for _ in range(width - 1):
            # The last draft stays on the device: the step is queued without waiting for it.
            logits = self._forward(ForwardMode.DECODE, rows, tokens[-1], [1] * len(rows))
            tokens.append(logits.argmax(dim=-1))
        self._forget_drafts(rows, confirmed)
        drafts = torch.stack(tokens, dim=1)  # [B, width] int64 on the device
        if self.tp_group is not None:
            dist.broadcast(drafts, dist.get_global_rank(self.tp_group, 0), group=self.tp_group)
        return drafts.tolist()

    def _row(self, req: Req) -> _DraftRow:
        row = self.rows.get(req.rid)
        if row is None:
            pool_idx = self.runner.req_to_token_pool.alloc()
            if pool_idx is None:
                raise RuntimeError("The draft model has no free request row")
            row = self.rows[req.rid] = _DraftRow(pool_idx)
        return row

    def _forward(self, mode: ForwardMode, rows: list[_DraftRow], input_ids: Union[list[int], torch.Tensor],
                 lens: list[int]) -> torch.Tensor:
        """One draft forward of `lens[i]` new tokens per row after its cached ones ([N] ids, a host
        list or a device tensor): [B, V] logits."""
        slots = self.runner.token_to_kv_pool_allocator.alloc(sum(lens))
        if slots is None:
            raise RuntimeError("The draft model's KV cache is exhausted")
        prefix = [row.kv_len for row in rows]
        self.runner.req_to_token_pool.assign([r.pool_idx for r in rows], prefix, lens, slots)
        on_device = isinstance(input_ids, torch.Tensor)
        batch = ForwardBatch.init_new(mode, None if on_device else input_ids, [r.pool_idx for r in rows], prefix, lens,
                                      slots, self.device)
        if on_device:
            batch.input_ids = input_ids
        for row, n in zip(rows, lens):
            row.kv_len += n
        return self.runner.forward(batch).next_token_logits

    def _forget_drafts(self, rows: list[_DraftRow], confirmed: list[int]) -> None:
        pool = self.runner.req_to_token_pool
        for row, n in zip(rows, confirmed):
            slots = pool.slots_of(row.pool_idx, row.kv_len)
            self.runner.token_to_kv_pool_allocator.free(slots[n:])
            row.kv_len = n


def draft_source(server_args: ServerArgs, worker: ThreadPoolExecutor, device: torch.device, tp_rank: int,
                 max_total_tokens: int, max_running: int, context_len: int) -> Optional[DraftModel]:
    """The draft model of --speculative-algorithm STANDALONE (this rank's shard); None for the
    other algorithms."""
    if server_args.speculative_algorithm != "STANDALONE":
        return None
    return DraftModel(server_args, worker, device, tp_rank, max_total_tokens, max_running, context_len)
