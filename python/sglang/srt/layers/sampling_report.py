"""What a sampled row may ask the sampler to report about its draw besides logprobs: its sampling
support (the token ids that survived every filter: penalties, bias, grammar mask, processors,
top-k, top-p, min-p), the behaviour logprobs over that support, and the entropy.

Only the rows that ask pay. Their processed logits are copied once ([R, V]), after the custom
processors and before temperature scaling; the report is computed from that copy after the draw,
with the support rule every backend samples from (sgl_kernel_ext.sampling.support). Nothing here
reads the device on the host: `report_rows` (the one read) runs after the sampler returns.

Greedy rows (top_k 1) sample their argmax: their support is that one token, with logprob 0.
The entropy is that of the softmax of the processed logits over temperature (1 for greedy rows),
before top-k / top-p / min-p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

import torch

from sglang.srt.layers.sampling_ops import compute_support
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.utils import host_to_device

NEG_INF = float("-inf")


@dataclass(frozen=True)
class ReportAsk:
    """What one request asked for (SGLang's request fields)."""

    support: bool = False  # return_sampling_mask
    support_logprobs: bool = False  # sampling_logprobs_mode == "support" (else "selected")
    entropy: bool = False  # return_entropy


class RowReport(NamedTuple):
    """One sampled token's report, on the host."""

    support: Optional[list[int]]  # token ids by decreasing behaviour probability; None: not asked
    # The sampled token's behaviour logprob ("selected"), or one per support id ("support").
    logprobs: Union[None, float, list[float]]
    entropy: Optional[float]


@dataclass
class SamplingReport:
    """The asking rows' report on the device."""

    rows: list[int]  # sampled rows (batch order) that asked
    asks: list[ReportAsk]
    logprobs: torch.Tensor  # [R, V] float32 behaviour logprobs, -inf outside the support
    entropy: torch.Tensor  # [R] float32
    next_ids: torch.Tensor  # [R] int64 sampled ids


class ReportPlan:
    """The rows of one step that ask for a report, and their captured logits."""

    def __init__(self, rows: list[int], asks: list[ReportAsk]) -> None:
        self.rows, self.asks = rows, asks
        self.index: Optional[torch.Tensor] = None
        self.logits: Optional[torch.Tensor] = None
        self.result: Optional[SamplingReport] = None  # set by the Sampler after the draw

    @classmethod
    def of(cls, asks: Sequence[Optional[ReportAsk]]) -> Optional["ReportPlan"]:
        """The plan of a step's per-row asks; None when no row asks (the common path)."""
        rows = [i for i, ask in enumerate(asks) if ask is not None]
        return cls(rows, [asks[i] for i in rows]) if rows else None

    def capture(self, logits: torch.Tensor) -> None:
        """Copy the asking rows of the processed logits ([B, V]) before the step scales them."""
        self.index = host_to_device(self.rows, logits.device)  # [R] int64
        self.logits = logits.index_select(0, self.index)  # [R, V]

    def finish(self, info: SamplingBatchInfo, next_ids: torch.Tensor, full_sort: bool = False) -> SamplingReport:
        """The report of the captured rows given the step's sampled ids ([B] int64); `full_sort`:
        thresholds over the full sort, as seeded rows draw in the deterministic mode on CUDA."""
        index, logits = self.index, self.logits
        scaled = logits / info.temperatures.index_select(0, index)  # [R, V]
        ids = next_ids.index_select(0, index)  # [R]
        kept = _kept(scaled, info, index, None if full_sort else info.max_top_k)  # [R, V] bool
        behaviour = torch.where(kept, scaled, torch.full_like(scaled, NEG_INF))
        behaviour = behaviour - torch.logsumexp(behaviour, dim=-1, keepdim=True)
        greedy = info.top_ks.index_select(0, index) <= 1  # [R] bool
        point = torch.full_like(scaled, NEG_INF).scatter_(1, ids.clamp(min=0).unsqueeze(1), 0.0)  # [R, V]
        behaviour = torch.where(greedy.unsqueeze(1), point, behaviour)
        entropy = torch.special.entr(torch.softmax(scaled, dim=-1)).sum(dim=-1)  # [R]
        return SamplingReport(self.rows, self.asks, behaviour, entropy, ids)


def _kept(scaled: torch.Tensor, info: SamplingBatchInfo, index: torch.Tensor, window: Optional[int]) -> torch.Tensor:
    """[R, V] bool: the tokens a sampled row may draw (finite, and at or above its filters' threshold)."""
    finite = scaled > NEG_INF
    if not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling):
        return finite
    support = compute_support(
        scaled,
        info.top_ks.index_select(0, index),
        info.top_ps.index_select(0, index),
        info.min_ps.index_select(0, index),
        window=window,
        need_top_p=info.need_top_p_sampling,
        need_min_p=info.need_min_p_sampling,
    )
    return support.keeps(scaled) & finite


def report_rows(report: Optional[SamplingReport], num_rows: int) -> list[Optional[RowReport]]:
    """Per sampled row, its report on the host (None for rows that did not ask). Reads the device."""
    results: list[Optional[RowReport]] = [None] * num_rows
    if report is None:
        return results
    supports = _supports(report)
    entropy = report.entropy.tolist()
    for r, (row, ask) in enumerate(zip(report.rows, report.asks)):
        support, logprobs = supports.get(r, (None, None))
        results[row] = RowReport(support, logprobs, entropy[r] if ask.entropy else None)
    return results


def _supports(report: SamplingReport) -> dict[int, tuple[list[int], Union[float, list[float]]]]:
    """Report row -> (support ids by decreasing logprob, the selected logprob or the support's),
    for the rows that asked for their support (only those are sorted)."""
    rows = [r for r, ask in enumerate(report.asks) if ask.support]
    if not rows:
        return {}
    index = host_to_device(rows, report.logprobs.device)
    logprobs = report.logprobs.index_select(0, index)  # [S, V]
    lengths = torch.isfinite(logprobs).sum(dim=-1)  # [S]
    values, ids = torch.topk(logprobs, max(1, int(lengths.max())), dim=-1)  # [S, W], descending
    selected = logprobs.gather(1, report.next_ids.index_select(0, index).clamp(min=0).unsqueeze(1)).squeeze(1)  # [S]
    lengths_h, values_h, ids_h, selected_h = lengths.tolist(), values.tolist(), ids.tolist(), selected.tolist()
    out = {}
    for s, r in enumerate(rows):
        n = lengths_h[s]
        out[r] = (ids_h[s][:n], values_h[s][:n] if report.asks[r].support_logprobs else selected_h[s])
    return out
