"""The gated delta rule (Gated DeltaNet's token mixer) and its causal depthwise conv1d, in plain
torch: the reference every device runs, and the CPU path.

Per value head, with state S [Dk, Dv] (float32), for each token t:
    S <- exp(g_t) * S;  u_t = beta_t * (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t
with q and k L2-normalised (q also scaled by Dk^-0.5). `recurrent_step` is one token of a batch of
requests; `chunked_gated_delta_rule` computes the same recurrence for one sequence, a chunk of
tokens at a time with matrix products (the WY form), which is how a prefill runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang.srt.layers.batch_invariant import pointwise

CHUNK_SIZE = 64
L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) along the last dim, as the Qwen3-Next kernels normalise q and k."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [..., Hk, Dk] -> float32 [..., Hv, Dk]: each key head serves Hv / Hk consecutive value
    heads; both L2-normalised, q scaled by Dk^-0.5."""
    repeat = num_v_heads // q.shape[-2]
    q, k = (x.float().repeat_interleave(repeat, dim=-2) for x in (q, k))
    return l2norm(q) * q.shape[-1] ** -0.5, l2norm(k)


def recurrent_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. state [..., H, Dk, Dv]; q, k [..., H, Dk] (prepared); v [..., H, Dv];
    g, beta [..., H]; all float32 -> (output [..., H, Dv], new state)."""
    state = state * g.exp()[..., None, None]
    predicted = (state * k.unsqueeze(-1)).sum(dim=-2)  # [..., H, Dv]
    delta = (v - predicted) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (state * q.unsqueeze(-1)).sum(dim=-2), state


def recurrent_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence token by token. q, k [T, H, Dk] (prepared); v [T, H, Dv]; g, beta [T, H];
    state [H, Dk, Dv]; float32 -> (output [T, H, Dv], final state)."""
    outputs = []
    for t in range(q.shape[0]):
        out, state = recurrent_step(state, q[t], k[t], v[t], g[t], beta[t])
        outputs.append(out)
    return torch.stack(outputs), state


def chunked_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence of `recurrent_gated_delta_rule`, `chunk_size` tokens at a time; same
    arguments and result."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [H, T, D]
    g, beta = g.transpose(0, 1), beta.transpose(0, 1)  # [H, T]
    outputs = []
    for start in range(0, q.shape[1], chunk_size):
        span = slice(start, start + chunk_size)
        out, state = _chunk(q[:, span], k[:, span], v[:, span], g[:, span], beta[:, span], state)
        outputs.append(out)
    return torch.cat(outputs, dim=1).transpose(0, 1), state


def _chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of L tokens from state S0. With G_t = exp(g_1 + ... + g_t), the updates u_t solve
    u_t + beta_t sum_{j<t} (G_t / G_j) (k_t . k_j) u_j = beta_t (v_t - G_t S0^T k_t); then
    o_t = G_t S0^T q_t + sum_{j<=t} (G_t / G_j) (q_t . k_j) u_j and S_L = G_L S0 + sum_j (G_L / G_j) k_j u_j^T.
    q, k [H, L, Dk]; v [H, L, Dv]; g, beta [H, L]; state [H, Dk, Dv]."""
    length = q.shape[1]
    log_decay = g.cumsum(dim=-1)  # [H, L]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    # decay[h, t, j] = G_t / G_j for j <= t, else 0.
    decay = (log_decay.unsqueeze(-1) - log_decay.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()  # [H, L, L]
    weights = beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decay  # [H, L, L]; its diagonal is ignored below
    gain = log_decay.exp().unsqueeze(-1)  # [H, L, 1]
    lhs = torch.cat([beta.unsqueeze(-1) * v, beta.unsqueeze(-1) * gain * k], dim=-1)  # [H, L, Dv + Dk]
    solved = torch.linalg.solve_triangular(weights, lhs, upper=False, unitriangular=True)
    new_v, decayed_k = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    u = new_v - decayed_k @ state  # [H, L, Dv]
    out = (gain * q) @ state + ((q @ k.transpose(-1, -2)) * decay) @ u  # [H, L, Dv]
    last = log_decay[:, -1:]  # [H, 1]
    tail = (last - log_decay).exp().unsqueeze(-1)  # [H, L, 1]: G_L / G_j
    state = last.exp().unsqueeze(-1) * state + (tail * k).transpose(-1, -2) @ u
    return out, state


def causal_conv1d(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's depthwise causal conv1d, then SiLU. x [T, C]; conv_state [C, K-1], the
    inputs before x (oldest first; zeros at a request's start); weight [C, K]
    -> (output [T, C], the new conv state [C, K-1])."""
    window = torch.cat([conv_state.to(x.dtype), x.transpose(0, 1)], dim=-1)  # [C, K-1+T]
    out = F.conv1d(window.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), groups=weight.shape[0])  # [1, C, T]
    return F.silu(out[0]).transpose(0, 1).to(x.dtype), window[:, -(weight.shape[1] - 1):]


def causal_conv1d_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. x [B, C]; conv_state [B, C, K-1]; weight [C, K]
    -> (output [B, C], new conv state [B, C, K-1])."""
    window = torch.cat([conv_state.to(x.dtype), x.unsqueeze(-1)], dim=-1)  # [B, C, K]
    out = (window.float() * weight.float()).sum(dim=-1)  # [B, C], accumulated in float32 as a conv kernel does
    return pointwise(F.silu, out).to(x.dtype), window[..., 1:]
