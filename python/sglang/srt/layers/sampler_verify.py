"""The verify of a speculative step: each draft position sampled exactly as a decode step.

A verify step forwards [last token, d1..dk] of every request and returns k + 1 logits rows per
request. Position j's row is the decode step the request would run after out + d1..dj-1, so it
goes through the Sampler's whole pipeline with that prefix: the penalty state has d1..dj-1
folded in (update_penalties with each draft column), the host prefix that grammars, the
min_new_tokens hold-back and the processors read holds them (the request's output list and
matcher are advanced over the drafts, then put back; the batch-level processors' instances are
rebuilt from the host state at the next step, since their interface has no way back), and the
seeded draw is keyed by the position of the row's input token there. A watermarked row's context
at position j is its committed tail plus the tokens drawn at positions 0..j-1 (d1..dj wherever
position j is emitted), and the contexts it forces are recorded as it goes; afterwards each
request keeps the watermark state of the last position it emits. Then draft dj is accepted iff
it equals the token drawn at position j-1; the tokens emitted are the drawn ones up to and including the first mismatch
(or the bonus token after all k), so every emitted token is the target's own draw.

The positions run one after the other over the whole batch (a loop over positions, never over
requests); a row with fewer drafts than the batch's widest repeats its last logits row, whose
draws are never emitted. When no stage reads what came before a position (no penalty state, no
min_new_tokens, no host prefix, watermark or guidance), all positions are sampled in one pass
instead, each (request, position) row keyed by its own
position: the same draws. Nothing reads the device until the accepted lengths, which the host
needs anyway: one copy per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler_io import LogprobAsk, SampledRow
from sglang.srt.layers.sampler_stages import apply_penalties_bias_and_mask, run_batch_processors
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.watermarking.state import WatermarkState
from sglang.srt.utils import host_to_device


class DrawingSampler(Protocol):
    """What the verify uses of the Sampler: its draw from the custom processors on."""

    check_logits_processors: bool
    watermark_state: Optional[WatermarkState]

    def forward(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo, return_logprob: bool = False,
                top_logprobs_nums: Optional[list[int]] = None,
                token_ids_logprobs: Optional[list[Optional[list[int]]]] = None,
                positions: Optional[torch.Tensor] = None, row_errors: Optional[dict[int, str]] = None,
                slots: Optional[torch.Tensor] = None) -> torch.Tensor: ...

NO_DRAFT = -1  # a pad in the [B, K] draft matrix: update_penalties skips it, nothing equals it


@dataclass
class VerifyInput:
    logits: torch.Tensor  # [N, V] float32: row starts[i] + j is request i's position j
    info: SamplingBatchInfo  # the B requests' parameters and penalty state
    rows: Sequence[SampledRow]  # the B requests' host state, in row order
    drafts: list[list[int]]  # per request its drafts d1..dk_i (k_i may be 0)
    starts: list[int]  # per request the offset of its position 0 among the N rows
    positions: torch.Tensor  # [B] int64, the position of each request's last token (position 0)
    asks: list[Optional[LogprobAsk]]
    # Where each request's last emitted id goes on the device ([R] int64 buffer, [B] slots).
    token_store: Optional[tuple[torch.Tensor, torch.Tensor]] = None


@dataclass
class VerifyOutput:
    tokens: list[list[int]]  # per request the emitted ids: accepted drafts, then the drawn token
    accepted: list[int]  # per request its accepted drafts
    row_errors: dict[int, str]  # request -> message, for a failure at its emitted position
    # Per position its logprob output (None when no row asked); request i's emitted token j
    # reads row i of position j.
    position_logprobs: list[Optional[LogitsProcessorOutput]]


def verify(sampler: DrawingSampler, inp: VerifyInput) -> VerifyOutput:
    """Sample every position of every request and accept the drafts that match (module docstring)."""
    width = max((len(d) for d in inp.drafts), default=0)
    device = inp.logits.device
    draft_matrix = [d + [NO_DRAFT] * (width - len(d)) for d in inp.drafts]
    drafts = host_to_device(draft_matrix, device).view(len(inp.drafts), width)  # [B, K] int64
    # [K+1, B] the logits row of each (position, request); short rows repeat their last one.
    row_index = host_to_device(
        [[s + min(j, len(d)) for s, d in zip(inp.starts, inp.drafts)] for j in range(width + 1)], device
    ).view(width + 1, len(inp.drafts))
    if positions_independent(inp.info):
        drawn, logprobs, errors = _sample_all_positions(sampler, inp, row_index)
        return _accept(inp, drawn, drafts, logprobs, errors)
    host_prefix = _HostPrefix(inp) if _reads_host_prefix(inp.info) else None
    watermark = _WatermarkPositions(sampler, inp) if inp.info.watermark is not None else None
    drawn, logprobs, errors = [], [], []
    try:
        for j in range(width + 1):
            if j > 0:
                inp.info.update_penalties(drafts[:, j - 1])
                if host_prefix is not None:
                    host_prefix.advance(j)
            ids, out, row_errors = _sample_position(sampler, inp, inp.logits.index_select(0, row_index[j]), j)
            if watermark is not None:
                watermark.record()
            drawn.append(ids)
            logprobs.append(out)
            errors.append(row_errors)
    finally:
        if host_prefix is not None:
            host_prefix.restore()
        if inp.info.logits_processors is not None:
            inp.info.logits_processors.reset()
    return _accept(inp, torch.stack(drawn, dim=1), drafts, logprobs, errors, watermark)


def _sample_position(
    sampler: DrawingSampler, inp: VerifyInput, logits: torch.Tensor, j: int
) -> tuple[torch.Tensor, Optional[LogitsProcessorOutput], dict[int, str]]:
    """The decode-step pipeline over position j's [B, V] logits: ids [B] int64, logprobs, errors."""
    info = inp.info
    apply_penalties_bias_and_mask(logits, info, inp.rows)
    row_errors = run_batch_processors(logits, info, inp.rows if sampler.check_logits_processors else None)
    return_logprob = any(a is not None for a in inp.asks)
    out = LogitsProcessorOutput(next_token_logits=logits)
    ids = sampler.forward(
        out,
        info,
        return_logprob=return_logprob,
        top_logprobs_nums=[a.top_logprobs_num if a else 0 for a in inp.asks],
        token_ids_logprobs=[a.token_ids_logprob if a else None for a in inp.asks],
        positions=inp.positions + j,
        row_errors=row_errors,
        slots=None if inp.token_store is None else inp.token_store[1],
    )
    return ids, out if return_logprob else None, dict(out.row_errors)


def positions_independent(info: SamplingBatchInfo) -> bool:
    """Whether no stage reads the drafts before a position (penalty state, min_new_tokens, host
    prefix, watermark context, guidance): then every position of every request is sampled in one
    pass, each row keyed by its own position, over `info.repeated_rows(positions)` (which the
    scheduler builds with the step, so that the verify itself copies nothing from the host)."""
    return (
        info.penalizer_orchestrator is None
        and not _reads_host_prefix(info)
        and info.watermark is None
        and info.guidance is None
    )


def _sample_all_positions(
    sampler: DrawingSampler, inp: VerifyInput, row_index: torch.Tensor
) -> tuple[torch.Tensor, list[Optional[LogitsProcessorOutput]], list[dict[int, str]]]:
    """One sampler pass over the B x P (request, position) rows: drawn [B, P], each position's
    logprob output (None when no row asked) and errors."""
    positions_n, batch = row_index.shape
    logits = inp.logits.index_select(0, row_index.t().reshape(-1))  # [B * P, V], request-major
    info = inp.info.repeated_rows(positions_n)
    apply_penalties_bias_and_mask(logits, info, ())
    offsets = torch.arange(positions_n, device=logits.device)  # [P]
    positions = (inp.positions.unsqueeze(1) + offsets).reshape(-1)  # [B * P]
    out = LogitsProcessorOutput(next_token_logits=logits)
    return_logprob = any(a is not None for a in inp.asks)
    asks = [a for a in inp.asks for _ in range(positions_n)]
    ids = sampler.forward(
        out, info, return_logprob=return_logprob, top_logprobs_nums=[a.top_logprobs_num if a else 0 for a in asks],
        token_ids_logprobs=[a.token_ids_logprob if a else None for a in asks], positions=positions,
    )
    errors: list[dict[int, str]] = [{} for _ in range(positions_n)]
    for row, message in out.row_errors.items():
        errors[row % positions_n][row // positions_n] = message
    logprobs = [_position_view(out, j, positions_n) if return_logprob else None for j in range(positions_n)]
    return ids.view(batch, positions_n), logprobs, errors


def _position_view(out: LogitsProcessorOutput, j: int, positions_n: int) -> LogitsProcessorOutput:
    """Position j's rows (j, j + P, ...) of a one-pass output's logprobs, as that position's output."""

    def rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.reshape(-1, positions_n, *t.shape[1:])[:, j]

    ids = out.next_token_token_ids_logprobs_idx
    return LogitsProcessorOutput(
        next_token_logits=rows(out.next_token_logits),
        next_token_logprobs=rows(out.next_token_logprobs),
        next_token_top_logprobs_val=rows(out.next_token_top_logprobs_val),
        next_token_top_logprobs_idx=rows(out.next_token_top_logprobs_idx),
        next_token_token_ids_logprobs_val=rows(out.next_token_token_ids_logprobs_val),
        next_token_token_ids_logprobs_idx=None if ids is None else ids[j::positions_n],
    )


def _accept(
    inp: VerifyInput,
    drawn: torch.Tensor,
    drafts: torch.Tensor,
    logprobs: list[Optional[LogitsProcessorOutput]],
    errors: list[dict[int, str]],
    watermark: Optional["_WatermarkPositions"] = None,
) -> VerifyOutput:
    """drawn [B, K+1]: accept the leading drafts equal to the token drawn before them."""
    match = (drawn[:, :-1] == drafts) & (drafts != NO_DRAFT)  # [B, K]
    accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    if watermark is not None:
        watermark.commit(accepted)
    if inp.token_store is not None:
        ids_out, slots = inp.token_store
        ids_out.index_copy_(0, slots, drawn.gather(1, accepted.unsqueeze(1)).squeeze(1))
    drawn_host, accepted_host = drawn.tolist(), accepted.tolist()  # the step's one read of the device
    tokens = [row[: a + 1] for row, a in zip(drawn_host, accepted_host)]
    row_errors = {i: errors[a][i] for i, a in enumerate(accepted_host) if i in errors[a]}
    return VerifyOutput(tokens, accepted_host, row_errors, logprobs)


def _reads_host_prefix(info: SamplingBatchInfo) -> bool:
    """Whether a stage reads the requests' host state: grammars and processors do."""
    return info.grammars is not None or info.has_custom_logit_processor or info.logits_processors is not None


class _HostPrefix:
    """The requests' output lists and matchers advanced over their drafts, position by position."""

    def __init__(self, inp: VerifyInput) -> None:
        self.inp = inp
        self.lengths = [len(row.output_ids) for row in inp.rows]
        self.advanced = [0] * len(inp.rows)  # drafts each matcher accepted
        self.refused = [False] * len(inp.rows)  # a matcher refused a draft: later ones are never emitted

    def advance(self, j: int) -> None:
        """Append draft j (1-based) of every request that has one."""
        for i, (row, drafts) in enumerate(zip(self.inp.rows, self.inp.drafts)):
            if len(drafts) < j:
                continue
            row.output_ids.append(drafts[j - 1])
            grammar = row.grammar
            if grammar is None or self.refused[i]:
                continue
            if grammar.accept_token(drafts[j - 1]):
                self.advanced[i] += 1
            else:
                self.refused[i] = True

    def restore(self) -> None:
        for row, n, advanced in zip(self.inp.rows, self.lengths, self.advanced):
            del row.output_ids[n:]
            if advanced:
                row.grammar.rollback(advanced)


class _WatermarkPositions:
    """The watermark rows' state after each position of a verify; commit() keeps, per request,
    the state after the last position it emits (its tail then ends with the emitted tokens, and
    only the contexts of emitted positions count as forced)."""

    def __init__(self, sampler: DrawingSampler, inp: VerifyInput) -> None:
        if sampler.watermark_state is None or inp.token_store is None:
            raise ValueError("watermark: this sampler has no watermark state (--enable-watermark) or no request slots.")
        self.state = sampler.watermark_state
        self.rows = inp.info.watermark.rows  # [W] int64 batch rows
        self.slots = inp.token_store[1].index_select(0, self.rows)  # [W] int64 request slots
        self.after: list[tuple[torch.Tensor, ...]] = []  # per position: (tails [W, H], lengths [W], counts [W])

    def record(self) -> None:
        self.after.append(self.state.snapshot(self.slots))

    def commit(self, accepted: torch.Tensor) -> None:
        """accepted [B] int64 (device): request i emits positions 0..accepted[i]."""
        last = accepted.index_select(0, self.rows)  # [W]
        columns = torch.arange(self.rows.shape[0], device=last.device)  # [W]
        kept = tuple(torch.stack(parts)[last, columns] for parts in zip(*self.after))  # each [W, ...]
        self.state.restore(self.slots, kept)
