"""The support set of a sampled row and the seeded draw over it, in plain torch: the one definition
that the Triton kernels (sample.py) are tested against and that sglang's sampler runs.

The support of a row is a threshold in temperature-scaled logit space: token i is kept iff
scaled[i] >= threshold. The threshold is the largest of

  top-k  the k-th largest scaled logit (so every token tied with it is kept; k >= V: none),
  top-p  the smallest value whose strictly-larger mass is < top_p (joint semantics: the mass
         is measured on the full softmax, before top-k; ties are kept together),
  min-p  max + log(min_p) (p_i >= min_p * p_max).

The threshold is computed from a descending top-W window when every row has a small top_k, or (on
the CPU) when a top-p nucleus fits a window or only min-p filters; otherwise from a full sort.
The threshold is exact on every path; the window may miss tokens tied with the threshold
beyond it, or (min-p) kept tokens beyond it, which `Support.window_complete` reports.

A seeded row draws argmax(scaled + gumbel(hash(seed, position, token id))) over its kept tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from sgl_kernel_ext.sampling.murmur_reference import hash_gumbel
from sgl_kernel_ext.sampling.topk_cpu import topk_cpu, topk_cpu_applies
from sgl_kernel_ext.sampling.window_cpu import window_cpu_applies, window_thresholds_cpu

NEG_INF = float("-inf")


@dataclass
class Support:
    """The kept set of each row, as a threshold plus the sorted values it was computed from."""

    threshold: torch.Tensor  # [B, 1] float32, scaled-logit space
    vals: torch.Tensor  # [B, W] float32, descending
    idx: torch.Tensor  # [B, W] int64, token ids of vals
    vocab_size: int

    def keeps(self, scaled: torch.Tensor) -> torch.Tensor:
        """[B, V] bool: the kept tokens of `scaled` ([B, V], the logits this support was computed from)."""
        return scaled >= self.threshold

    @property
    def is_full(self) -> bool:
        return self.vals.shape[1] == self.vocab_size

    def window_complete(self) -> torch.Tensor:
        """[B] bool: every kept token of the row is inside the window."""
        if self.is_full:
            return torch.ones(self.vals.shape[0], dtype=torch.bool, device=self.vals.device)
        return self.vals[:, -1] < self.threshold[:, 0]

    def select(self, rows: torch.Tensor) -> "Support":
        """The support of rows `rows` ([R] int64) only; each row's values are its own."""
        threshold, vals, idx = (t.index_select(0, rows) for t in (self.threshold, self.vals, self.idx))
        return Support(threshold=threshold, vals=vals, idx=idx, vocab_size=self.vocab_size)

    def window_draws(self) -> bool:
        """Whether draws may stay inside the window: CPU only (the check reads the device), and
        every row's kept tokens must all be in it."""
        return not self.is_full and not self.vals.is_cuda and bool(self.window_complete().all())


def compute_support(
    scaled: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: Optional[torch.Tensor] = None,
    *,
    window: Optional[int],
    need_top_p: bool,
    need_min_p: bool,
    log_min_ps: Optional[torch.Tensor] = None,
) -> Support:
    """Thresholds for top-k / top-p / min-p over `scaled` ([B, V] float32).

    `window` is an upper bound on every row's top_k (a host-side batch flag), or None when some
    row has no top-k; top_ks values >= V mean "no top-k". Min-p comes as min_ps [B] or, as the
    kernels take it, log_min_ps [B] (-inf: none; log(exp(x)) need not round-trip).
    """
    if need_min_p and log_min_ps is None:
        log_min_ps = torch.log(min_ps)
    rule = Rule(top_ks, top_ps, log_min_ps, need_top_p, need_min_p)
    vocab = scaled.shape[1]
    if window is not None and window + 1 < vocab:
        # One extra column shows whether ties with the k-th value run past the window.
        return _support_in(scaled, *_descending_window(scaled, window + 1), rule)[0]
    if need_min_p and not need_top_p and not scaled.is_cuda:
        # Min-p alone keeps the tokens >= its threshold: a window as wide as the largest kept
        # set holds every row's support.
        floor = min_p_threshold(scaled.amax(dim=-1, keepdim=True), log_min_ps)  # [B, 1]
        width = int((scaled >= floor).sum(dim=-1).max())
        if width + 1 < vocab:
            support, exact = _support_in(scaled, *_descending_window(scaled, width + 1), rule)
            if bool(exact.all()):  # rows with a top_k beyond the window need a wider one
                return support
    if (need_top_p or need_min_p) and not scaled.is_cuda:
        # A top-p nucleus is usually far smaller than the vocabulary and a CPU sort of [B, V]
        # costs ~50x a top-k; try growing windows, keep one only if it is exact for every row.
        # A min-p threshold (max + log min_p) is exact from any window; a window that misses
        # some of its kept tokens only sends the draw to the full row (window_complete).
        for width in _CPU_NUCLEUS_WINDOWS:
            if width + 1 >= vocab:
                break
            support, exact = _support_in(scaled, *_descending_window(scaled, width + 1), rule)
            if bool(exact.all()):
                return support
    return _support_in(scaled, *torch.sort(scaled, dim=-1, descending=True), rule)[0]


_CPU_NUCLEUS_WINDOWS = (512, 4096)


def _descending_window(scaled: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` largest values of each row, descending, and their token ids: the C kernel on
    the CPU (ties ordered by token id, where torch.topk leaves their order open), torch.topk elsewhere."""
    if topk_cpu_applies(scaled):
        return topk_cpu(scaled, width)
    return torch.topk(scaled, width, dim=-1)


def min_p_threshold(row_max: torch.Tensor, log_min_ps: torch.Tensor) -> torch.Tensor:
    """Min-p's threshold [B, 1] from each row's max scaled logit ([B, 1]): p_i >= min_p * p_max."""
    return row_max + log_min_ps.unsqueeze(1)


class Rule(NamedTuple):
    """The filters of a batch's rows, as compute_support takes them."""

    top_ks: torch.Tensor  # [B]; >= V: none
    top_ps: torch.Tensor  # [B]
    log_min_ps: Optional[torch.Tensor]  # [B], -inf: none
    need_top_p: bool
    need_min_p: bool


def _support_in(scaled: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor, rule: Rule) -> tuple[Support, torch.Tensor]:
    """Thresholds from the descending window (vals, idx), and per row whether they are exact:
    the k-th value and the top-p boundary both fall inside the window. On the CPU two C calls
    (window_cpu.c) compute the values _support_in_torch computes."""
    if window_cpu_applies(vals):
        probs = _softmax_at(scaled, idx) if rule.need_top_p else None  # [B, W]
        threshold, exact = window_thresholds_cpu(
            vals, probs, scaled.shape[1], rule.top_ks, rule.top_ps if rule.need_top_p else None,
            rule.log_min_ps if rule.need_min_p else None,
        )
        return Support(threshold=threshold, vals=vals, idx=idx, vocab_size=scaled.shape[1]), exact
    return _support_in_torch(scaled, vals, idx, rule)


def _support_in_torch(
    scaled: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor, rule: Rule
) -> tuple[Support, torch.Tensor]:
    """_support_in in torch ops: the CUDA path, and the C kernels' reference."""
    top_ks, top_ps, log_min_ps, need_top_p, need_min_p = rule
    vocab, width = scaled.shape[1], vals.shape[1]
    threshold = _top_k_threshold(vals, top_ks, vocab)
    exact = (top_ks >= vocab) | (top_ks <= width)  # [B] bool
    if need_top_p:
        top_p_threshold, kept = _top_p_threshold(scaled, vals, idx, top_ps)
        threshold = torch.maximum(threshold, top_p_threshold)
        exact &= (top_ps >= 1.0) | (kept.squeeze(1) < width)
    if need_min_p:
        threshold = torch.maximum(threshold, min_p_threshold(vals[:, :1], log_min_ps))
    return Support(threshold=threshold, vals=vals, idx=idx, vocab_size=vocab), exact


def _top_k_threshold(vals: torch.Tensor, top_ks: torch.Tensor, vocab: int) -> torch.Tensor:
    k = top_ks.to(torch.int64).clamp(1, vals.shape[1]).unsqueeze(1)  # [B, 1]
    kth = vals.gather(1, k - 1)  # [B, 1]
    return torch.where(top_ks.unsqueeze(1) >= vocab, torch.full_like(kth, NEG_INF), kth)


def _top_p_threshold(
    scaled: torch.Tensor, vals: torch.Tensor, idx: torch.Tensor, top_ps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p threshold [B, 1] and how many window columns it keeps [B, 1]."""
    probs = _softmax_at(scaled, idx).double()  # [B, W] full-vocab mass of each window column
    before = torch.cumsum(probs, dim=-1) - probs  # mass ranked strictly before each column
    # Ties share the mass before their group's first column, so tied tokens stay together.
    col = torch.arange(vals.shape[1], device=vals.device).expand_as(vals)
    starts = torch.ones_like(vals, dtype=torch.bool)
    starts[:, 1:] = vals[:, 1:] != vals[:, :-1]
    group_start = torch.cummax(torch.where(starts, col, torch.zeros_like(col)), dim=-1).values
    mass_greater = before.gather(1, group_start)  # [B, W]
    # At least the first column (mass 0 < top_p), also on a NaN row the sampler will flag.
    kept = (mass_greater < top_ps.double().unsqueeze(1)).sum(-1, keepdim=True).clamp_(min=1)
    tp = vals.gather(1, kept - 1)  # [B, 1]
    return torch.where(top_ps.unsqueeze(1) >= 1.0, torch.full_like(tp, NEG_INF), tp), kept


# Rows per softmax call on the CPU: a [rows, V] temporary that stays in cache instead of a
# fresh [B, V] allocation, whose page faults cost more than the softmax itself.
_CPU_SOFTMAX_ELEMENTS = 1 << 18


def _softmax_at(scaled: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """softmax(scaled) gathered at idx ([B, W]); one fused pass (logsumexp is ~6x slower on CPU)."""
    if scaled.is_cuda:
        return torch.softmax(scaled, dim=-1).gather(1, idx)
    rows = max(1, _CPU_SOFTMAX_ELEMENTS // scaled.shape[1])
    parts = [
        torch.softmax(scaled[start : start + rows], dim=-1).gather(1, idx[start : start + rows])
        for start in range(0, scaled.shape[0], rows)
    ]
    return torch.cat(parts)


def draw_seeded(
    scaled: torch.Tensor,
    support: Optional[Support],
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Token ids [B] int64 by Gumbel-max with noise hash(seed, position, token id).

    The noise is keyed by token id, not rank, so the result depends only on (seed, position,
    logits) whichever path computed the support.
    """
    if support is not None and support.window_draws():
        return draw_seeded_in_window(support, seeds, positions)
    threshold = support.threshold if support is not None else torch.full_like(scaled[:, :1], NEG_INF)
    cols = torch.arange(scaled.shape[1], device=scaled.device)  # [V]
    return _gumbel_argmax(scaled, cols, threshold, seeds, positions)


def draw_seeded_in_window(support: Support, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """draw_seeded when `support.window_draws()`: the kept tokens are all in the window."""
    return _gumbel_argmax(support.vals, support.idx, support.threshold, seeds, positions)


def _gumbel_argmax(
    values: torch.Tensor, cols: torch.Tensor, threshold: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """The kept column (values >= threshold) with the largest value + noise(token id); cols are
    the token ids of the columns, [N] shared or [B, N] per row."""
    noise = hash_gumbel(seeds, positions, cols)  # [B, N] float64
    scores = torch.where(values >= threshold, values.double() + noise, torch.full_like(noise, NEG_INF))
    best = scores.argmax(dim=-1, keepdim=True)  # [B, 1]
    if cols.dim() == 1:
        return best.squeeze(1)
    return cols.gather(1, best).squeeze(1)
