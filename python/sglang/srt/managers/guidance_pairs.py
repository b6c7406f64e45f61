"""The guide context of a guided request (sampling_params.guidance) as a second sequence of the
scheduler, paired with its request.

A GuideReq has its own request row, KV slots and prefix-cache use, and shares everything else
with its main request: its output ids are the main request's list (both contexts continue with
the same sampled tokens), its end is the main request's, and aborting it aborts the main
request. The pair is admitted together and prefilled as one unit under --chunked-prefill-size:
each of its prefill steps takes the guide prompt's next tokens, then the main prompt's, within
the step's budget, and both prompts end in the same step, where the main row samples
(pair_chunk_lens); meanwhile the pair is the scheduler's request mid-prefill. Each decode step
runs both rows, and the pair is released together. The guide row
never samples: the main row's step mixes its logits in (sampling/guidance.py), and the main
row's sampled id is the guide row's next input (ModelRunner, via `Step.guide_rows`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Protocol

import torch

from sglang.srt.managers.request_intake import InvalidRequest, kv_budget
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import release_kv
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.guidance_params import guide_prompt


class KVSide(NamedTuple):
    """Where a sequence's KV lives: a model's prefix cache and request table."""

    tree_cache: RadixCache
    pool: ReqToTokenPool


class GuideReq(Req):
    """The guide context of `main`: never sent to the client, finished when `main` is. `side` is
    the guide model's KV (guidance "model": "guide"), None for the served model's."""

    is_guide = True

    def __init__(self, main: Req, side: Optional[KVSide] = None) -> None:
        super().__init__(main.rid + ":guide", guide_prompt(main.sampling_params.guidance), main.sampling_params)
        self.main = main
        self.side = side
        self.output_ids = main.output_ids  # the same list: the guide continues with the main's tokens
        self.extra_key = main.extra_key
        self.finish_sent = True  # nothing of it goes to the detokenizer

    def finished(self) -> bool:
        return self.main.finished()

    def abort(self, message: str, status_code: int = 400, err_type: str = "BadRequestError") -> None:
        if not self.main.finished():
            self.main.abort(message, status_code=status_code, err_type=err_type)


class AdmissionPolicy(Protocol):
    """What pair admission and chunking read of a SchedulePolicy."""

    max_running: int
    tree_cache: RadixCache
    fixed_chunk: Optional[int]  # the deterministic mode's fixed chunk size

    def chunk_len(self, req: Req, budget: int) -> int: ...

    def try_admit(self, req: Req, token_budget: int, reserved: int) -> Optional[int]: ...


class GuideSide(Protocol):
    """What the scheduler reads of the guide model (managers/guide_model.py)."""

    side: KVSide
    policy: AdmissionPolicy
    max_total_tokens: int


def attach_guide(req: Req, context_len: int, max_total_tokens: int, guide_model: Optional[GuideSide]) -> None:
    """Give a guided request its GuideReq; InvalidRequest when the pair cannot run here."""
    guidance = req.sampling_params.guidance
    if guidance is None:
        return
    on_guide_model = guidance.get("model", "self") == "guide"
    if on_guide_model and guide_model is None:
        raise InvalidRequest(req, "guidance.model 'guide' needs a guide model, and this server loads none (--guide-model-path).")
    guide = GuideReq(req, guide_model.side if on_guide_model else None)
    need = kv_budget(guide, context_len)
    if need > context_len:
        raise InvalidRequest(
            req, f"guidance.input_ids: the guide prompt ({len(guide.origin_input_ids)} tokens) plus max_new_tokens "
            f"exceeds the context length {context_len}."
        )
    together = need + (0 if on_guide_model else kv_budget(req, context_len))
    capacity = guide_model.max_total_tokens if on_guide_model else max_total_tokens
    if together > capacity:
        raise InvalidRequest(req, f"guidance: the guide context needs {together} KV-cache tokens (with its request on "
                             f"the same model); its model's cache holds {capacity}.")
    req.guide = guide


def on_served_model(reqs: list[Req]) -> list[Req]:
    """The requests and guide contexts whose KV is the served model's."""
    return [r for r in reqs if not (r.is_guide and r.side is not None)]


def on_guide_model(reqs: list[Req]) -> list[Req]:
    return [r for r in reqs if r.is_guide and r.side is not None]


def with_guides(reqs: list[Req]) -> list[Req]:
    """`reqs` and the guide contexts of the guided ones: every request row they hold."""
    return reqs + [r.guide for r in reqs if r.guide is not None]


def remaining(req: Req) -> int:
    return len(req.origin_input_ids) - req.kv_len


def final_chunk_len(req: Req, fixed_chunk: Optional[int]) -> int:
    """The prompt tokens a pair member keeps for the pair's last prefill step: its last token, or
    in the deterministic mode its last fixed chunk (so its chunks are the same in every batch)."""
    left = remaining(req)
    if fixed_chunk is None:
        return min(1, left)
    n = len(req.origin_input_ids)
    return min(left, n - (n - 1) // fixed_chunk * fixed_chunk)


def pair_chunk_lens(policy: AdmissionPolicy, req: Req, token_budget: int, first: bool) -> tuple[int, int]:
    """(guide, main) prompt tokens of a guided pair's next prefill step within `token_budget`.
    Both prompts end in the same step, the one where the main row samples (it needs the guide's
    logits at the guide prompt's end): it takes both rests, when they fit the budget (or the pair
    is the step's `first` entry and holds only what it kept for it). Until then a step takes the
    guide prompt's next tokens, then the main prompt's, each short of the part it keeps
    (final_chunk_len), so a step may carry the guide's tokens alone. (0, 0): nothing fits."""
    guide = req.guide
    rest_guide, rest_main = remaining(guide), remaining(req)
    keep_guide, keep_main = final_chunk_len(guide, policy.fixed_chunk), final_chunk_len(req, policy.fixed_chunk)
    ends = policy.chunk_len(guide, rest_guide) == rest_guide and policy.chunk_len(req, rest_main) == rest_main
    if ends and (rest_guide + rest_main <= token_budget or (first and (rest_guide, rest_main) == (keep_guide, keep_main))):
        return rest_guide, rest_main
    g = min(policy.chunk_len(guide, token_budget), rest_guide - keep_guide)
    return g, min(policy.chunk_len(req, token_budget - g), rest_main - keep_main)


def admit_pair(
    policy: AdmissionPolicy, guide_policy: AdmissionPolicy, req: Req, token_budget: int, reserved: tuple[int, int],
    admitted: int, first: bool,
) -> Optional[tuple[int, int, int, int]]:
    """Admit a guided request and its guide context together, or neither: both rows, both KV
    budgets, and the pair's first prefill chunks (pair_chunk_lens) within `token_budget`.
    `guide_policy` admits on the guide context's model (`policy` itself for the served model);
    `reserved` is what the admitted sequences may still claim on (the served model, the guide
    model). Returns the KV tokens the request and its guide may still claim and the step's
    (guide, main) prompt tokens; None leaves both waiting, holding nothing."""
    guide = req.guide
    if admitted + 2 > policy.max_running:
        return None
    need = policy.try_admit(req, token_budget, reserved[0])
    if need is None:
        return None
    same_pool = guide_policy is policy
    need_guide = guide_policy.try_admit(guide, token_budget, reserved[0] + need if same_pool else reserved[1])
    if need_guide is not None:
        lens = pair_chunk_lens(policy, req, token_budget, first)
        if sum(lens) > 0:
            return need, need_guide, *lens
    _unadmit(policy, req)
    if need_guide is not None:
        _unadmit(guide_policy, guide)
    return None


def _unadmit(policy: AdmissionPolicy, req: Req) -> None:
    release_kv(policy.tree_cache, req)
    req.kv_len = req.cached_tokens = 0


def release_guide(tree_cache: RadixCache, req: Req) -> None:
    """Release a finished request's guide context with it (uncached if a failed step wrote the
    request's KV: the guide's may be from the same step)."""
    guide = req.guide
    if guide is None:
        return
    guide.kv_failed = guide.kv_failed or req.kv_failed
    release_kv(guide.side.tree_cache if guide.side is not None else tree_cache, guide)


def guide_rows(forward_reqs: list[Req], guide_forward_reqs: list[Req], sampled: list[Req]) -> list[int]:
    """Per guided sampled request, in order, the row of its guide context's logits among the
    step's forward rows followed by its guide-model forward rows."""
    row_of = {id(r): i for i, r in enumerate(forward_reqs)}
    row_of.update({id(r): len(forward_reqs) + i for i, r in enumerate(guide_forward_reqs)})
    return [row_of[id(r.guide)] for r in sampled if r.guide is not None]


def guidance_alphas(result_alpha: Optional[tuple[list[int], torch.Tensor]]) -> dict[int, float]:
    """A step result's mixture alphas by sampled row (after the step's ready event)."""
    if result_alpha is None:
        return {}
    rows, values = result_alpha
    return dict(zip(rows, values.tolist()))
