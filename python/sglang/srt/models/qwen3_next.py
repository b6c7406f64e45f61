"""Qwen3-Next: a hybrid decoder. Each layer mixes tokens with Gated DeltaNet (linear attention over
a per-request recurrent state) or with gated full attention (q_proj doubled for a per-head output
gate, q/k zero-centred RMSNorm, RoPE on the first `partial_rotary_factor` of each head), as the
config's `layer_types` say; its MLP is a sparse MoE with a sigmoid-gated shared expert, or dense
for `mlp_only_layers` and layers off `decoder_sparse_step`. Norms are zero-centred (1 + w).

Only the full-attention layers use the paged KV cache (kv_cache_layout); the linear layers' states
live in the engine's RecurrentStatePool (recurrent_state_layout). The checkpoint's
multi-token-prediction head (`mtp.*`) loads into Qwen3NextMTPHead, kept on the model as `mtp` for
a speculative-decoding draft; this model's forward does not run it."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention import Attention
from sglang.srt.layers.batch_invariant import pointwise
from sglang.srt.layers.gated_delta_net import GatedDeltaNet, GatedDeltaNetShape
from sglang.srt.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.logits_processor import LogitsHead, LogitsProcessorOutput
from sglang.srt.layers.moe import FusedMoE, TopKConfig, expert_weight_target, select_experts
from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.layers.zero_centered_norm import ZeroCenteredRMSNorm
from sglang.srt.mem_cache.memory_pool import KVCacheLayout
from sglang.srt.mem_cache.recurrent_state_pool import RecurrentStateLayout
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

LINEAR, FULL = "linear_attention", "full_attention"


def layer_types(hf: dict[str, Any]) -> list[str]:
    """Each layer's token mixer; without `layer_types`, every `full_attention_interval`-th layer
    (default 4) is full attention."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    interval = hf.get("full_attention_interval", 4)
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(hf["num_hidden_layers"])]


def is_sparse_layer(hf: dict[str, Any], layer: int) -> bool:
    return (
        layer not in (hf.get("mlp_only_layers") or [])
        and hf.get("num_experts", 0) > 0
        and (layer + 1) % hf.get("decoder_sparse_step", 1) == 0
    )


def partial_rotary_factor(hf: dict[str, Any]) -> float:
    """transformers nests it in rope_parameters; an absent key means Qwen3-Next's 0.25."""
    rope = hf.get("rope_parameters") or {}
    return float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, params_dtype=dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, params_dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [N, I] each
        return self.down_proj(pointwise(F.silu, gate) * up)


class SparseMoeBlock(nn.Module):
    """Softmax top-k routing over the experts, plus a shared expert scaled by sigmoid(gate(x))."""

    def __init__(self, hf: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        hidden, experts = hf["hidden_size"], hf["num_experts"]
        self.topk = TopKConfig(top_k=hf["num_experts_per_tok"], renormalize=bool(hf.get("norm_topk_prob", True)))
        self.gate = ColumnParallelLinear(hidden, experts, params_dtype=dtype)  # the router
        self.experts = FusedMoE(experts, self.topk.top_k, hidden, hf["moe_intermediate_size"], params_dtype=dtype)
        self.shared_expert = GatedMLP(hidden, hf["shared_expert_intermediate_size"], dtype)
        self.shared_expert_gate = ColumnParallelLinear(hidden, 1, params_dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> [N, H]."""
        weights, ids = select_experts(self.gate(x), self.topk)  # [N, k] each
        shared = pointwise(torch.sigmoid, self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, weights, ids) + shared


class GatedAttention(nn.Module):
    """Full attention whose q_proj yields, per head, the query and a gate; the output is
    o_proj(attention * sigmoid(gate))."""

    def __init__(self, config: ModelConfig, kv_layer: int, rotary_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        d, heads, kv_heads = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.num_heads, self.num_kv_heads, self.rotary_dim = d, heads, kv_heads, rotary_dim
        # q|gate as 2 Hq heads of D (each query head's rows are followed by its gate's), then k, v.
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, d, 2 * heads, kv_heads, config.attention_bias, params_dtype=dtype
        )
        self.o_proj = RowParallelLinear(heads * d, config.hidden_size, config.attention_bias, params_dtype=dtype)
        self.q_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps, params_dtype=dtype)
        self.k_norm = ZeroCenteredRMSNorm(d, config.rms_norm_eps, params_dtype=dtype)
        self.attn = Attention(kv_layer, heads, kv_heads, d, d**-0.5)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        n, d, heads, kv_heads = x.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        q_gate, k, v = self.qkv_proj(x).split([2 * heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, gate = q_gate.view(n, heads, 2 * d).split([d, d], dim=-1)  # [N, Hq, D] each
        q = self._rotate(self.q_norm(q.contiguous()), rope)
        k = self._rotate(self.k_norm(k.reshape(n, kv_heads, d)), rope)
        out = self.attn(q, k, v.reshape(n, kv_heads, d), forward_batch)  # [N, Hq * D]
        return self.o_proj(out * pointwise(torch.sigmoid, gate.reshape(n, heads * d)))

    def _rotate(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """RoPE on the first rotary_dim of each head [N, heads, D]; the rest passes."""
        rot, rest = x.split([self.rotary_dim, self.head_dim - self.rotary_dim], dim=-1)
        return torch.cat([apply_rotary_emb(rot, *rope), rest], dim=-1)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, mixer: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        hf, eps = config.hf_config, config.rms_norm_eps
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, eps, params_dtype=dtype)
        if isinstance(mixer, GatedDeltaNet):
            self.linear_attn, self.self_attn = mixer, None
        else:
            self.linear_attn, self.self_attn = None, mixer
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, eps, params_dtype=dtype)
        if is_sparse_layer(hf, layer):
            self.mlp = SparseMoeBlock(hf, dtype)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, dtype)

    def forward(
        self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, residual: Optional[torch.Tensor],
        forward_batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        if self.linear_attn is not None:
            x = self.linear_attn(x, forward_batch)
        else:
            x = self.self_attn(rope, x, forward_batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Qwen3NextModel(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        hf = config.hf_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, params_dtype=dtype)
        rotary_dim = int(config.head_dim * partial_rotary_factor(hf))
        self.rotary_emb = RotaryEmbedding(rotary_dim, config.context_len, config.rope_theta, config.rope_scaling)
        self.gdn_shape = GatedDeltaNetShape(
            config.hidden_size, hf["linear_num_key_heads"], hf["linear_num_value_heads"], hf["linear_key_head_dim"],
            hf["linear_value_head_dim"], hf.get("linear_conv_kernel_dim", 4),
        )
        self.layer_types = layer_types(hf)
        layers, counts = [], {LINEAR: 0, FULL: 0}
        for i, kind in enumerate(self.layer_types):
            if kind == LINEAR:
                mixer = GatedDeltaNet(self.gdn_shape, counts[LINEAR], config.rms_norm_eps, dtype)
            elif kind == FULL:
                mixer = GatedAttention(config, counts[FULL], rotary_dim, dtype)
            else:
                raise ValueError(f"Qwen3-Next layer type {kind!r} is not supported ({LINEAR}, {FULL}).")
            counts[kind] += 1
            layers.append(Qwen3NextDecoderLayer(config, i, mixer, dtype))
        self.layers = nn.ModuleList(layers)
        self.num_linear_layers, self.num_full_layers = counts[LINEAR], counts[FULL]
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps, params_dtype=dtype)

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """-> [N, H] final hidden states of every new token."""
        x, residual = self.embed_tokens(forward_batch.input_ids), None  # [N, H]
        rope = self.rotary_emb(forward_batch.positions, x.dtype)  # cos, signed sin [N, 1, rotary_dim]
        for layer in self.layers:
            x, residual = layer(rope, x, residual, forward_batch)
        x, _ = self.norm(x, residual)
        return x


class Qwen3NextMTPHead(nn.Module):
    """The multi-token-prediction head (checkpoint `mtp.*`): fc [H, 2H] over
    [pre_fc_norm_embedding(next token's embedding) | pre_fc_norm_hidden(last hidden state)],
    `num_layers` gated full-attention decoder layers (layer j's MLP as the main model's layer j:
    sparse unless `mlp_only_layers` says otherwise) and a final norm; the embedding and the output
    head are the main model's. Its attention layers are numbered after the main model's KV layers
    and own no KV cache here."""

    def __init__(self, config: ModelConfig, num_layers: int, first_kv_layer: int, rotary_dim: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.fc = ColumnParallelLinear(2 * hidden, hidden, params_dtype=dtype)
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(hidden, eps, params_dtype=dtype)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(hidden, eps, params_dtype=dtype)
        self.layers = nn.ModuleList(
            Qwen3NextDecoderLayer(config, j, GatedAttention(config, first_kv_layer + j, rotary_dim, dtype), dtype)
            for j in range(num_layers)
        )
        self.norm = ZeroCenteredRMSNorm(hidden, eps, params_dtype=dtype)


class Qwen3NextForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, *, dtype: torch.dtype = torch.float32, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        if tp_size > 1:
            raise ValueError("Qwen3-Next runs with --tp-size 1 only (its Gated DeltaNet layers are not sharded).")
        self.config, self.dtype = config, dtype
        self.model = Qwen3NextModel(config, dtype)
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, params_dtype=dtype)
        self.logits_head = LogitsHead(config.vocab_size)
        # One MTP layer unless the config says otherwise; dropped at load when the checkpoint has no mtp.*.
        rotary_dim = self.model.rotary_emb.rotary_dim
        self.mtp: Optional[Qwen3NextMTPHead] = Qwen3NextMTPHead(
            config, int(config.hf_config.get("num_nextn_predict_layers", 1)), self.model.num_full_layers, rotary_dim, dtype
        )

    def kv_cache_layout(self) -> KVCacheLayout:
        """K/V only for the full-attention layers (their Attention layer_ids are 0..count-1)."""
        d = self.config.head_dim
        return KVCacheLayout(self.model.num_full_layers, self.config.num_key_value_heads, d, d)

    def recurrent_state_layout(self) -> RecurrentStateLayout:
        s = self.model.gdn_shape
        return RecurrentStateLayout(
            self.model.num_linear_layers, (s.conv_dim, s.conv_kernel - 1), (s.num_v_heads, s.head_k_dim, s.head_v_dim),
            self.dtype,
        )

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        return self.compute_logits(self.model(forward_batch), forward_batch)  # model: [N, H]

    compute_logits = LlamaForCausalLM.compute_logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """weights: (HF parameter name, full tensor) pairs; `mtp.*` fills the MTP head."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            target, args = _target(name)
            if target not in params:
                raise ValueError(f"Checkpoint tensor {name!r} has no matching parameter in {type(self).__name__}.")
            param = params[target]
            if name.startswith("mtp."):
                _check_whole_shape(name, tensor, param, args)
            param.weight_loader(param, tensor, *args)
            loaded.add(target)
        if any(name.startswith("mtp.") for name in loaded):
            logger.info("Loaded the multi-token-prediction head (mtp.*, %d layers); the target model does not run it.",
                        len(self.mtp.layers))
        else:
            self.mtp = None  # transformers writes Qwen3-Next checkpoints without it
        missing = set(dict(self.named_parameters())) - loaded
        if missing:
            raise ValueError(f"Checkpoint is missing weights for: {sorted(missing)[:8]}...")


def _check_whole_shape(name: str, tensor: torch.Tensor, param: nn.Parameter, args: tuple[Any, ...]) -> None:
    """An MTP tensor loaded whole (no shard id) must match its parameter's shape exactly (the
    sharded ones are checked by their weight loaders' copies)."""
    if not args and tuple(tensor.shape) != tuple(param.shape):
        raise ValueError(f"Checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}.")


# Checkpoint projection -> (our fused parameter's projection, shard id).
_STACKED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _target(name: str) -> tuple[str, tuple[Any, ...]]:
    """A checkpoint tensor name -> (our parameter name, extra weight_loader arguments)."""
    expert = expert_weight_target(name)
    if expert is not None:
        target, shard, expert_id = expert
        return target, (shard, expert_id)
    for ckpt, (fused, shard) in _STACKED.items():
        if f".{ckpt}." in name:
            return name.replace(f".{ckpt}.", f".{fused}."), (shard,)
    return name, ()
