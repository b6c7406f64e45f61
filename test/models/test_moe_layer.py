"""The MoE layer without a server: routing against transformers' routers (Qwen3-MoE and Mixtral
softmax top-k, DeepSeek-V3's grouped sigmoid with correction bias and routed scaling), and the
experts against transformers' sparse block, whole and split over TP/EP ranks."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter

from sglang.srt.layers.moe import FusedMoE, TopKConfig, expert_parallel, expert_weight_target, select_experts
from sglang.srt.layers.moe.fused_moe import experts_torch, moe_parallel_ranks
from sgl_kernel_ext.moe.reference import fused_experts_reference

HIDDEN, EXPERTS, INTER, TOKENS = 32, 8, 16, 24


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)


def _sorted(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (weights, ids) in expert-id order: HF's DeepSeek router returns them unsorted."""
    order = ids.long().argsort(dim=-1)
    return weights.gather(1, order), ids.long().gather(1, order)


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_routing_matches_qwen3_moe_router(norm: bool) -> None:
    cfg = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=3, norm_topk_prob=norm)
    router = Qwen3MoeTopKRouter(cfg)
    _randomise(router)
    x = torch.randn(TOKENS, HIDDEN)
    _, ref_weights, ref_ids = router(x)
    weights, ids = select_experts(x @ router.weight.T, TopKConfig(3, norm))
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=0)


def test_softmax_routing_matches_mixtral_router() -> None:
    cfg = transformers.MixtralConfig(hidden_size=HIDDEN, num_local_experts=EXPERTS, num_experts_per_tok=2)
    router = MixtralTopKRouter(cfg)
    _randomise(router)
    x = torch.randn(TOKENS, HIDDEN)
    _, ref_weights, ref_ids = router(x)
    weights, ids = select_experts(x @ router.weight.T, TopKConfig(2, renormalize=True))
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_group,topk_group,norm,scale", [(4, 2, True, 2.5), (1, 1, False, 1.0), (8, 3, True, 1.0)])
def test_grouped_sigmoid_routing_matches_deepseek_v3_router(n_group: int, topk_group: int, norm: bool,
                                                            scale: float) -> None:
    cfg = transformers.DeepseekV3Config(hidden_size=HIDDEN, n_routed_experts=16, num_experts_per_tok=4, n_group=n_group,
                                        topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scale)
    router = DeepseekV3TopkRouter(cfg)
    _randomise(router)
    router.e_score_correction_bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
    x = torch.randn(TOKENS, HIDDEN)
    _, ref_weights, ref_ids = router(x)
    config = TopKConfig(4, norm, "sigmoid", n_group, topk_group, scale)
    weights, ids = select_experts(x @ router.weight.T, config, router.e_score_correction_bias)
    weights, ids = _sorted(weights, ids)
    ref_weights, ref_ids = _sorted(ref_weights, ref_ids)
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=0)


def test_group_limit_excludes_experts_outside_the_best_groups() -> None:
    logits = torch.full((1, 8), -5.0)
    logits[0, 0] = 5.0  # group 0 (experts 0-3) holds the single best expert
    logits[0, 4:6] = 2.0  # group 1's two best experts beat group 0's pair sum
    weights, ids = select_experts(logits, TopKConfig(2, False, "sigmoid", 2, 1))
    assert sorted(ids[0].tolist()) == [4, 5]


def _hf_block(top_k: int = 3) -> tuple[Qwen3MoeSparseMoeBlock, TopKConfig]:
    cfg = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=top_k,
                                      moe_intermediate_size=INTER, norm_topk_prob=True)
    cfg._experts_implementation = "eager"
    block = Qwen3MoeSparseMoeBlock(cfg)
    _randomise(block)
    return block, TopKConfig(top_k, True)


def _fused_moe(block: Qwen3MoeSparseMoeBlock, tp_rank: int = 0, tp_size: int = 1, ep_size: int = 1) -> FusedMoE:
    layer = FusedMoE(EXPERTS, 3, HIDDEN, INTER, tp_rank=tp_rank, tp_size=tp_size, ep_size=ep_size, reduce_results=False)
    for e in range(EXPERTS):
        gate_up = block.experts.gate_up_proj[e].detach()  # [2I, H] as HF stacks them: gate, up
        layer.weight_loader(layer.w13_weight, gate_up[:INTER], "w1", e)
        layer.weight_loader(layer.w13_weight, gate_up[INTER:], "w3", e)
        layer.weight_loader(layer.w2_weight, block.experts.down_proj[e].detach(), "w2", e)
    return layer


@pytest.mark.parametrize("tp_size,ep_size", [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4)])
def test_experts_split_over_ranks_sum_to_transformers_block(tp_size: int, ep_size: int) -> None:
    block, topk = _hf_block()
    x = torch.randn(TOKENS, HIDDEN)
    with torch.no_grad():
        expected = block(x[None])[0]
        weights, ids = select_experts(x @ block.gate.weight.T, topk)
        total = sum(_fused_moe(block, r, tp_size, ep_size)(x, weights, ids) for r in range(tp_size))
    torch.testing.assert_close(total, expected, atol=1e-5, rtol=1e-6)


def test_torch_path_matches_reference_with_foreign_experts() -> None:
    """Ids outside the local range (another EP rank's experts) contribute zero on both paths."""
    g = torch.Generator().manual_seed(3)
    x, w13, w2 = torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(4, 2 * INTER, HIDDEN, generator=g), \
        torch.randn(4, HIDDEN, INTER, generator=g)
    ids = torch.randint(-4, 8, (TOKENS, 3), generator=g, dtype=torch.int32)
    weights = torch.rand(TOKENS, 3, generator=g)
    torch.testing.assert_close(experts_torch(x, w13, w2, weights, ids),
                               fused_experts_reference(x, w13, w2, weights, ids), atol=1e-4, rtol=1e-5)


def test_expert_weight_names_and_parallel_layout() -> None:
    assert expert_weight_target("model.layers.2.mlp.experts.7.up_proj.weight") == ("model.layers.2.mlp.experts.w13_weight", "w3", 7)
    assert expert_weight_target("model.layers.0.mlp.experts.1.w2.weight") == ("model.layers.0.mlp.experts.w2_weight", "w2", 1)
    assert expert_weight_target("model.layers.0.mlp.gate.weight") is None
    assert moe_parallel_ranks(3, 4, 2) == (1, 1, 2)  # ranks {0, 1} hold experts 0..E/2, {2, 3} the rest
    with pytest.raises(ValueError, match="--ep-size 3 must divide --tp-size 4"):
        moe_parallel_ranks(0, 4, 3)


def test_expert_parallel_size_reaches_layers_and_refuses_dense_models() -> None:
    with expert_parallel(2):
        layer = FusedMoE(EXPERTS, 2, HIDDEN, INTER, tp_rank=1, tp_size=2)
    assert (layer.num_local_experts, layer.expert_start, layer.intermediate_per_partition) == (4, 4, INTER)
    with pytest.raises(ValueError, match="--ep-size 2 applies to mixture-of-experts models only"):
        with expert_parallel(2):
            torch.nn.Linear(2, 2)


def test_server_args_refuse_an_ep_size_that_does_not_divide_tp() -> None:
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match="--ep-size 3 must be at least 1 and divide --tp-size 4"):
        ServerArgs(model_path="/m", tp_size=4, ep_size=3).validate()
    ServerArgs(model_path="/m", tp_size=4, ep_size=2).validate()
