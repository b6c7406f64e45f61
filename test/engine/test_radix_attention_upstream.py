"""Port of SGLang's test/srt/test_radix_attention.py: one batched /generate of many input_ids
prompts that form a random prefix tree (children extend a parent's prompt), each with its own
max_new_tokens (0 included), so that the radix cache matches, splits, locks and evicts while
requests run.

Upstream runs it on three servers: TestRadixCacheFCFS (--schedule-policy fcfs),
TestRadixCacheLPM (lpm; skipped in SGLang's CI) and TestRadixCacheNonOverlapLPM
(--disable-overlap-schedule, lpm), all with --chunked-prefill-size 128 --max-total-tokens 20000.
Here: FCFS with the overlap schedule on the shared server (`smollm_server`), and non-overlap LPM
on the shared extra server (--chunked-prefill-size 64, --max-total-tokens 4000, so the pool is
smaller than the tree and eviction runs; --context-length 1000). Scaled: 60 nodes with up to 32
new tokens per edge and 32 new tokens each (upstream: 400 nodes, 256 and 256).
"""

from __future__ import annotations

import random

import pytest
from upstream_helpers import EXTRA_CONTEXT_LEN, post

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pytest_plugins = ["upstream_servers"]


def gen_radix_tree(rng: random.Random, num_nodes: int = 60, chunk_len: int = 32) -> list[dict]:
    num0 = num_nodes // 2
    num1 = num_nodes - num0
    nodes = [{"input_ids": [37] * 117, "decode_len": 32}]
    for _ in range(num0):
        parent = rng.choice(nodes)
        token_id = rng.randint(0, 32000)
        nodes.append({
            "input_ids": parent["input_ids"] + [token_id] * rng.randint(0, chunk_len),
            "decode_len": rng.randint(0, chunk_len),
        })
    while num1 > 0:
        num_branch = rng.randint(1, min(num1, 10))
        parent = rng.choice(nodes)
        for _ in range(num_branch):
            token_id = rng.randint(0, 32000)
            nodes.append({
                "input_ids": parent["input_ids"] + [token_id] * rng.randint(0, chunk_len),
                "decode_len": rng.randint(0, chunk_len),
            })
        num1 -= num_branch
    rng.shuffle(nodes)
    return nodes


@pytest.mark.parametrize("which", ["fcfs_overlap", "lpm_non_overlap"])
def test_radix_attention(request, which: str) -> None:
    server = request.getfixturevalue("smollm_server" if which == "fcfs_overlap" else "upstream_extra_server")
    nodes = gen_radix_tree(random.Random(0))
    assert max(len(n["input_ids"]) + n["decode_len"] for n in nodes) < EXTRA_CONTEXT_LEN
    response = post(server, "/generate", {
        "input_ids": [node["input_ids"] for node in nodes],
        "sampling_params": [{"max_new_tokens": node["decode_len"], "temperature": 0} for node in nodes],
    })
    assert response.status_code == 200, response.text
    results = response.json()
    assert len(results) == len(nodes)  # upstream checks the status only; the shapes are cheap
    for node, result in zip(nodes, results):
        assert result["meta_info"]["prompt_tokens"] == len(node["input_ids"])
        assert result["meta_info"]["completion_tokens"] <= node["decode_len"]
