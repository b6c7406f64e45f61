"""The guidance mix of the captured sampling graph (sampling/guidance_graph.py), run eagerly on the
CPU, against the eager mix (sampling/guidance.py): the same bits on every guided row, unguided
and guide rows untouched, and the same alphas."""

from __future__ import annotations

import math

import pytest
import torch

from sglang.srt.sampling.guidance import GuidanceBatch, apply_guidance
from sglang.srt.sampling.guidance_graph import GuidanceGraphInputs, mix_in_graph

VOCAB = 96
MAX_BS = 16

GUIDED = [
    {"method": "cfg", "input_ids": [1], "weight": 2.5},
    None,
    {"method": "mixture", "input_ids": [1], "alpha": 0.3},
    {"method": "mixture", "input_ids": [1], "alpha": "kl_symmetry"},
    {"method": "contrastive", "input_ids": [1], "weight": 0.7, "plausibility": 0.2},
    None,
    {"method": "cfg", "input_ids": [1], "weight": 1.0},
]


def _step(guidance: list, padded: int, seed: int) -> tuple[torch.Tensor, GuidanceBatch]:
    """A decode graph's logits: the sampled rows, their guide rows after them, then padding."""
    batch = GuidanceBatch.build(guidance, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(padded, VOCAB, generator=gen) * 3  # [padded, V]
    logits[:, [5, 6]] = -math.inf  # ruled out in every context (a grammar's mask, say)
    return logits, batch


@pytest.mark.parametrize("with_kl", [True, False])
def test_graph_mix_equals_the_eager_mix_bit_for_bit(with_kl):
    guidance = GUIDED if with_kl else [g if g is None or g.get("alpha") != "kl_symmetry" else None for g in GUIDED]
    sampled, padded = len(guidance), 12
    logits, batch = _step(guidance, padded, seed=0)
    guides = sampled + len(batch)
    eager = logits[:sampled].clone()
    want_alpha = apply_guidance(eager, logits[sampled:guides].clone(), batch)

    inputs = GuidanceGraphInputs(MAX_BS, torch.device("cpu"))
    inputs.load(batch, sampled, padded)
    graph = logits.clone()
    alpha = mix_in_graph(graph, inputs, with_kl=with_kl)
    assert torch.equal(graph[:sampled], eager)
    assert torch.equal(graph[sampled:], logits[sampled:])  # guide and padding rows untouched
    assert torch.equal(alpha.index_select(0, batch.rows), want_alpha)
    assert not graph.isnan().any()


def test_reloading_a_smaller_batch_clears_the_rows_a_larger_one_guided():
    inputs = GuidanceGraphInputs(MAX_BS, torch.device("cpu"))
    big, big_batch = _step(GUIDED, 14, seed=1)
    inputs.load(big_batch, len(GUIDED), 14)
    small_guidance = [None, {"method": "cfg", "input_ids": [1], "weight": 3.0}]
    logits, batch = _step(small_guidance, 4, seed=2)
    inputs.load(batch, 2, 4)
    eager = logits[:2].clone()
    apply_guidance(eager, logits[2:3].clone(), batch)
    graph = logits.clone()
    mix_in_graph(graph, inputs, with_kl=True)
    assert torch.equal(graph[:2], eager)
    assert torch.equal(graph[2:], logits[2:])
