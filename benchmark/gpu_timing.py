"""CUDA timing shared by the GPU benchmarks: events around many calls, or around replays of a
CUDA graph of many calls (so that host launch cost stays out of short kernels' numbers)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def events_ms(run: Callable[[], object], iters: int) -> float:
    """Mean milliseconds per run() between CUDA events around `iters` calls (no warm-up)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def gpu_ms(run: Callable[[], object], iters: int = 100, warmup: int = 5) -> float:
    """Mean GPU milliseconds per run() after `warmup` calls."""
    for _ in range(warmup):
        run()
    return events_ms(run, iters)


def graph_us(calls: Sequence[Callable[[], object]], iters: int = 20) -> float:
    """Microseconds per call of `calls`, captured once in order into one CUDA graph (each call run
    once first, to compile), the graph replayed `iters` times after three warm-up replays."""
    for call in calls:
        call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    return events_ms(graph.replay, iters) * 1e3 / len(calls)
