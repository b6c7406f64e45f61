"""The finished beams of a beam-search request, as they travel scheduler -> detokenizer ->
tokenizer manager (import-light: io_struct pulls it into every process)."""

from __future__ import annotations

from typing import Any, Optional

import msgspec


class BeamSequence(msgspec.Struct):
    """One returned beam: its generated ids (no prompt), how it ended and its score."""

    output_ids: list[int]
    finish_reason: dict[str, Any]  # {"type": "stop", "matched": id | str} | {"type": "length", "length": n}
    sequence_score: float  # cum_logprob / len(output_ids) ** length_penalty
    text: Optional[str] = None  # filled by the detokenizer
    matched_text: Optional[str] = None  # the text a stop string / stop_regex matched (where the text is cut)
