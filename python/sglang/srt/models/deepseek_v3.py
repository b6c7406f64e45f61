"""DeepSeek-V3: multi-head latent attention (layers/attention/mla.py) with YaRN RoPE on its rope
dimensions, a dense SiLU MLP in the first `first_k_dense_replace` layers and a mixture of experts
after them (sigmoid routing limited to the best groups, a correction bias for the choice, routed
scaling, shared experts). The checkpoint's multi-token-prediction layers
(`model.layers.{num_hidden_layers + i}...`, `num_nextn_predict_layers` of them) load into draft
heads kept on the model (models/deepseek_nextn.py), which this model's forward does not run."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Iterable, Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.mla import MLAShape, MLAttention
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import default_weight_loader, dense_matmul, make_param
from sglang.srt.layers.logits_processor import LogitsHead
from sglang.srt.layers.moe import FusedMoE, TopKConfig, expert_weight_target, select_experts
from sglang.srt.layers.rotary import RotaryEmbedding, yarn_mscale
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.mem_cache.memory_pool import KVCacheLayout
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.deepseek_nextn import (
    SHARED_WITH_MAIN,
    DeepseekV3NextNHead,
    check_shape,
    check_shared_copy,
    nextn_target,
)
from sglang.srt.models.llama import LlamaForCausalLM, _vocab_all_gather
from sglang.srt.models.llama_layers import LlamaMLP

logger = logging.getLogger(__name__)

_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")
# Checkpoint projection -> (our fused parameter, shard index) for the SiLU MLPs.
_GATE_UP = {".gate_proj.": 0, ".up_proj.": 1}


def mla_shape(config: ModelConfig) -> MLAShape:
    hf = config.hf_config
    return MLAShape(
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        q_lora_rank=hf.get("q_lora_rank"),
        kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"],
        attention_bias=bool(hf.get("attention_bias", False)),
        rope_interleave=bool(hf.get("rope_interleave", True)),
    )


def mla_softmax_scale(shape: MLAShape, rope_scaling: Optional[dict[str, Any]]) -> float:
    """1 / sqrt(d_nope + d_rope), times mscale(factor, mscale_all_dim)^2 under a RoPE scaling that
    sets mscale_all_dim (YaRN's magnitude correction applied to the whole score)."""
    scale = shape.qk_head_dim**-0.5
    if rope_scaling and rope_scaling.get("mscale_all_dim"):
        scale *= yarn_mscale(rope_scaling["factor"], rope_scaling["mscale_all_dim"]) ** 2
    return scale


class DeepseekV3Router(nn.Module):
    """The router's linear and the choice's correction bias, float32 as transformers keeps them."""

    def __init__(self, num_experts: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = make_param((num_experts, hidden_size), torch.float32, default_weight_loader)
        self.e_score_correction_bias = make_param((num_experts,), torch.float32, default_weight_loader)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> router logits [N, E] float32."""
        return dense_matmul(x.float(), self.weight)


class DeepseekV3MoE(nn.Module):
    """Routed experts (grouped sigmoid routing) plus the shared experts, summed."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        hf = config.hf_config
        num_experts = hf["n_routed_experts"]
        self.topk = TopKConfig(
            top_k=hf["num_experts_per_tok"],
            renormalize=bool(hf.get("norm_topk_prob", True)),
            scoring_func="sigmoid",
            num_expert_group=hf.get("n_group"),
            topk_group=hf.get("topk_group"),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        )
        self.gate = DeepseekV3Router(num_experts, config.hidden_size)
        self.experts = FusedMoE(
            num_experts, self.topk.top_k, config.hidden_size, hf["moe_intermediate_size"], params_dtype=dtype,
            tp_rank=tp_rank, tp_size=tp_size,
        )
        self.shared_experts = None
        if hf.get("n_shared_experts"):
            self.shared_experts = LlamaMLP(shared_expert_config(config), dtype, tp_rank, tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> [N, H]."""
        weights, ids = select_experts(self.gate(x), self.topk, self.gate.e_score_correction_bias)  # [N, k] each
        out = self.experts(x, weights, ids)
        return out if self.shared_experts is None else out + self.shared_experts(x)

    def load_expert(self, name: str, tensor: torch.Tensor) -> Optional[str]:
        """One expert's checkpoint tensor -> the parameter it filled; None if `name` is not one."""
        target = expert_weight_target(name)
        if target is None:
            return None
        param_name, shard, expert = target
        param = getattr(self.experts, param_name.rsplit(".", 1)[1])
        param.weight_loader(param, tensor, shard, expert)
        return param_name


class DeepseekV3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        eps, shape = config.rms_norm_eps, mla_shape(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        scaling = mla_softmax_scale(shape, config.rope_scaling)
        self.self_attn = MLAttention(shape, layer_id, scaling, dtype, tp_rank, tp_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        if layer_id < config.hf_config.get("first_k_dense_replace", 0):
            self.mlp = LlamaMLP(config, dtype, tp_rank, tp_size)
        else:
            self.mlp = DeepseekV3MoE(config, dtype, tp_rank, tp_size)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, residual: Optional[torch.Tensor],
                forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, forward_batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DeepseekV3Model(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, **tp)
        rope_dim = config.hf_config["qk_rope_head_dim"]
        self.rotary_emb = RotaryEmbedding(rope_dim, config.context_len, config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(
            DeepseekV3DecoderLayer(config, i, dtype, tp_rank, tp_size) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, params_dtype=dtype)

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """-> [N, H] final hidden states of every new token."""
        x, residual = self.embed_tokens(forward_batch.input_ids), None  # [N, H]
        rope = self.rotary_emb(forward_batch.positions, x.dtype)  # cos, signed sin [N, 1, d_rope]
        for layer in self.layers:
            x, residual = layer(rope, x, residual, forward_batch)
        x, _ = self.norm(x, residual)
        return x


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    """Llama's logits and step interface over the DeepSeek-V3 decoder."""

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype = torch.float32, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        nn.Module.__init__(self)  # LlamaForCausalLM.__init__ would build a Llama decoder
        self.config = config
        self.model = DeepseekV3Model(config, dtype, tp_rank, tp_size)
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size
            )
        self.logits_head = LogitsHead(
            config.vocab_size, tp_all_gather=_vocab_all_gather(tp_size) if tp_size > 1 else None
        )
        # The NextN draft heads the config declares; dropped at load when the checkpoint has none.
        num_nextn = int(config.hf_config.get("num_nextn_predict_layers") or 0)
        self.nextn_heads: Optional[nn.ModuleList] = None
        if num_nextn:
            self.nextn_heads = nn.ModuleList(
                DeepseekV3NextNHead(
                    config, DeepseekV3DecoderLayer(config, config.num_hidden_layers + i, dtype, tp_rank, tp_size), dtype
                )
                for i in range(num_nextn)
            )

    def kv_cache_layout(self) -> KVCacheLayout:
        """One latent row (c_kv, k_rope) per token and layer, attended as both key and value."""
        return KVCacheLayout(len(self.model.layers), 1, mla_shape(self.config).latent_dim, 0)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """weights: (HF parameter name, full unsharded tensor) pairs."""
        params = dict(self.named_parameters())
        num_layers, num_heads = len(self.model.layers), len(self.nextn_heads or ())
        loaded, skipped = set(), 0
        for name, tensor in weights:
            layer = _layer_index(name)
            if layer is not None and layer >= num_layers:
                target = nextn_target(name, num_layers, num_heads)
                if target is None:
                    skipped += 1  # a multi-token-prediction layer the config does not declare
                else:
                    loaded.update(self._load_nextn(params, *target, tensor))
                continue
            if "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            loaded.update(self._load_one(params, name, tensor, None if layer is None else self.model.layers[layer]))
        if skipped:
            logger.info("Skipped %d multi-token-prediction (NextN) tensors of undeclared layers.", skipped)
        self._keep_loaded_nextn_heads(loaded)
        missing = set(dict(self.named_parameters())) - loaded
        if missing:
            raise ValueError(f"Checkpoint is missing weights for: {sorted(missing)[:8]}...")

    def _load_nextn(self, params: dict[str, nn.Parameter], index: int, rest: str, tensor: torch.Tensor) -> list[str]:
        """One tensor of NextN module `index` (`rest`: its name inside the head)."""
        if rest in SHARED_WITH_MAIN:
            check_shared_copy(rest, tensor, self.config.vocab_size, self.config.hidden_size)
            return []
        name = f"nextn_heads.{index}.{rest}"
        if rest.startswith("decoder."):
            return self._load_one(params, name, tensor, self.nextn_heads[index].decoder)
        if name not in params:
            raise ValueError(f"NextN tensor {rest!r} has no matching parameter in {type(self).__name__}.")
        check_shape(rest, tensor, params[name])
        params[name].weight_loader(params[name], tensor)
        return [name]

    def _keep_loaded_nextn_heads(self, loaded: set[str]) -> None:
        """Drops the declared heads when the checkpoint holds none of their tensors (transformers
        writes `num_nextn_predict_layers` without them); a partly loaded head fails the caller's
        missing-weights check."""
        if self.nextn_heads is None:
            return
        if any(name.startswith("nextn_heads.") for name in loaded):
            logger.info("Loaded %d NextN (multi-token-prediction) draft heads; the target model does not run them.",
                        len(self.nextn_heads))
        else:
            self.nextn_heads = None

    def _load_one(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor,
                  layer: Optional[DeepseekV3DecoderLayer]) -> list[str]:
        """Loads one tensor into the parameter `name` (a checkpoint name, or a NextN head's
        parameter name) of decoder `layer` (None outside the layers) -> the names it filled."""
        if ".self_attn." in name:
            attn = layer.self_attn
            if name.endswith(".kv_b_proj.weight"):
                attn.load_kv_b_proj(tensor)
                prefix = name[: -len("kv_b_proj.weight")]
                return [prefix + "w_uk", prefix + "w_uv"]
            tensor = attn.rope_row_order(name, tensor)
        if ".mlp.experts." in name:
            filled = layer.mlp.load_expert(name, tensor)
            if filled is None:
                raise ValueError(f"Checkpoint tensor {name!r} has no matching parameter in {type(self).__name__}.")
            return [filled]
        target, shard = name, None
        for ckpt, index in _GATE_UP.items():
            if ckpt in name:
                target, shard = name.replace(ckpt, ".gate_up_proj."), index
        if target not in params:
            raise ValueError(f"Checkpoint tensor {name!r} has no matching parameter in {type(self).__name__}.")
        param = params[target]
        if shard is None:
            param.weight_loader(param, tensor)
        else:
            param.weight_loader(param, tensor, shard)
        return [target]


def _layer_index(name: str) -> Optional[int]:
    match = _LAYER_RE.match(name)
    return None if match is None else int(match.group(1))


def shared_expert_config(config: ModelConfig) -> ModelConfig:
    """The config of the shared experts' SiLU MLP: moe_intermediate_size x n_shared_experts wide."""
    hf = config.hf_config
    return dataclasses.replace(config, intermediate_size=hf["moe_intermediate_size"] * hf.get("n_shared_experts", 1))
