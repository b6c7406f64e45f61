"""The one-shot all-reduce on two GPUs (skipped elsewhere; run by benchmark/gpu_two_gpu_check.sh):
bit-equal to the rank-ordered reference for every served size, over many calls in a row (a
buffer overwritten while a peer still reads it would show), replayed from a CUDA graph, and
declined (None) above its size so that NCCL takes over."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sgl_kernel_ext.distributed.reference import rank_ordered_sum
from sglang.srt.distributed.custom_all_reduce import MAX_ONE_SHOT_BYTES, custom_all_reduce
from sglang.srt.distributed.parallel_state import destroy_tp_groups, init_tp_groups
from sglang.srt.layers.linear import tp_all_reduce_sum
from sglang.test.server_process import free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

SHAPES = [(1, 1024), (3, 4096), (257, 999), (MAX_ONE_SHOT_BYTES // 2 // 2048, 2048)]


def _reference(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return rank_ordered_sum(parts)


def _input(shape: tuple, dtype: torch.dtype, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1000 * seed + rank)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _check_calls(rank: int) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        for shape in SHAPES:
            x = _input(shape, dtype, rank, 0)
            if x.numel() * x.element_size() > MAX_ONE_SHOT_BYTES:
                assert custom_all_reduce(x) is None
                continue
            for call in range(50):  # back to back: the next call's copy must wait for the peers' reads
                x = _input(shape, dtype, rank, call)
                got = custom_all_reduce(x)
                assert got is not None and torch.equal(got, _reference(x)), (shape, dtype, call)
    x = _input((4, 1024), torch.bfloat16, rank, 7)
    assert torch.equal(tp_all_reduce_sum(x.clone()), _reference(x))


def _check_graph(rank: int) -> None:
    x = torch.zeros(2, 1024, dtype=torch.bfloat16, device="cuda")  # [2, 1024] the graph's static input
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        custom_all_reduce(x)  # compiles the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = [custom_all_reduce(x * (i + 1)) for i in range(8)]
    for replay in range(20):
        x.copy_(_input(x.shape, x.dtype, rank, 100 + replay))
        graph.replay()
        torch.cuda.synchronize()
        for i, out in enumerate(outs):
            assert torch.equal(out, _reference(x * (i + 1))), (replay, i)


def _worker(rank: int, port: int) -> None:
    device = torch.device("cuda", rank)
    init_tp_groups(rank, 2, device, f"tcp://127.0.0.1:{port}", 120, custom_all_reduce=True)
    try:
        assert custom_all_reduce(torch.ones(1, 8, device=device)) is not None, "the one-shot all-reduce is not set up"
        _check_calls(rank)
        _check_graph(rank)
    finally:
        destroy_tp_groups()


def test_one_shot_all_reduce_two_gpus():
    mp.spawn(_worker, args=(free_port(),), nprocs=2)
