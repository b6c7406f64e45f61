"""The step of a fused sampling backend: greedy rows, NaN guard, temperature, filters, every row's
draw and the logprob statistics run in the backend's own kernels; the logits stay unscaled."""

from __future__ import annotations

import torch

from sglang.srt.layers.sampler_io import FUSED_STEP, StepCall, StepOwner, flag_failed_rows


class FusedStep:
    name = FUSED_STEP

    def __init__(self, owner: StepOwner) -> None:
        self.owner = owner

    def __call__(self, call: StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        output, info, row_errors, positions, logprobs, forced_ids, force_after = call
        backend = self.owner.backend
        logits = output.next_token_logits
        result = None
        if info.is_all_greedy and logprobs is None:
            next_ids, invalid = backend.greedy(logits)
        else:
            result = backend.sample_step(logits, info, positions, self.owner.generator)
            next_ids, invalid = result.ids, result.invalid
            if force_after is not None:
                forced_ids = force_after(logits, result)
        if forced_ids is not None:  # an invalid row (NaN logits) stays -1 even where forced
            next_ids = torch.where((forced_ids >= 0) & ~invalid, forced_ids, next_ids)
        if row_errors:
            invalid = flag_failed_rows(invalid, row_errors)
            next_ids = torch.where(invalid, torch.full_like(next_ids, -1), next_ids)
        if logprobs is not None:
            backend.fill_logprobs(output, logits, info, result, self.owner.logprobs_mode, next_ids, *logprobs)
        return next_ids, invalid
