"""A request's sampling report on its way out: SGLang's return_sampling_mask (each output token's
sampling support and behaviour logprobs, sampling_logprobs_mode "selected" or "support") and
return_entropy, queued on the scheduler's Req until sent, then accumulated in the tokenizer
manager's request state and answered in meta_info under SGLang's keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.layers.sampling_report import ReportAsk, RowReport

SAMPLING_LOGPROBS_MODES = ("selected", "support")
DEFAULT_SAMPLING_MASK_MAX_TOKENS = 4096  # SGLang's --sampling-mask-max-tokens default


def report_ask(return_sampling_mask: bool, sampling_logprobs_mode: Optional[str], return_entropy: bool) -> Optional[ReportAsk]:
    """The scheduler's ask of a request's fields; None when it asks nothing (the common path)."""
    if not (return_sampling_mask or return_entropy):
        return None
    return ReportAsk(
        support=return_sampling_mask,
        support_logprobs=return_sampling_mask and sampling_logprobs_mode == "support",
        entropy=return_entropy,
    )


def overflow_message(max_tokens: int) -> str:
    return (
        f"Sampling support exceeds --sampling-mask-max-tokens={max_tokens}, commonly because of cutoff ties. "
        "Lower top_k to leave more headroom or increase the server limit."
    )


@dataclass
class PendingReport:
    """Reports of output tokens computed but not yet sent."""

    masks: list[list[int]] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)  # a float, or a list aligned with the mask
    entropy: list[float] = field(default_factory=list)

    def add(self, report: RowReport) -> None:
        if report.support is not None:
            self.masks.append(report.support)
            self.logprobs.append(report.logprobs)
        if report.entropy is not None:
            self.entropy.append(report.entropy)

    def message_fields(self, ask: Optional[ReportAsk]) -> dict[str, Any]:
        """TokenOut's fields for these reports (None where the request did not ask)."""
        return {
            "output_token_sampling_mask": self.masks if ask is not None and ask.support else None,
            "output_token_sampling_logprobs": self.logprobs if ask is not None and ask.support else None,
            "output_token_entropy_val": self.entropy if ask is not None and ask.entropy else None,
        }


def support_overflows(report: Optional[RowReport], max_tokens: int) -> bool:
    return report is not None and report.support is not None and len(report.support) > max_tokens


def accumulate(reports: dict[str, list[Any]], token: Any) -> None:
    """Extend a request state's report lists with a TokenOut's (the tokenizer manager side)."""
    for key in ("output_token_sampling_mask", "output_token_sampling_logprobs", "output_token_entropy_val"):
        rows = getattr(token, key)
        if rows is not None:
            reports.setdefault(key, []).extend(rows)


def meta_fields(reports: dict[str, list[Any]]) -> dict[str, Any]:
    """meta_info's report keys (copies), SGLang's names; the mask's length beside it."""
    meta = {key: list(rows) for key, rows in reports.items()}
    if "output_token_sampling_mask" in meta:
        meta["output_token_sampling_mask_length"] = len(meta["output_token_sampling_mask"])
    return meta
