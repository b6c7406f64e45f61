"""Entry points of the processes test_tp.py spawns as TP ranks over gloo (torch.multiprocessing
pickles them by reference; this module stays light so each rank starts fast)."""

from __future__ import annotations

import json
import os

import torch

from runner_utils import Driver
from sglang.srt.distributed.communication import TokenDivergenceError, broadcast_frames, check_token_agreement
from sglang.srt.distributed.parallel_state import destroy_tp_groups, init_tp_groups, tp_cpu_group, tp_device_group
from sglang.srt.model_executor.model_runner import ModelRunner

CPU = torch.device("cpu")
PROMPTS = [[3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64, 33], [271, 82, 8, 28, 18]]
DECODE_TOKENS = [[7, 250], [91, 4]]  # two decode steps of both requests


def forward_logits(runner: ModelRunner) -> list[torch.Tensor]:
    """Prompt logits of both PROMPTS [N, V], then each decode step's [2, V]."""
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in PROMPTS]
    logits = [driver.extend(reqs, PROMPTS, input_logits=True).input_token_logits]
    logits += [driver.decode(reqs, tokens) for tokens in DECODE_TOKENS]
    driver.release()
    return logits


def logits_worker(rank: int, tp_size: int, path: str, init_method: str, out_path: str) -> None:
    """Rank `rank` of a sharded forward; rank 0 saves the (all-gathered) logits."""
    init_tp_groups(rank, tp_size, CPU, init_method, timeout_s=120)
    runner = ModelRunner(path, max_total_tokens=128, max_running_requests=2, tp_rank=rank, tp_size=tp_size)
    logits = forward_logits(runner)
    if rank == 0:
        torch.save(logits, out_path)
    destroy_tp_groups()


def collectives_worker(rank: int, init_method: str, out_dir: str) -> None:
    """One of 2 ranks: a request broadcast, then agreeing, diverging and mis-sized token checks;
    what it saw goes to out_dir/<rank>.json."""
    init_tp_groups(rank, 2, CPU, init_method, timeout_s=60)
    frames = broadcast_frames([b"abc", b"", b"\x00\xff"] if rank == 0 else [], tp_cpu_group())
    empty = broadcast_frames([], tp_cpu_group())
    rids = ["a", "b", "c"]
    check_token_agreement(torch.tensor([5, 7, 9]), 3, rids, tp_device_group())  # agree: passes
    check_token_agreement(torch.tensor([[5, 6, -1], [7, -1, -1]]), 6, rids, tp_device_group())  # a verify's [B, W]
    errors = []
    checks = (
        (4, torch.tensor([5, 7 + rank, 9 + rank])),
        (5, torch.tensor([1] * (1 + rank))),
        (7, torch.tensor([[5, 6, -1], [7, 8, -1] if rank else [7, -1, -1]])),  # rank 1 accepted one more draft
        (8, torch.tensor([[5] * (2 + rank)])),
    )
    for step, ids in checks:
        try:
            check_token_agreement(ids, step, rids, tp_device_group())
        except TokenDivergenceError as err:
            errors.append(str(err))
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump({"frames": [x.hex() for x in frames], "empty": empty, "errors": errors}, f)
    destroy_tp_groups()


def invariant_reduce_worker(rank: int, init_method: str, out_dir: str) -> None:
    """One of 3 ranks: row-parallel partial sums of N rows reduced in batch-invariant mode for
    many N; rank 0 records whether row 0 always came out as the rank-order sum, bit for bit."""
    from sglang.srt.layers.batch_invariant import batch_invariant
    from sglang.srt.layers.linear import tp_all_reduce_sum

    init_tp_groups(rank, 3, CPU, init_method, timeout_s=60)

    def partial(r: int) -> torch.Tensor:  # large, mixed-sign values: the order of the adds shows
        return torch.randn(300, 64, generator=torch.Generator().manual_seed(r)) * 1e3

    with batch_invariant(True):
        rows = [tp_all_reduce_sum(partial(rank)[:n].clone())[0] for n in range(1, 300, 7)]
    if rank == 0:
        expected = partial(0)[0] + partial(1)[0] + partial(2)[0]
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump({"same": all(torch.equal(row, expected) for row in rows)}, f)
    destroy_tp_groups()
