"""Fixed vectors for the watermark selection tests: a row whose two best scores tie exactly."""

from __future__ import annotations

from typing import Callable

import torch

from sglang.srt.sampling.watermarking.hashing import log_uniform, token_hashes


def tied_pair(vocab: int, ctx: int, apart: Callable[[int, int], bool]) -> tuple[int, int, int]:
    """(key, i, j), i < j with apart(i, j): under that key and context hash tokens i and j have the
    same float32 log u (distinct hashes that round to one float32), so with p_i = p_j they tie."""
    for n in range(1, 2000):
        key = 0x9E3779B97F4A7C15 - (1 << 64) + n
        log_u = log_uniform(token_hashes(torch.tensor([key]), torch.tensor([ctx]), vocab))[0]  # [V]
        values, order = log_u.sort(stable=True)
        for a in torch.nonzero(values[1:] == values[:-1]).flatten().tolist():
            i, j = sorted((order[a].item(), order[a + 1].item()))
            if apart(i, j):
                return key, i, j
    raise AssertionError("no tied pair found")
