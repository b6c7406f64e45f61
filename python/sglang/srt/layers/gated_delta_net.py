"""Gated DeltaNet: Qwen3-Next's linear-attention token mixer, reading and writing each request's
conv and recurrent state in the step's RecurrentStatePool (indexed by `req_pool_indices`).

On CUDA, flash-linear-attention's Triton kernels (package `fla-core`, optional) run the delta
rule where importable; everywhere else the torch reference of layers/gated_delta_rule.py does."""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.batch_invariant import pointwise
from sglang.srt.layers.gated_delta_rule import (
    causal_conv1d,
    causal_conv1d_step,
    chunked_gated_delta_rule,
    prepare_qk,
    recurrent_step,
)
from sglang.srt.layers.linear import ColumnParallelLinear, RowParallelLinear, default_weight_loader, make_param
from sglang.srt.layers.zero_centered_norm import GatedRMSNorm
from sglang.srt.mem_cache.recurrent_state_pool import RecurrentStatePool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

logger = logging.getLogger(__name__)


class GatedDeltaNetShape(NamedTuple):
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        """Channels of the conv1d: q, k and v side by side."""
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim


class _Conv1d(nn.Module):
    """Holds the depthwise conv1d weight [C, 1, K] under the checkpoint's name."""

    def __init__(self, channels: int, kernel: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = make_param((channels, 1, kernel), dtype, default_weight_loader)


class GatedDeltaNet(nn.Module):
    def __init__(self, shape: GatedDeltaNetShape, state_layer: int, eps: float, dtype: torch.dtype) -> None:
        """state_layer: this layer's index among the model's linear-attention layers (its slice
        of the state pool)."""
        super().__init__()
        self.shape, self.state_layer = shape, state_layer
        s = shape
        key_dim, value_dim = s.num_k_heads * s.head_k_dim, s.num_v_heads * s.head_v_dim
        self.in_proj_qkvz = ColumnParallelLinear(s.hidden_size, 2 * key_dim + 2 * value_dim, params_dtype=dtype)
        self.in_proj_ba = ColumnParallelLinear(s.hidden_size, 2 * s.num_v_heads, params_dtype=dtype)
        self.conv1d = _Conv1d(s.conv_dim, s.conv_kernel, dtype)
        self.dt_bias = make_param((s.num_v_heads,), dtype, default_weight_loader)
        self.A_log = make_param((s.num_v_heads,), dtype, default_weight_loader)
        self.norm = GatedRMSNorm(s.head_v_dim, eps, params_dtype=dtype)
        self.out_proj = RowParallelLinear(value_dim, s.hidden_size, params_dtype=dtype)

    def forward(self, x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """x [N, hidden] -> [N, hidden]; updates the batch's rows of the state pool."""
        s, n = self.shape, x.shape[0]
        mixed, z, b, a = self._project(x)
        pool = forward_batch.state_pool
        rows = forward_batch.req_pool_indices  # [B]
        conv_state = pool.conv[self.state_layer].index_select(0, rows)  # [B, C, K-1]
        weight = self.conv1d.weight[:, 0]  # [C, K]
        decode = forward_batch.forward_mode.is_decode()
        if decode:
            mixed, conv_state = causal_conv1d_step(mixed, conv_state, weight)
        else:
            mixed, conv_state = _conv_per_request(mixed, conv_state, weight, forward_batch.extend_seq_lens_cpu)
        pool.conv[self.state_layer].index_copy_(0, rows, conv_state)
        key_dim = s.num_k_heads * s.head_k_dim
        q, k, v = mixed.split([key_dim, key_dim, s.num_v_heads * s.head_v_dim], dim=-1)
        q, k = q.view(n, s.num_k_heads, s.head_k_dim), k.view(n, s.num_k_heads, s.head_k_dim)
        v = v.view(n, s.num_v_heads, s.head_v_dim)
        beta = pointwise(torch.sigmoid, b)  # [N, Hv]
        g = -self.A_log.float().exp() * pointwise(F.softplus, a.float() + self.dt_bias)  # [N, Hv] float32, log decay
        out = self._delta_rule(q, k, v, g, beta, pool, rows, forward_batch, decode)  # [N, Hv, Dv]
        out = self.norm(out.to(x.dtype), z)  # [N, Hv, Dv]
        return self.out_proj(out.reshape(n, -1))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> mixed q|k|v [N, C], z [N, Hv, Dv], b and a [N, Hv]. The projections are grouped by key
        head: per key head [q (Dk), k (Dk), v (r Dv), z (r Dv)] and [b (r), a (r)], r = Hv / Hk."""
        s, n = self.shape, x.shape[0]
        r = s.num_v_heads // s.num_k_heads
        qkvz = self.in_proj_qkvz(x).view(n, s.num_k_heads, 2 * s.head_k_dim + 2 * r * s.head_v_dim)
        q, k, v, z = qkvz.split([s.head_k_dim, s.head_k_dim, r * s.head_v_dim, r * s.head_v_dim], dim=-1)
        b, a = self.in_proj_ba(x).view(n, s.num_k_heads, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=-1)  # [N, C]
        return mixed, z.reshape(n, s.num_v_heads, s.head_v_dim), b.reshape(n, -1), a.reshape(n, -1)

    def _delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        pool: RecurrentStatePool,
        rows: torch.Tensor,
        forward_batch: ForwardBatch,
        decode: bool,
    ) -> torch.Tensor:
        """-> [N, Hv, Dv]; the rows' recurrent states in the pool move past this step's tokens."""
        state = pool.state[self.state_layer].index_select(0, rows)  # [B, Hv, Dk, Dv] float32
        fla = fla_ops() if q.is_cuda else None
        if fla is not None:
            out, state = _fla_delta_rule(fla, q, k, v, g, beta, state, forward_batch, decode)
        elif decode:
            qn, kn = prepare_qk(q, k, self.shape.num_v_heads)
            out, state = recurrent_step(state, qn, kn, v.float(), g, beta.float())
        else:
            out, state = _delta_rule_per_request(q, k, v, g, beta, state, forward_batch.extend_seq_lens_cpu)
        pool.state[self.state_layer].index_copy_(0, rows, state)
        return out


def _conv_per_request(
    mixed: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, lens: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """mixed [N, C] (requests' tokens concatenated); conv_state [B, C, K-1] -> ([N, C], [B, C, K-1])."""
    outs, states = [], []
    for i, part in enumerate(mixed.split(lens)):
        out, state = causal_conv1d(part, conv_state[i], weight)
        outs.append(out)
        states.append(state)
    return torch.cat(outs), torch.stack(states)


def _delta_rule_per_request(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    lens: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's tokens in the chunked form from its own state; -> ([N, Hv, Dv], [B, Hv, Dk, Dv])."""
    num_v_heads = v.shape[1]
    qn, kn = prepare_qk(q, k, num_v_heads)
    outs, states = [], []
    parts = zip(qn.split(lens), kn.split(lens), v.float().split(lens), g.split(lens), beta.float().split(lens))
    for i, (qi, ki, vi, gi, bi) in enumerate(parts):
        out, final = chunked_gated_delta_rule(qi, ki, vi, gi, bi, state[i])
        outs.append(out)
        states.append(final)
    return torch.cat(outs), torch.stack(states)


def _fla_delta_rule(
    fla: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    forward_batch: ForwardBatch,
    decode: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-linear-attention's kernels (grouped value heads, q/k L2 norm and the Dk^-0.5 scale
    inside): a decode step is B sequences of one token; an extend is one packed sequence split by
    cu_seqlens. -> ([N, Hv, Dv], [B, Hv, Dk, Dv] float32)."""
    # Keyword arguments only: fla 0.6 put gk and gv between g and beta in the recurrent kernel's
    # signature, so a positional beta became a per-key decay there (NaN logits at decode).
    common = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if decode:
        out, final = fla.fused_recurrent_gated_delta_rule(
            q=q.unsqueeze(1), k=k.unsqueeze(1), v=v.unsqueeze(1), g=g.unsqueeze(1), beta=beta.unsqueeze(1), **common
        )  # out [B, 1, Hv, Dv]
        return out[:, 0], final.float()
    n = q.shape[0]
    cu_seqlens = torch.cat([forward_batch.extend_start_loc, forward_batch.extend_start_loc.new_full((1,), n)])  # [B + 1]
    cu_host = torch.tensor([0, *_cumsum(forward_batch.extend_seq_lens_cpu)], dtype=torch.int64)
    out, final = fla.chunk_gated_delta_rule(
        q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), g=g.unsqueeze(0), beta=beta.unsqueeze(0),
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_host, **common,
    )  # out [1, N, Hv, Dv]
    return out[0], final.float()


def _cumsum(values: list[int]) -> list[int]:
    total, out = 0, []
    for v in values:
        total += v
        out.append(total)
    return out


@functools.cache
def fla_ops() -> Optional[ModuleType]:
    """fla.ops.gated_delta_rule where flash-linear-attention is importable, else None (the torch
    reference runs)."""
    try:
        from fla.ops import gated_delta_rule
    except ImportError:
        logger.info("flash-linear-attention (fla-core) is not importable: Gated DeltaNet runs its torch reference.")
        return None
    return gated_delta_rule
