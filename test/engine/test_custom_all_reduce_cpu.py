"""The custom all-reduce's CPU side: it is never set up off CUDA (gloo serves TP on the CPU), the
model's TP sum then takes the process group, and the rank-ordered reference adds in float32."""

from __future__ import annotations

import torch

from sgl_kernel_ext.distributed.reference import rank_ordered_sum
from sglang.srt.distributed.custom_all_reduce import custom_all_reduce, init_custom_all_reduce


def test_not_set_up_off_cuda():
    init_custom_all_reduce(torch.device("cpu"), True, cpu_group=None)
    assert custom_all_reduce(torch.ones(4)) is None


def test_rank_ordered_sum_rounds_once():
    parts = [torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([2.0**-8], dtype=torch.bfloat16),
             torch.tensor([2.0**-8], dtype=torch.bfloat16)]
    # bf16 adds one at a time would round 1 + 2^-8 back to 1 twice; float32 keeps 1 + 2^-7 exactly.
    assert rank_ordered_sum(parts).item() == 1.0 + 2.0**-7
    assert rank_ordered_sum([torch.tensor([3.0]), torch.tensor([-1.5])]).item() == 1.5
