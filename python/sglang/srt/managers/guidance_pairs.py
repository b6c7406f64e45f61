"""The guide context of a guided request (sampling_params.guidance) as a second sequence of the
scheduler, paired with its request.

A GuideReq has its own request row, KV slots and prefix-cache use, and shares everything else
with its main request: its output ids are the main request's list (both contexts continue with
the same sampled tokens), its end is the main request's, and aborting it aborts the main
request. The pair is admitted together (both prompts whole, in one prefill step), each of its
prefill and decode steps runs both rows, and the pair is released together. The guide row
never samples: the main row's step mixes its logits in (sampling/guidance.py), and the main
row's sampled id is the guide row's next input (ModelRunner, via `Step.guide_rows`).
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from sglang.srt.managers.request_intake import InvalidRequest, kv_budget
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import release_kv
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.guidance_params import guide_prompt


class GuideReq(Req):
    """The guide context of `main`: never sent to the client, finished when `main` is."""

    is_guide = True

    def __init__(self, main: Req) -> None:
        super().__init__(main.rid + ":guide", guide_prompt(main.sampling_params.guidance), main.sampling_params)
        self.main = main
        self.output_ids = main.output_ids  # the same list: the guide continues with the main's tokens
        self.extra_key = main.extra_key
        self.finish_sent = True  # nothing of it goes to the detokenizer

    def finished(self) -> bool:
        return self.main.finished()

    def abort(self, message: str, status_code: int = 400, err_type: str = "BadRequestError") -> None:
        if not self.main.finished():
            self.main.abort(message, status_code=status_code, err_type=err_type)


class AdmissionPolicy(Protocol):
    """What pair admission reads of the SchedulePolicy."""

    max_running: int
    tree_cache: RadixCache

    def try_admit(self, req: Req, token_budget: int, reserved: int) -> Optional[int]: ...


def attach_guide(req: Req, context_len: int, max_total_tokens: int) -> None:
    """Give a guided request its GuideReq; InvalidRequest when the pair cannot run here."""
    if req.sampling_params.guidance is None:
        return
    guide = GuideReq(req)
    need = kv_budget(guide, context_len)
    if need > context_len:
        raise InvalidRequest(
            req, f"guidance.input_ids: the guide prompt ({len(guide.origin_input_ids)} tokens) plus max_new_tokens "
            f"exceeds the context length {context_len}."
        )
    if need + kv_budget(req, context_len) > max_total_tokens:
        raise InvalidRequest(req, f"guidance: the request and its guide context need {need + kv_budget(req, context_len)} "
                             f"KV-cache tokens together; the server holds {max_total_tokens}.")
    req.guide = guide


def with_guides(reqs: list[Req]) -> list[Req]:
    """`reqs` and the guide contexts of the guided ones: every request row they hold."""
    return reqs + [r.guide for r in reqs if r.guide is not None]


def remaining(req: Req) -> int:
    return len(req.origin_input_ids) - req.kv_len


def admit_pair(policy: AdmissionPolicy, req: Req, token_budget: int, reserved: int, admitted: int, first: bool) -> Optional[int]:
    """Admit a guided request and its guide context together, or neither: both rows, both KV
    budgets, and both whole remaining prompts within `token_budget` (unless the pair is the
    step's `first` entry, which takes them whole whatever the budget). Returns the KV tokens the
    pair may still claim; None leaves both waiting, holding nothing."""
    guide = req.guide
    if admitted + 2 > policy.max_running:
        return None
    need = policy.try_admit(req, token_budget, reserved)
    if need is None:
        return None
    need_guide = policy.try_admit(guide, token_budget, reserved + need)
    if need_guide is not None and (first or remaining(req) + remaining(guide) <= token_budget):
        return need + need_guide
    for r in (req, guide) if need_guide is not None else (req,):
        _unadmit(policy, r)
    return None


def _unadmit(policy: AdmissionPolicy, req: Req) -> None:
    release_kv(policy.tree_cache, req)
    req.kv_len = req.cached_tokens = 0


def release_guide(tree_cache: RadixCache, req: Req) -> None:
    """Release a finished request's guide context with it."""
    if req.guide is not None:
        release_kv(tree_cache, req.guide)


def guide_rows(forward_reqs: list[Req], sampled: list[Req]) -> list[int]:
    """Per guided sampled request, in order, the forward row of its guide context."""
    row_of = {id(r): i for i, r in enumerate(forward_reqs)}
    return [row_of[id(r.guide)] for r in sampled if r.guide is not None]


def guidance_alphas(result_alpha: Optional[tuple[list[int], torch.Tensor]]) -> dict[int, float]:
    """A step result's mixture alphas by sampled row (after the step's ready event)."""
    if result_alpha is None:
        return {}
    rows, values = result_alpha
    return dict(zip(rows, values.tolist()))
