"""Softmax top-k routing in one Triton launch: router logits -> each token's k experts and weights.

One program per token holds its E logits, takes the float32 softmax, then k times the largest
remaining probability (ties to the lower expert id), and with `renormalize` rescales the k
weights to sum to 1. It replaces the five launches of the torch path (cast, softmax, topk, sum,
divide) in decode steps, where each launch costs more than its arithmetic. Numerics: the torch
path of sglang.srt.layers.moe.topk.select_experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

MAX_EXPERTS = 1024  # one program holds a token's whole row


@triton.jit
def _softmax_topk_kernel(
    logits_ptr,  # [N, E]
    weights_ptr,  # [N, K] float32
    ids_ptr,  # [N, K] int32
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    live = experts < num_experts
    logits = tl.load(logits_ptr + token * stride_logits + experts, mask=live, other=float("-inf")).to(tl.float32)
    p = tl.exp(logits - tl.max(logits, axis=0))
    p = p / tl.sum(p, axis=0)  # [BLOCK_E]; padding is 0
    p = tl.where(live, p, -1.0)
    slots = tl.arange(0, K_PAD)
    chosen_w = tl.zeros((K_PAD,), dtype=tl.float32)
    chosen_id = tl.zeros((K_PAD,), dtype=tl.int32)
    for slot in tl.static_range(TOP_K):
        top = tl.max(p, axis=0)
        best = tl.min(tl.where(p == top, experts, BLOCK_E), axis=0)  # the lowest id among ties
        chosen_w = tl.where(slots == slot, top, chosen_w)
        chosen_id = tl.where(slots == slot, best.to(tl.int32), chosen_id)
        p = tl.where(experts == best, -1.0, p)
    if RENORMALIZE:
        chosen_w = chosen_w / tl.sum(chosen_w, axis=0)
    out = token * TOP_K + slots
    tl.store(weights_ptr + out, chosen_w, mask=slots < TOP_K)
    tl.store(ids_ptr + out, chosen_id, mask=slots < TOP_K)


def softmax_topk_applies(router_logits: torch.Tensor, top_k: int) -> bool:
    return (router_logits.is_cuda and router_logits.dim() == 2 and router_logits.stride(1) == 1
            and top_k <= router_logits.shape[1] <= MAX_EXPERTS)


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] (unit column stride) -> (weights [N, k] float32, ids [N, k] int32),
    weights in descending order."""
    n, num_experts = router_logits.shape
    weights = torch.empty(n, top_k, dtype=torch.float32, device=router_logits.device)  # [N, k]
    ids = torch.empty(n, top_k, dtype=torch.int32, device=router_logits.device)  # [N, k]
    if n:
        launch(_softmax_topk_kernel, (n,), router_logits, weights, ids, num_experts, router_logits.stride(0),
               TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), BLOCK_E=triton.next_power_of_2(num_experts),
               RENORMALIZE=renormalize, num_warps=4, num_stages=1, pdl=True)
    return weights, ids
