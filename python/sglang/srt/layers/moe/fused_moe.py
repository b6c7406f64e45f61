"""The experts of a mixture-of-experts block: every expert's SiLU-gated MLP, run for the tokens
routed to it and summed with the routing weights.

Weights: w13 [E_local, 2 I_p, H] (each expert's gate rows, then its up rows) and
w2 [E_local, H, I_p], where I_p is this rank's slice of the expert intermediate size.

Parallelism inside the TP group (SGLang's layout): the tp_size ranks form ep_size expert groups
of moe_tp_size = tp_size / ep_size consecutive ranks. Rank r holds the experts
[ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) with ep_rank = r // moe_tp_size, and slice
moe_tp_rank = r % moe_tp_size of their intermediate dim. Tokens routed to another rank's experts
contribute zero here; the all-reduce over the TP group (as after RowParallelLinear) sums the
intermediate slices and the expert groups.

Paths: on CUDA the grouped-GEMM Triton kernel (sgl_kernel_ext.moe.fused_moe_triton); elsewhere
a loop over the experts that received tokens, in the model dtype like HF's expert loop.
"""

from __future__ import annotations

import functools
import importlib
import re
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.batch_invariant import is_batch_invariant, pointwise, row_blocked
from sglang.srt.layers.linear import make_param, tp_all_reduce_sum

# Checkpoint projection name -> FusedMoE shard id: gate (w1) and up (w3) fill w13, down (w2) fills w2.
EXPERT_SHARDS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "w1": "w1", "w3": "w3", "w2": "w2"}
_EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


def expert_weight_target(name: str) -> Optional[tuple[str, str, int]]:
    """A per-expert checkpoint tensor name -> (FusedMoE parameter name, shard id, expert id);
    None for other names. `...mlp.experts.3.gate_proj.weight` -> (`...mlp.experts.w13_weight`,
    "w1", 3); Mixtral's `experts.{e}.w1/w3/w2` likewise."""
    match = _EXPERT_NAME.match(name)
    if match is None:
        return None
    prefix, expert, proj = match.groups()
    shard = EXPERT_SHARDS[proj]
    return f"{prefix}.{'w2' if shard == 'w2' else 'w13'}_weight", shard, int(expert)


# Inside expert_parallel(ep_size): the load's --ep-size and how many FusedMoE layers took it.
_load_ep: Optional[list[int]] = None


@contextmanager
def expert_parallel(ep_size: int) -> Iterator[None]:
    """FusedMoE layers built inside the block without an explicit ep_size take `ep_size` (the
    server's --ep-size); with ep_size > 1, a model that built none is refused."""
    global _load_ep
    previous, _load_ep = _load_ep, [ep_size, 0]
    try:
        yield
        if ep_size > 1 and _load_ep[1] == 0:
            raise ValueError(f"--ep-size {ep_size} applies to mixture-of-experts models only; this model has no experts.")
    finally:
        _load_ep = previous


def _construction_ep_size() -> int:
    if _load_ep is None:
        return 1
    _load_ep[1] += 1
    return _load_ep[0]


def moe_parallel_ranks(tp_rank: int, tp_size: int, ep_size: int) -> tuple[int, int, int]:
    """-> (ep_rank, moe_tp_rank, moe_tp_size) of TP rank `tp_rank`."""
    if ep_size < 1 or tp_size % ep_size:
        raise ValueError(f"--ep-size {ep_size} must divide --tp-size {tp_size} (experts are split inside the TP group).")
    moe_tp_size = tp_size // ep_size
    return tp_rank // moe_tp_size, tp_rank % moe_tp_size, moe_tp_size


class FusedMoE(nn.Module):
    """Experts only: routing is topk.select_experts, the router's linear belongs to the model."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        params_dtype: torch.dtype = torch.float32,
        tp_rank: int = 0,
        tp_size: int = 1,
        ep_size: Optional[int] = None,
        reduce_results: bool = True,
    ) -> None:
        """ep_size None: the server's --ep-size (see expert_parallel), 1 outside a model load."""
        super().__init__()
        ep_size = _construction_ep_size() if ep_size is None else ep_size
        ep_rank, self.moe_tp_rank, moe_tp_size = moe_parallel_ranks(tp_rank, tp_size, ep_size)
        if num_experts % ep_size:
            raise ValueError(f"--ep-size {ep_size} does not divide the {num_experts} experts.")
        if intermediate_size % moe_tp_size:
            raise ValueError(
                f"The expert intermediate size {intermediate_size} is not divisible by tp_size / ep_size = {moe_tp_size}."
            )
        self.num_experts, self.top_k, self.tp_size = num_experts, top_k, tp_size
        self.num_local_experts = num_experts // ep_size
        self.expert_start = ep_rank * self.num_local_experts
        self.intermediate_per_partition = intermediate_size // moe_tp_size
        self.reduce_results = reduce_results
        e, i = self.num_local_experts, self.intermediate_per_partition
        self.w13_weight = make_param((e, 2 * i, hidden_size), params_dtype, self.weight_loader)
        self.w2_weight = make_param((e, hidden_size, i), params_dtype, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str, expert_id: int) -> None:
        """loaded: one expert's full HF tensor, gate/up [I, H] (shard "w1"/"w3") or down [H, I]
        ("w2"); `expert_id` is global, and experts of other EP ranks are skipped."""
        local = expert_id - self.expert_start
        if not 0 <= local < self.num_local_experts:
            return
        size, start = self.intermediate_per_partition, self.moe_tp_rank * self.intermediate_per_partition
        if shard_id == "w2":
            param.data[local].copy_(loaded.narrow(1, start, size))
        elif shard_id in ("w1", "w3"):
            offset = 0 if shard_id == "w1" else size
            param.data[local].narrow(0, offset, size).copy_(loaded.narrow(0, start, size))
        else:
            raise ValueError(f"Unknown expert shard id {shard_id!r} (w1, w2, w3).")

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [N, H], topk_weights [N, k] float32, topk_ids [N, k] global expert ids -> [N, H]:
        sum over k of weight * expert(x), all-reduced over the TP group when reduce_results."""
        local_ids = topk_ids if self.num_local_experts == self.num_experts else topk_ids - self.expert_start
        kernels = _triton_moe() if x.is_cuda else None
        if kernels is not None and kernels.fused_experts_triton_applies(x, self.w13_weight):
            out = kernels.fused_experts_triton(
                x, self.w13_weight, self.w2_weight, topk_weights, local_ids, batch_invariant=is_batch_invariant()
            )
        else:
            out = experts_torch(x, self.w13_weight, self.w2_weight, topk_weights, local_ids)
        if self.reduce_results and self.tp_size > 1:
            out = tp_all_reduce_sum(out)
        return out


def experts_torch(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor
) -> torch.Tensor:
    """The experts by a loop over those that received tokens. x [N, H]; w13 [E, 2I, H];
    w2 [E, H, I]; topk_weights [N, k]; local_ids [N, k] (ids outside [0, E) contribute zero)
    -> [N, H] in x's dtype. Each (token, slot) result is weighted in float32 and the k slots are
    summed in slot order, so a row's sum does not depend on its batch."""
    n, k = local_ids.shape
    num_experts = w13.shape[0]
    flat = local_ids.reshape(-1).long()  # [N k], entry t * k + j
    local = (flat >= 0) & (flat < num_experts)
    order = torch.argsort(torch.where(local, flat, num_experts), stable=True)  # grouped by expert
    counts = torch.bincount(flat[local], minlength=num_experts).tolist()
    per_slot = x.new_zeros(n * k, x.shape[1])  # [N k, H]
    start = 0
    for expert, count in enumerate(counts):
        if count:
            rows = order[start : start + count]  # [count] entries t * k + j
            per_slot[rows] = _expert_mlp(x[rows // k], w13[expert], w2[expert])
            start += count
    weighted = per_slot.view(n, k, -1).float() * topk_weights.float().unsqueeze(-1)  # [N, k, H]
    return weighted.sum(dim=1).to(x.dtype)


def _expert_mlp(h: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert: h [M, H], w13 [2I, H], w2 [H, I] -> down(silu(gate) * up) [M, H]."""
    gate_up = _linear(h, w13)  # [M, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    return _linear(pointwise(F.silu, gate) * up, w2)


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if is_batch_invariant():
        return row_blocked(lambda rows: F.linear(rows, weight), x)
    return F.linear(x, weight)


@functools.cache
def _triton_moe() -> Optional[ModuleType]:
    """sgl_kernel_ext.moe.fused_moe_triton, imported on first CUDA use; None without triton."""
    try:
        return importlib.import_module("sgl_kernel_ext.moe.fused_moe_triton")
    except ImportError:
        return None


def load_expert_weight(params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> Optional[str]:
    """Loads a per-expert checkpoint tensor into its FusedMoE parameter -> the parameter's name;
    None (nothing loaded) when `name` is not an expert tensor."""
    target = expert_weight_target(name)
    if target is None:
        return None
    param_name, shard, expert = target
    if param_name not in params:
        raise ValueError(f"Checkpoint tensor {name!r} has no matching expert parameter ({param_name}).")
    param = params[param_name]
    param.weight_loader(param, tensor, shard, expert)
    return param_name
