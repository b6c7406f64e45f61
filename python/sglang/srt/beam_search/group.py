"""The search state of one beam-search request: its live beam rows, their cumulative
log-probabilities and the pool of finished beams, and the final ranking.

A request of width k decodes as k rows of the running batch: the leader (the request itself)
and k - 1 member rows spawned after the leader's prefill. Each row's output ids are its beam's
history; a row re-pointed at another beam (a fork) takes that beam's history and K/V."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from sglang.srt.beam_search.selection import beam_score
from sglang.srt.beam_search.types import BeamSequence


@dataclass
class FinishedBeam:
    output_ids: list[int]
    cum_logprob: float
    matched: Union[int, str, None]  # the stop token, stop string or stop_regex that ended it; None: by length
    matched_text: Optional[str] = None  # the text a stop string or stop_regex matched


@dataclass
class BeamGroup:
    width: int
    num_return: int  # the request's n: how many of the best beams are returned
    length_penalty: float
    max_new_tokens: int
    stop_ids: list[int]  # stop_token_ids, plus the EOS ids unless ignore_eos
    rows: list[Any] = field(default_factory=list)  # the leader Req first, then the member Reqs
    cum_logprobs: list[float] = field(default_factory=lambda: [0.0])  # one per live row
    finished: list[FinishedBeam] = field(default_factory=list)
    reserved_rows: list[int] = field(default_factory=list)  # member request slots held until the spawn
    done: bool = False

    @property
    def leader(self) -> Any:
        return self.rows[0]

    def spawned(self) -> bool:
        return len(self.rows) > 1

    def generated(self) -> int:
        """Tokens each live beam has generated (the beams advance in lockstep)."""
        return len(self.leader.output_ids)

    def final_step(self) -> bool:
        """The next selection gives the beams their last allowed token."""
        return self.generated() + 1 >= self.max_new_tokens

    def results(self) -> list[BeamSequence]:
        """The n best finished beams, best first (ties keep the order they finished in)."""
        ranked = sorted(
            self.finished,
            key=lambda b: beam_score(b.cum_logprob, len(b.output_ids), self.length_penalty),
            reverse=True,
        )[: self.width]
        return [_sequence(b, self.length_penalty) for b in ranked[: self.num_return]]


def _sequence(beam: FinishedBeam, length_penalty: float) -> BeamSequence:
    n = len(beam.output_ids)
    if beam.matched is not None:
        reason = {"type": "stop", "matched": beam.matched}
    else:
        reason = {"type": "length", "length": n}
    score = beam_score(beam.cum_logprob, n, length_penalty)
    return BeamSequence(beam.output_ids, reason, score, matched_text=beam.matched_text)
