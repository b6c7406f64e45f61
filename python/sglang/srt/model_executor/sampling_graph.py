"""The sampling step inside a CUDA graph (`--sampling-backend triton`).

For every decode bucket the graph runner captures a second graph over the decode graph's logits:
penalties and logit bias (through the device's penalty table), the unseeded rows' seeds from the
step's noise, the triton sampler's kernels, the penalty update, and the sampled ids into the
runner's `future_tokens`. Its inputs live at fixed addresses:
- the per-row parameters (temperature, top-k, top-p, min-p, request seeds) in `SamplingInputBuffers`,
  copied on the device only when the batch's SamplingBatchInfo was rebuilt (requests joined or left);
- the step's noise, drawn into its buffer by the same generator call as the eager path, so a step
  draws the same tokens replayed or eager, and every TP rank the same noise;
- the positions and request slots of the decode graph's own input buffers;
- the penalty table (sgl_kernel_ext/sampling/penalties.py), rewritten when a penalty list moves.
Padding rows sample garbage from stale parameters and are never read; the penalty kernels skip them.

Guided rows (sampling_params.guidance) whose guide contexts run on the served model are mixed with
their guide rows first (sampling/guidance_graph.py), in a graph variant of their own: one without
and one with the kl_symmetry bisection, so a batch pays only for what its rows ask. With
--enable-watermark each of those has a watermarked twin, which forces the watermarked rows' tokens
from the sampling kernel's support statistics and pushes every such row's token onto its context
(sampling/watermarking/graph.py). The guide rows
follow the sampled rows in the decode graph's logits and sample garbage like padding rows; the
runner writes each one's next input (its main row's id) after the replay, as on the eager path.

The Sampler replays it (the graph runner is its GraphSampling) for a decode batch that needs no host
work and no output the graph does not produce (Sampler.graph_step_applies, decided once per batch
composition): no custom logit processors, no batch-level logits processors (they run on the host's
view of the batch between the penalties and the draw), no logprobs, no grammar's vocab mask, no
TP token all-reduce, no guide context on the guide model (its logits come from another forward). A custom penalizer (no fused representation) samples eagerly too, and the
runner attaches no graph when the TP agreement check reads every step's ids.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.sampler import Sampler
from sglang.srt.layers.triton_sampling_backend import TritonBackend, draw_noise, row_seed_offsets, unseeded_seeds
from sglang.srt.model_executor.step import Step
from sglang.srt.sampling.fused_logits_bias import penalty_table, record_fused_update, write_penalty_table
from sglang.srt.sampling.guidance_graph import GuidanceGraphInputs, mix_in_graph
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.watermarking.graph import WatermarkGraphInputs

# A sampling graph variant: (guidance: None without guided rows, else whether one picks its alpha by
# kl_symmetry; whether some row is watermarked).
GraphVariant = tuple[Optional[bool], bool]
_GUIDANCE_VARIANTS: tuple[Optional[bool], ...] = (None, False, True)


# Largest bucket that also captures the guided variants: their mix holds several [bs, V] float32
# temporaries in the graph pool, and larger guided batches are rare (they sample eagerly).
GUIDED_GRAPH_MAX_BS = 256


def graph_variants(watermark: bool, bs: int) -> list[GraphVariant]:
    """The variants a bucket of `bs` rows captures: the watermarked ones only with a watermark
    state, the guided ones up to GUIDED_GRAPH_MAX_BS rows."""
    guidance = _GUIDANCE_VARIANTS if bs <= GUIDED_GRAPH_MAX_BS else (None,)
    return [(g, w) for w in ((False, True) if watermark else (False,)) for g in guidance]


def graph_variant(info: SamplingBatchInfo) -> GraphVariant:
    """The variant that samples `info`'s batch."""
    guidance = None if info.guidance is None else info.guidance.kl_rows is not None
    return guidance, info.watermark is not None


def sampling_graph_supported(sampler: Sampler) -> bool:
    """The built-in Sampler over the triton backend (a Sampler subclass may do anything)."""
    return type(sampler) is Sampler and isinstance(sampler.backend, TritonBackend)


def needs_eager_sampling(step: Step, sampler: Sampler, check_token_agreement: bool) -> bool:
    """Whether `step` must sample eagerly even after its decode forward replayed a graph."""
    wants_logprobs = any(req.logprob is not None for req in step.reqs)
    return check_token_agreement or not sampler.graph_step_applies(step.sampling_info, wants_logprobs)


class SamplingInputBuffers:
    """The sampling graphs' per-row inputs, [max_bs] each, and the sampler's scratch."""

    def __init__(self, max_bs: int, vocab_size: int, device: torch.device) -> None:
        from sgl_kernel_ext.sampling.sample import new_workspace

        def static(fill, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((max_bs,), fill, dtype=dtype, device=device)  # [max_bs]

        self.temperatures = static(1.0, torch.float32)
        self.top_ks = static(1, torch.int32)  # greedy until a batch is loaded
        self.top_ps = static(1.0, torch.float32)
        self.log_min_ps = static(float("-inf"), torch.float32)
        self.request_seeds = static(0, torch.int64)
        self.seeded = static(False, torch.bool)
        self.seed_offsets = row_seed_offsets(max_bs, device)  # [max_bs] int64
        self.noise = torch.zeros(1, dtype=torch.int64, device=device)  # [1] int64, drawn every step
        self.workspace = new_workspace(max_bs, vocab_size, device)
        self._loaded: Optional[torch.Tensor] = None  # the loaded info's temperatures (new on every rebuild)

    def load(self, info: SamplingBatchInfo) -> None:
        """Copy the batch's parameters in, unless they are already there."""
        if self._loaded is info.temperatures:
            return
        rows = len(info)
        self.temperatures[:rows].copy_(info.temperatures.reshape(-1))
        self.top_ks[:rows].copy_(info.top_ks)
        self.top_ps[:rows].copy_(info.top_ps)
        torch.log(info.min_ps, out=self.log_min_ps[:rows])
        if info.seeded_mask is None:
            self.seeded[:rows].fill_(False)
        else:
            self.seeded[:rows].copy_(info.seeded_mask)
            self.request_seeds[:rows].copy_(info.sampling_seed)
        self._loaded = info.temperatures


def sample_in_graph(
    logits: torch.Tensor,
    inputs: SamplingInputBuffers,
    positions: torch.Tensor,
    req_pool_indices: torch.Tensor,
    future_tokens: torch.Tensor,
    guidance: Optional[GuidanceGraphInputs] = None,
    variant: GraphVariant = (None, False),
    watermark: Optional[WatermarkGraphInputs] = None,
) -> torch.Tensor:
    """What a sampling graph captures, over `logits` ([bs, V] float32, the decode graph's output):
    [bs] int64 next ids, -1 on invalid rows. `variant` (graph_variants): mix the guided rows of
    `guidance` first (with the kl_symmetry bisection when its first item is True), and force the
    watermarked rows of `watermark` when its second is True."""
    from sgl_kernel_ext.sampling.penalties import apply_penalties_triton, update_penalties_triton
    from sgl_kernel_ext.sampling.sample import sample_triton

    bs = logits.shape[0]
    guided, watermarked = variant
    if guided is not None:
        mix_in_graph(logits, guidance, with_kl=guided)
    table = penalty_table(logits.device)
    apply_penalties_triton(logits, table)
    seeds = torch.where(inputs.seeded[:bs], inputs.request_seeds[:bs], unseeded_seeds(inputs.noise, inputs.seed_offsets[:bs]))
    result = sample_triton(
        logits, inputs.temperatures[:bs], inputs.top_ks[:bs], inputs.top_ps[:bs], inputs.log_min_ps[:bs], seeds, positions,
        workspace=inputs.workspace,
    )
    ids = result.ids
    if watermarked:
        forced = watermark.force(logits, inputs.temperatures[:bs], result, req_pool_indices)
        ids = torch.where((forced >= 0) & ~result.invalid, forced, ids)
        watermark.append(req_pool_indices, ids)
    update_penalties_triton(ids, table)
    future_tokens.index_copy_(0, req_pool_indices, ids)
    return ids


def prepare_capture(device: torch.device) -> None:
    """Before warming up and capturing sample_in_graph: the penalty table may still point at the
    lists of a batch that is gone, and the warm-up runs its kernels for real."""
    penalty_table(device).clear()


def prepare_replay(
    inputs: SamplingInputBuffers, info: SamplingBatchInfo, generator: torch.Generator,
    guidance: Optional[GuidanceGraphInputs] = None, padded: int = 0, watermark: Optional[WatermarkGraphInputs] = None,
) -> bool:
    """Point the graph's inputs at this step's batch (its guided rows' at `guidance`, its
    watermarked rows' at `watermark`, over the `padded` rows of its bucket); False when its
    penalties need the torch path."""
    if not write_penalty_table(info, inputs.noise.device):
        return False
    inputs.load(info)
    if info.guidance is not None:
        guidance.load(info.guidance, len(info), padded)
    if info.watermark is not None:
        watermark.load(info.watermark, padded)
    draw_noise(generator, inputs.noise.device, out=inputs.noise)
    return True


def finish_replay(info: SamplingBatchInfo) -> None:
    """Host bookkeeping of the penalty state the replay updated."""
    record_fused_update(info)
