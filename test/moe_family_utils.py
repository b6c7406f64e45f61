"""The MoE families' end-to-end checks beyond family_utils: a server's greedy tokens and first
token top logprobs for a prompt set, compared between two servers (TP/EP layouts against TP=1)."""

from __future__ import annotations

import concurrent.futures

import torch

from family_utils import LOGPROB_ATOL, TOP_K, served
from sglang.test.server_process import ServerProcess

# Two passes of the prompts: the second finds each prompt's prefix in the radix cache.
PASSES = 2


def served_outputs(server: ServerProcess, prompt_list: list[list[int]], new_tokens: int = 8) -> list[tuple]:
    """Every prompt sent at once -> per prompt (greedy ids, first token's top-K [(id, logprob)])."""
    with concurrent.futures.ThreadPoolExecutor(len(prompt_list)) as pool:
        results = list(pool.map(lambda p: served(server, p, new_tokens), prompt_list))
    return [
        (r["output_ids"], [(entry[1], entry[0]) for entry in r["meta_info"]["output_top_logprobs"][0][:TOP_K]])
        for r in results
    ]


def assert_same_outputs(got: list[tuple], expected: list[tuple], atol: float = LOGPROB_ATOL) -> None:
    """Equal greedy tokens and top-K ids; top-K logprobs within `atol`."""
    for (ids, top), (ref_ids, ref_top) in zip(got, expected):
        assert ids == ref_ids
        assert [i for i, _ in top] == [i for i, _ in ref_top]
        values = torch.tensor([v for _, v in top], dtype=torch.float64)
        ref_values = torch.tensor([v for _, v in ref_top], dtype=torch.float64)
        torch.testing.assert_close(values, ref_values, atol=atol, rtol=0)
