"""Plain-torch reference for the MoE experts kernel: every (token, slot) pair gathers its
expert's weights, in float32, with the intermediate activation rounded to the model dtype as the
kernel stores it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_experts_reference(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor
) -> torch.Tensor:
    """x [N, H]; w13 [E, 2I, H] (gate | up); w2 [E, H, I]; topk_weights [N, k]; local_ids [N, k]
    (ids outside [0, E) contribute zero) -> sum_j weight_j * w2 @ (silu(gate) * up) [N, H] in x's dtype."""
    num_experts, inter = w13.shape[0], w2.shape[2]
    ids = local_ids.long()
    live = (ids >= 0) & (ids < num_experts)  # [N, k]
    safe = torch.where(live, ids, 0)
    gate_up = torch.einsum("nh,nkoh->nko", x.float(), w13[safe].float())  # [N, k, 2I]
    act = (F.silu(gate_up[..., :inter]) * gate_up[..., inter:]).to(x.dtype).float()  # [N, k, I]
    down = torch.einsum("nki,nkhi->nkh", act, w2[safe].float())  # [N, k, H]
    weights = torch.where(live, topk_weights.float(), 0.0).unsqueeze(-1)  # [N, k, 1]
    return (down * weights).sum(dim=1).to(x.dtype)
