"""Llama decoder, also the base of Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm).

The model body and the causal LM; the layers are in llama_layers.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Union

import torch
from torch import nn

from sgl_kernel_ext.layer.decode_layer_cpu import DecodeLayers, DecodeLayerStep, decode_layer_step, decode_layers_cpu
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.sliding_window import llama_family_sliding_window
from sglang.srt.layers.attention.cpu_backend import CpuAttnBackend
from sglang.srt.layers.batch_invariant import is_batch_invariant
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import block_kernel_serves
from sglang.srt.layers.logits_processor import LogitsHead, LogitsProcessorOutput
from sglang.srt.layers.rotary import RotaryEmbedding, rotary_dim_of
from sglang.srt.layers.triton_kernels import triton_kernels
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.mem_cache.memory_pool import KVCacheLayout
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama_layers import FusedRope, LlamaDecoderLayer, Rope

# Checkpoint projection -> (our fused parameter, shard id passed to its weight_loader).
STACKED_PARAMS = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaModel(nn.Module):
    """The embedding, `make_layer(layer_id)` decoder layers (LlamaDecoderLayer or a family's
    variant with the same forward signature) and the final norm; RoPE over `rotary_dim` dims."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int,
                 make_layer: Callable[[int], nn.Module], rotary_dim: int) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, **tp)
        self.rotary_emb = RotaryEmbedding(rotary_dim, config.context_len, config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(make_layer(i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, params_dtype=dtype)
        # Every layer's weights for the one-call CPU decode; False where some layer cannot take it.
        self._cpu_decode_layers: Union[DecodeLayers, None, bool] = None

    def process_weights_after_loading(self) -> None:
        self._cpu_decode_layers = None  # described again from the new weights at the next decode step

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """-> [N, H] final hidden states of every new token."""
        x, residual = self.embed_tokens(forward_batch.input_ids), None  # [N, H]
        rope = self._step_rope(forward_batch, x)
        fused = self._cpu_decode_step(forward_batch, x, rope)
        if fused is not None:
            # Each layer but its SiLU in one C call (with int8 activations, the whole step and
            # its C SiLU): the same functions in the same order as the loop below, so the same
            # bits, without ~10 Python-level calls per layer.
            kv_buffers = [forward_batch.kv_cache.get_kv(i) for i in range(len(self.layers))]
            act, residual = decode_layers_cpu(*fused, x, kv_buffers)
            x = self.layers[-1].mlp.down_proj(act)
        else:
            for layer in self.layers:
                x, residual = layer(rope, x, residual, forward_batch)
        x, _ = self.norm(x, residual)
        return x

    def _cpu_decode_step(
        self, forward_batch: ForwardBatch, x: torch.Tensor, rope: Rope
    ) -> Optional[tuple[DecodeLayers, DecodeLayerStep]]:
        """The step every layer's one-call CPU decode reads, or None where the layers run op by op:
        not one new token per request, not the C attention kernel, a batch the op-by-op path would
        not give to the block kernel (block_kernel_serves), or a layer that cannot take it."""
        backend = forward_batch.attn_backend
        if (
            self.rotary_emb.rotary_dim != self.layers[0].self_attn.attn.head_dim  # the C layer rotates whole heads
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or not _one_new_token_each(forward_batch)
            or forward_batch.attention_split is not None
            or not isinstance(backend, CpuAttnBackend)
            or not backend.use_kernel
            or not block_kernel_serves(x.shape[0])
        ):
            return None
        if self._cpu_decode_layers is None:
            # Built once per load (process_weights_after_loading resets it); they hold the packed
            # tensors they point into.
            weights = [layer.cpu_decode_weights() for layer in self.layers]
            self._cpu_decode_layers = False if any(w is None for w in weights) else DecodeLayers(weights)
        layers = self._cpu_decode_layers
        if not layers:
            return None
        k_buf, _ = forward_batch.kv_cache.get_kv(0)
        cos, signed_sin = rope
        step = decode_layer_step(
            layers.weights[0], cos, signed_sin, forward_batch.out_cache_loc, k_buf.shape[0], backend.req_to_token,
            forward_batch.req_pool_indices, forward_batch.seq_lens,
        )
        return layers, step

    def _step_rope(self, forward_batch: ForwardBatch, x: torch.Tensor) -> Rope:
        rotary, positions = self.rotary_emb, forward_batch.positions
        seq_lens = _token_seq_lens(forward_batch) if rotary.length_dependent else None
        whole_heads = rotary.rotary_dim == self.layers[0].self_attn.attn.head_dim
        if x.is_cuda and whole_heads and triton_kernels("rotary.rope_store_triton") is not None:
            if seq_lens is None:
                return FusedRope(positions, rotary.cos_sin_cache, positions, None, rotary)
            rows = rotary.rows(positions, seq_lens)  # [N, D]: this step's own table
            return FusedRope(torch.arange(rows.shape[0], device=rows.device), rows, positions, seq_lens, rotary)
        return rotary(positions, x.dtype, seq_lens)

    @property
    def extend_graphs_supported(self) -> bool:
        """Whether an extend step's body can be captured in piecewise graphs, which replay from
        the step's positions alone: not where RoPE reads each sequence's length."""
        return not self.rotary_emb.length_dependent


def _token_seq_lens(forward_batch: ForwardBatch) -> torch.Tensor:
    """[N] int64: each new token's sequence length in this step (prefix + the step's tokens)."""
    if forward_batch.forward_mode.is_decode():
        return forward_batch.seq_lens
    return torch.repeat_interleave(
        forward_batch.seq_lens, forward_batch.extend_seq_lens, output_size=forward_batch.positions.shape[0]
    )


def _one_new_token_each(forward_batch: ForwardBatch) -> bool:
    """A decode step, or an extend of one token per request after its cached prefix (a prompt
    the radix cache holds but for its last token: the first token of a repeated prompt). Such
    an extend is a decode step in all but name, and the one-call layer serves it several times
    faster than the op-by-op extend. Not in batch-invariant mode, which keeps a prompt's cached
    and uncached results equal to the bit: there the extend's attention path must not depend on
    how much of the prompt was cached."""
    if forward_batch.forward_mode.is_decode():
        return True
    return (
        not forward_batch.return_input_logits
        and not is_batch_invariant()
        and all(n == 1 for n in forward_batch.extend_seq_lens_cpu)
    )


class LlamaForCausalLM(nn.Module):
    qk_norm = False
    # The rotated share of each head where the config does not say.
    default_partial_rotary_factor = 1.0

    def __init__(self, config: ModelConfig, *, dtype: torch.dtype = torch.float32, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        self.config = config
        self.model = self.build_model(config, dtype, tp_rank, tp_size)
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size
            )
        self.logits_head = LogitsHead(
            config.vocab_size,
            final_logit_softcapping=self.final_logit_softcapping(config),
            tp_all_gather=_vocab_all_gather(tp_size) if tp_size > 1 else None,
        )

    def build_model(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> nn.Module:
        """The decoder body: forward(forward_batch) -> final hidden states [N, H]."""
        rotary_dim = rotary_dim_of(config.head_dim, config.hf_config, self.default_partial_rotary_factor)
        return LlamaModel(
            config, dtype, tp_rank, tp_size, lambda i: self.make_layer(config, i, dtype, tp_rank, tp_size), rotary_dim
        )

    def make_layer(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int,
                   tp_size: int) -> nn.Module:
        # Mistral's window on every layer; Qwen2/Qwen3's from max_window_layers on (use_sliding_window).
        window = llama_family_sliding_window(config.hf_config, layer_id, config.num_hidden_layers)
        return LlamaDecoderLayer(config, layer_id, dtype, tp_rank, tp_size, self.qk_norm, window)

    def final_logit_softcapping(self, config: ModelConfig) -> Optional[float]:
        return None

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        return self.compute_logits(self.model(forward_batch), forward_batch)  # model: [N, H]

    def kv_cache_layout(self) -> KVCacheLayout:
        """Every layer keeps K and V of its (TP-local) KV heads."""
        attn = self.model.layers[0].self_attn
        return KVCacheLayout(len(self.model.layers), attn.num_kv_heads, attn.attn.head_dim, attn.attn.head_dim)

    def compute_logits(self, hidden: torch.Tensor, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Logits from the final hidden states [N, H] (the piecewise graph runner calls this after
        replaying the model body)."""
        if forward_batch.return_input_logits:
            out = self.logits_head(hidden, self.lm_head)
            out.input_token_logits = out.next_token_logits  # [N, V]
            out.next_token_logits = out.input_token_logits[_last_token_indices(forward_batch)]  # [B, V]
            return out
        if forward_batch.forward_mode.is_extend():
            hidden = hidden[_last_token_indices(forward_batch)]  # [B, H]
        return self.logits_head(hidden, self.lm_head, out=forward_batch.logits_out)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """weights: (HF parameter name, full unsharded tensor) pairs."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            loaded.add(self.load_weight(params, name, tensor))
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"Checkpoint is missing weights for: {sorted(missing)[:8]}...")


    def load_weight(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> str:
        """Copies one checkpoint tensor into its parameter (this rank's shard); -> the parameter's name."""
        target, shard = _stacked_target(name)
        param = _checkpoint_param(self, params, name, target)
        if shard is None:
            param.weight_loader(param, tensor)
        else:
            param.weight_loader(param, tensor, shard)
        return target


def _checkpoint_param(model: nn.Module, params: dict[str, nn.Parameter], name: str, target: str) -> nn.Parameter:
    if target not in params:
        raise ValueError(f"Checkpoint tensor {name!r} has no matching parameter in {type(model).__name__}.")
    return params[target]


def _stacked_target(name: str) -> tuple[str, Optional[object]]:
    for ckpt, (fused, shard) in STACKED_PARAMS.items():
        if f".{ckpt}." in name:
            return name.replace(f".{ckpt}.", f".{fused}."), shard
    return name, None


def _last_token_indices(forward_batch: ForwardBatch) -> torch.Tensor:
    """[B] int64 index of each request's last new token among the N new tokens, computed on the
    batch's device (a host copy here would wait for every layer already queued)."""
    return forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1


def _vocab_all_gather(tp_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def gather(logits: torch.Tensor) -> torch.Tensor:
        shards = [torch.empty_like(logits) for _ in range(tp_size)]
        torch.distributed.all_gather(shards, logits.contiguous())
        return torch.cat(shards, dim=-1)  # [B, V_padded]

    return gather
