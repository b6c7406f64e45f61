"""Shared builders for sampler tests: batches of Reqs, an independent reference distribution and the
distribution cases the CPU and CUDA sampler tests share."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams


def make_batch(
    params: list[SamplingParams],
    *,
    prompts: Optional[list[list[int]]] = None,
    processors: Optional[list[Optional[str]]] = None,
    enable_processors: bool = False,
    allowlist: Optional[frozenset[str]] = None,
    device: str = "cpu",
) -> ScheduleBatch:
    reqs = []
    for i, p in enumerate(params):
        prompt = prompts[i] if prompts else [1, 2, 3]
        processor = processors[i] if processors else None
        reqs.append(Req(f"r{i}", prompt, p, custom_logit_processor=processor))
    return ScheduleBatch(
        reqs=reqs,
        device=device,
        enable_custom_logit_processor=enable_processors,
        custom_logit_processor_allowlist=allowlist,
    )


def make_info(params: list[SamplingParams], vocab_size: int, **kwargs) -> SamplingBatchInfo:
    batch = make_batch(params, **kwargs)
    info = SamplingBatchInfo.from_schedule_batch(batch, vocab_size)
    batch.sampling_info = info
    return info


def sample(sampler, logits: torch.Tensor, params: list[SamplingParams], positions=None, **kwargs):
    """One Sampler.forward over a copy of `logits`; returns (ids, LogitsProcessorOutput)."""
    info = make_info(params, logits.shape[1], device=str(logits.device))
    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    if positions is None:
        positions = torch.zeros(logits.shape[0], dtype=torch.int64)
    positions = positions.to(logits.device)
    ids = sampler(out, info, positions=positions, **kwargs)
    return ids, out


def reference_distribution(logits: list[float], temperature=1.0, top_k=None, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The filtered softmax, written from the definitions with plain loops in float64.

    top-k keeps every token >= the k-th largest value; top-p keeps a token when the mass of
    strictly larger tokens is < top_p (joint: measured before top-k); min-p keeps p >= min_p * max.
    """
    z = [x / temperature for x in logits]
    m = max(z)
    w = [math.exp(x - m) for x in z]
    total = sum(w)
    p = [x / total for x in w]
    n = len(z)
    ordered = sorted(z, reverse=True)
    keep = [True] * n
    if top_k is not None and top_k < n:
        kth = ordered[top_k - 1]
        keep = [k and z[i] >= kth for i, k in enumerate(keep)]
    if top_p < 1.0:
        greater = [sum(p[j] for j in range(n) if z[j] > z[i]) for i in range(n)]
        keep = [k and greater[i] < top_p for i, k in enumerate(keep)]
    if min_p > 0.0:
        pmax = max(p)
        keep = [k and p[i] >= min_p * pmax for i, k in enumerate(keep)]
    q = np.array([p[i] if keep[i] else 0.0 for i in range(n)])
    return q / q.sum()


def empirical(ids: torch.Tensor, vocab_size: int) -> np.ndarray:
    return np.bincount(ids.cpu().numpy(), minlength=vocab_size) / len(ids)


def assert_matches_distribution(ids: torch.Tensor, expected: np.ndarray, *, min_p_value: float = 1e-4) -> None:
    """Support must match exactly; a chi-square goodness-of-fit must not reject at `min_p_value`."""
    from scipy.stats import chisquare

    counts = np.bincount(ids.cpu().numpy(), minlength=len(expected))
    outside = counts[expected == 0].sum()
    assert outside == 0, f"{outside} draws outside the support {np.nonzero(expected)[0].tolist()}"
    support = expected > 0
    if support.sum() > 1:
        stat = chisquare(counts[support], expected[support] * counts.sum())
        assert stat.pvalue > min_p_value, (counts.tolist(), (expected * counts.sum()).round(1).tolist())
    tv = 0.5 * np.abs(counts / counts.sum() - expected).sum()
    assert tv < 0.03, f"total variation {tv:.4f}"


# The distribution cases of the CPU and CUDA sampler tests.
# A tie at 1.5 (ranks 2 and 3) and a -inf token that must never be drawn.
BASE = [2.0, 1.5, 1.5, 1.0, 0.5, 0.2, 0.0, -0.3, -1.0, -2.0, -3.0, float("-inf")]
V = len(BASE)
DRAWS = 20_000

CASES = {
    "temperature_0.7": dict(temperature=0.7),
    "temperature_1.5": dict(temperature=1.5),
    "top_k_2_keeps_tie": dict(top_k=2),
    "top_k_5": dict(top_k=5),
    "top_k_above_vocab": dict(top_k=1000),
    "top_p_0.6": dict(top_p=0.6),
    "top_p_0.95": dict(top_p=0.95),
    "min_p_0.2": dict(min_p=0.2),
    "top_k_top_p": dict(temperature=0.8, top_k=6, top_p=0.8),
    "top_k_top_p_min_p": dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05),
    "top_p_min_p": dict(temperature=1.2, top_p=0.7, min_p=0.1),
}


def expected_distribution(case: dict) -> np.ndarray:
    """The reference distribution over BASE of one of CASES."""
    top_k = case.get("top_k")
    return reference_distribution(
        BASE,
        temperature=case.get("temperature", 1.0),
        top_k=top_k if top_k is not None and top_k < V else None,
        top_p=case.get("top_p", 1.0),
        min_p=case.get("min_p", 0.0),
    )
