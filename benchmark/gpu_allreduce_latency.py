"""What TP=2 adds to a decode step: the latency of the NCCL all-reduces a step makes.

A TP decode step all-reduces the hidden state twice per layer (after attention's o_proj and the
MLP's down_proj), [B, hidden] in the serving dtype. This times one such all-reduce on two GPUs
inside a CUDA graph (as the decode graphs replay it): a graph of `--calls` all-reduces replayed
`--iters` times, per call = elapsed / (iters * calls), for NCCL and for the one-shot kernel over
symmetric memory (custom_all_reduce.py). Times 2 x layers gives the per-step cost to set against
the ITL difference of TP=2 and TP=1 at N=1.

    python benchmark/gpu_allreduce_latency.py --hidden 1024 --layers 28 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang.srt.distributed.custom_all_reduce import custom_all_reduce
from sglang.srt.distributed.parallel_state import destroy_tp_groups, init_tp_groups

from sglang.test.server_process import free_port


def nccl_all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def one_shot(x: torch.Tensor) -> torch.Tensor:
    out = custom_all_reduce(x)
    if out is None:
        raise RuntimeError(f"the one-shot all-reduce does not serve a {list(x.shape)} {x.dtype} tensor here")
    return out


IMPLS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"nccl": nccl_all_reduce, "one_shot": one_shot}


def time_all_reduce(impl: Callable[[torch.Tensor], torch.Tensor], rows: int, hidden: int, calls: int, iters: int) -> float:
    """Microseconds per all-reduce of a [rows, hidden] bf16 tensor, replayed from a CUDA graph."""
    x = torch.ones(rows, hidden, dtype=torch.bfloat16, device="cuda")  # [rows, hidden] bf16
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # NCCL's first call sets up its channels outside the capture
        for _ in range(3):
            impl(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            impl(x)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (iters * calls)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, results: dict) -> None:
    device = torch.device("cuda", rank)
    init_tp_groups(rank, world, device, f"tcp://127.0.0.1:{port}", 120, custom_all_reduce=True)
    try:
        for impl in args.impl:
            for rows in args.rows:
                us = time_all_reduce(IMPLS[impl], rows, args.hidden, args.calls, args.iters)
                if rank == 0:
                    results[f"{impl}/{rows}"] = us
    finally:
        destroy_tp_groups()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--calls", type=int, default=56, help="all-reduces per graph (a step's: 2 x layers)")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--impl", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    world = 2
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(world, free_port(), args, results), nprocs=world)
        per_call = dict(sorted(results.items()))
    report = {"device": torch.cuda.get_device_name(0), "world": world, "hidden": args.hidden, "layers": args.layers,
              "per_call_us": per_call, "per_step_us": {r: us * 2 * args.layers for r, us in per_call.items()}}
    for key, us in per_call.items():
        impl, rows = key.split("/")
        print(f"{impl} all-reduce [{rows}, {args.hidden}] bf16 on {world} GPUs in a CUDA graph: {us:.2f} us per call, "
              f"{us * 2 * args.layers:.0f} us per decode step ({2 * args.layers} calls)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
