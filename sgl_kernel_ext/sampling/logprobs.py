"""Logprobs of chosen tokens from the sampling kernel's per-row statistics, no pass over the row.

The sampling kernel already computed each row's logsumexp over the scaled logits (and over the
kept support), so the logprob of token i is scaled[i] - lse: a gather, not a log_softmax over
[B, V]. Modes as in sglang.srt.layers.logprob_processor: `scaled` (full distribution) and
`processed` (renormalised over the support; tokens outside it get the float32 minimum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

FLOAT32_MIN = -3.4028234663852886e38
_FLOAT32_MIN = tl.constexpr(FLOAT32_MIN)


@triton.jit(do_not_specialize=["L"])
def _token_logprobs_kernel(
    logits_ptr, stride, temps_ptr, lse_ptr, thr_ptr, ids_ptr, out_ptr, L,
    PROCESSED: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < L
    ids = tl.load(ids_ptr + row.to(tl.int64) * L + offs, mask=live, other=0)
    ids = tl.maximum(ids, 0)  # -1 marks an invalid row's token; its logprob is meaningless
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + ids, mask=live, other=0.0)
    s = tl.math.div_rn(x, tl.load(temps_ptr + row))
    logprob = s - tl.load(lse_ptr + row)
    if PROCESSED:
        logprob = tl.where(s >= tl.load(thr_ptr + row), logprob, _FLOAT32_MIN)
    logprob = tl.where(logprob == logprob, tl.maximum(logprob, _FLOAT32_MIN), logprob)
    tl.store(out_ptr + row.to(tl.int64) * L + offs, logprob, mask=live)


def token_logprobs_triton(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    lse: torch.Tensor,
    threshold: torch.Tensor,
    ids: torch.Tensor,
    processed: bool,
) -> torch.Tensor:
    """Logprobs [B, L] float32 of tokens `ids` ([B, L] int64) under each row's scaled softmax.

    lse [B]: logsumexp of the scaled row (`scaled` mode) or of its kept support (`processed`);
    threshold [B]: the support's scaled-logit threshold (read in `processed` mode only)."""
    B, L = ids.shape
    ids = ids.contiguous()
    out = torch.empty(B, L, dtype=torch.float32, device=logits.device)
    if L > 0:
        launch(_token_logprobs_kernel, (B,),
            logits, logits.stride(0), temperatures.reshape(B), lse, threshold, ids, out, L,
            PROCESSED=processed, BLOCK=max(triton.next_power_of_2(L), 16), pdl=True,
        )
    return out


def token_logprobs_reference(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    lse: torch.Tensor,
    threshold: torch.Tensor,
    ids: torch.Tensor,
    processed: bool,
) -> torch.Tensor:
    scaled = logits.gather(1, ids.clamp(min=0)) / temperatures.reshape(-1, 1)  # [B, L]
    logprobs = scaled - lse.unsqueeze(1)
    if processed:
        logprobs = torch.where(scaled >= threshold.unsqueeze(1), logprobs, torch.full_like(logprobs, FLOAT32_MIN))
    return logprobs.clamp(min=FLOAT32_MIN)
