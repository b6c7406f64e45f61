"""The device work of a speculative verify step: forward [last token, drafts] of every request
as one extend, then the Sampler's verify over every position's logits (layers/sampler_verify.py).
The emitted ids come back to the host with the step (the scheduler needs the accepted lengths to
place the next step); each request's last emitted id goes to `future_tokens` as a decode's does.
Under TP with the agreement check on (SGLANG_TP_CHECK_TOKEN_AGREEMENT), every rank's emitted ids
are compared after the verify, as a decode step's sampled ids are."""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from sglang.srt.distributed.communication import check_token_agreement
from sglang.srt.distributed.parallel_state import tp_device_group
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import Sampler
from sglang.srt.layers.sampler_verify import VerifyInput, VerifyOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.step import Step, StepResult
from sglang.srt.model_executor.step_output import output_logprobs
from sglang.srt.sampling.step_noise import step_noise_seed
from sglang.srt.utils import host_to_device

# Pads the emitted ids of a request that stopped short of the widest one in the agreement check.
NO_TOKEN = -1


class VerifyRunner(Protocol):
    """What a verify step uses of the ModelRunner."""

    sampler: Sampler
    noise_generator: torch.Generator
    random_seed: int
    check_token_agreement: bool  # TP: compare the ranks' emitted ids after every verify
    future_tokens: torch.Tensor  # [R + 1] int64: each request slot's last sampled id

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput: ...


def run_verify(runner: VerifyRunner, step: Step) -> StepResult:
    batch = step.forward_batch
    output = runner.forward(batch)  # every position of every request: [N, V] logits
    spec = step.spec
    # An extend returns them as its input logits; decode rows (one a token) as their next ones.
    logits = output.next_token_logits if output.input_token_logits is None else output.input_token_logits
    slots = batch.req_pool_indices if spec.req_slots is None else spec.req_slots  # [B] int64
    runner.noise_generator.manual_seed(step_noise_seed(runner.random_seed, step.index))
    asks = [req.logprob for req in step.reqs]
    verified = runner.sampler.verify_step(
        VerifyInput(
            logits=logits,
            info=step.sampling_info,
            rows=step.reqs,
            drafts=spec.drafts,
            starts=spec.starts,
            positions=step.positions,
            asks=asks,
            token_store=(runner.future_tokens, slots),
        )
    )
    if runner.check_token_agreement:
        _check_emitted_agreement(step, verified)
    return StepResult(
        next_ids=torch.empty(0, dtype=torch.int64),
        ready=None,
        row_errors=verified.row_errors,
        output_logprobs=[],
        input_logprobs={},
        spec_tokens=verified.tokens,
        spec_accepted=verified.accepted,
        spec_logprobs=_emitted_logprobs(verified, asks),
    )


def _emitted_logprobs(verified: VerifyOutput, asks: list) -> Optional[list[list[Optional[tuple]]]]:
    """Per request, the logprob entry of each emitted id: position j's row for its j-th id."""
    if all(a is None for a in asks):
        return None
    last = max(len(tokens) for tokens in verified.tokens)
    per_position = [output_logprobs(verified.position_logprobs[j], asks) for j in range(last)]
    return [[per_position[j][i] for j in range(len(tokens))] for i, tokens in enumerate(verified.tokens)]


def _check_emitted_agreement(step: Step, verified: VerifyOutput) -> None:
    """Every rank emitted the same ids (the same accepted lengths among them) for every request."""
    width = max(len(tokens) for tokens in verified.tokens)
    padded = [tokens + [NO_TOKEN] * (width - len(tokens)) for tokens in verified.tokens]
    emitted = host_to_device(padded, step.forward_batch.input_ids.device).view(len(padded), width)  # [B, W] int64
    check_token_agreement(emitted, step.index, [req.rid for req in step.reqs], tp_device_group())
