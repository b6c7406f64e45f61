"""The pytorch backend's step on the CPU: the batch's rows are grouped once per batch (CpuPlan,
cached on its SamplingBatchInfo), greedy rows only take an argmax, and each group of sampled rows
computes its support once for its unseeded and seeded rows, with the same tokens as TorchStep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.layers.sampler_io import CPU_GROUPED_STEP
from sglang.srt.layers.sampler_torch import TorchStep
from sglang.srt.layers.sampling_ops import (
    Support,
    compute_support,
    draw_seeded,
    draw_seeded_in_window,
    draw_unseeded,
    draw_unseeded_in_window,
    uniform_open_closed,
)
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


class CpuGroupedStep(TorchStep):
    """TorchStep's tokens from one support per group of rows."""

    name = CPU_GROUPED_STEP

    def greedy_ids(self, logits: torch.Tensor, info: SamplingBatchInfo) -> Optional[torch.Tensor]:
        """[G] argmax of only the greedy rows of a mixed batch (a CPU argmax costs several times an
        amax per element), else TorchStep's."""
        if info.is_all_greedy or not info.is_any_greedy:
            return super().greedy_ids(logits, info)
        return logits.index_select(0, cpu_plan(info, logits.shape[0]).greedy_rows).argmax(dim=-1)

    def draw(
        self,
        scaled: torch.Tensor,
        info: SamplingBatchInfo,
        positions: Optional[torch.Tensor],
        greedy_ids: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """One support per group of sampled rows, shared by its unseeded and seeded rows; greedy rows
        take no part.

        Seeded rows: the threshold of a row is exact whatever window computed it (top-k values are
        the row's own; the CPU softmax and prefix sums are per row and sequential, so a window's
        first columns hold the same mass at any width), and the Gumbel argmax is keyed by token id,
        so the token depends only on (seed, logits, position). Unseeded rows: one uniform per batch
        row, drawn for the whole batch, so the same u meets the same support as in TorchStep."""
        plan = cpu_plan(info, scaled.shape[0])
        u = uniform_open_closed(scaled.shape[0], scaled.device, self.owner.generator) if plan.unseeded else None
        if plan.whole_batch:  # one group, all seeded or all unseeded: no row selection
            group = plan.groups[0]
            part = group.unseeded or group.seeded
            return _draw_part(scaled, _group_support(scaled, group), part, u, positions)
        next_ids = torch.zeros(scaled.shape[0], dtype=torch.int64, device=scaled.device)  # [B]
        if greedy_ids is not None:
            next_ids.index_copy_(0, plan.greedy_rows, greedy_ids)
        for group in plan.groups:
            rows_scaled = scaled if group.rows is None else scaled.index_select(0, group.rows)  # [R, V]
            support = _group_support(rows_scaled, group)
            for part in (group.unseeded, group.seeded):
                if part is not None:
                    u_part = u.index_select(0, part.rows) if part.seeds is None else None
                    pos = positions.index_select(0, part.rows) if part.seeds is not None else None
                    next_ids.index_copy_(0, part.rows, _draw_part(rows_scaled, support, part, u_part, pos))
        return next_ids


def cpu_plan(info: SamplingBatchInfo, batch_size: int) -> "CpuPlan":
    """The row groups of a CPU step, built once per batch (the batch drops it when its rows change)."""
    plan = info.cpu_sample_plan
    if plan is None or plan.batch_size != batch_size:
        plan = CpuPlan.build(info)
        info.cpu_sample_plan = plan
    return plan


def _draw_part(
    rows_scaled: torch.Tensor,
    support: Optional[Support],
    part: "RowPart",
    u: Optional[torch.Tensor],
    positions: Optional[torch.Tensor],
) -> torch.Tensor:
    """Token ids of a part's rows (u [N, 1] for unseeded parts, positions [N] for seeded ones):
    inside the window when it holds every kept token of these rows, else over their full rows,
    copied out of the group only then."""
    if support is not None and part.local is not None:
        support = support.select(part.local)
    if support is not None and support.window_draws():
        if part.seeds is None:
            return draw_unseeded_in_window(support, u)
        return draw_seeded_in_window(support, part.seeds, positions.to(torch.int64))
    rows = rows_scaled if part.local is None else rows_scaled.index_select(0, part.local)  # [N, V]
    if part.seeds is None:
        return draw_unseeded(rows, support, None, u=u)
    return draw_seeded(rows, support, part.seeds, positions.to(torch.int64))


def _group_support(rows_scaled: torch.Tensor, group: "RowGroup") -> Optional[Support]:
    if not group.filtered:
        return None
    return compute_support(
        rows_scaled,
        group.top_ks,
        group.top_ps,
        group.min_ps,
        window=group.window,
        need_top_p=group.need_top_p,
        need_min_p=group.need_min_p,
    )


@dataclass
class RowPart:
    """The unseeded or seeded rows of a group."""

    rows: torch.Tensor  # [N] int64, batch rows
    local: Optional[torch.Tensor]  # [N] int64, rows within the group; None = the whole group
    seeds: Optional[torch.Tensor] = None  # [N] int64, seeded part only


@dataclass
class RowGroup:
    """Sampled rows that share one support computation: rows with a top-k (one top-W window, W the
    group's largest top_k), rows filtered by top-p / min-p only (the CPU's growing windows), or
    rows with no filter (no support)."""

    rows: Optional[torch.Tensor]  # [R] int64 batch rows; None = the whole batch, in order
    window: Optional[int]
    filtered: bool
    need_top_p: bool
    need_min_p: bool
    top_ks: torch.Tensor  # [R] int32
    top_ps: torch.Tensor  # [R] float32
    min_ps: torch.Tensor  # [R] float32
    unseeded: Optional[RowPart]
    seeded: Optional[RowPart]


@dataclass
class CpuPlan:
    """How a CPU step splits the batch, from the host-side params (cached on the batch's
    SamplingBatchInfo, which drops it whenever its rows change)."""

    batch_size: int
    greedy_rows: Optional[torch.Tensor]  # [G] int64, set when the batch mixes greedy and sampled rows
    groups: list[RowGroup]
    unseeded: bool  # some sampled row has no seed
    seeded: bool
    whole_batch: bool  # one group of every row, in order, all seeded or all unseeded

    @classmethod
    def build(cls, info: SamplingBatchInfo) -> "CpuPlan":
        params = [row.params for row in info.rows]
        vocab, dev = info.vocab_size, info.device

        def index(rows: list[int]) -> torch.Tensor:
            return torch.tensor(rows, dtype=torch.int64, device=dev)

        greedy = [i for i, p in enumerate(params) if p.top_k <= 1]
        kinds: dict[str, list[int]] = {}
        for i, p in enumerate(params):
            if p.top_k <= 1:
                continue
            kind = "top_k" if p.top_k < vocab else "filter" if (p.top_p < 1.0 or p.min_p > 0.0) else "plain"
            kinds.setdefault(kind, []).append(i)
        groups = []
        for kind, rows in kinds.items():
            group_rows = None if rows == list(range(len(params))) else index(rows)
            pick = (lambda t: t) if group_rows is None else (lambda t: t.index_select(0, group_rows))
            seeded = [j for j, i in enumerate(rows) if params[i].sampling_seed is not None]
            unseeded = [j for j, i in enumerate(rows) if params[i].sampling_seed is None]

            def part(local: list[int], with_seeds: bool) -> Optional[RowPart]:
                if not local:
                    return None
                batch_rows = index([rows[j] for j in local])
                seeds = info.sampling_seed.index_select(0, batch_rows) if with_seeds else None
                return RowPart(batch_rows, None if len(local) == len(rows) else index(local), seeds)

            groups.append(
                RowGroup(
                    rows=group_rows,
                    window=max(params[i].top_k for i in rows) if kind == "top_k" else None,
                    filtered=kind != "plain",
                    need_top_p=any(params[i].top_p < 1.0 for i in rows),
                    need_min_p=any(params[i].min_p > 0.0 for i in rows),
                    top_ks=pick(info.top_ks),
                    top_ps=pick(info.top_ps),
                    min_ps=pick(info.min_ps),
                    unseeded=part(unseeded, False),
                    seeded=part(seeded, True),
                )
            )
        unseeded = any(g.unseeded is not None for g in groups)
        seeded = any(g.seeded is not None for g in groups)
        return cls(
            batch_size=len(params),
            greedy_rows=index(greedy) if greedy else None,
            groups=groups,
            unseeded=unseeded,
            seeded=seeded,
            whole_batch=len(groups) == 1 and groups[0].rows is None and unseeded != seeded,
        )
