"""Llama decoder, also the base of Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm)."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Callable, Iterable, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sgl_kernel_ext.activation.silu_mul_cpu import silu_mul_cpu, silu_mul_cpu_available
from sgl_kernel_ext.layer.decode_layer_cpu import (
    DecodeLayers,
    DecodeLayerStep,
    DecodeLayerWeights,
    decode_layer_kernel_available,
    decode_layer_step,
    decode_layer_weights,
    decode_layers_cpu,
)
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_cpu, rope_store_cpu_applies
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.sliding_window import llama_family_sliding_window
from sglang.srt.layers.attention import Attention
from sglang.srt.layers.attention.cpu_backend import CpuAttnBackend
from sglang.srt.layers.batch_invariant import is_batch_invariant
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    block_kernel_serves,
)
from sglang.srt.layers.logits_processor import LogitsHead, LogitsProcessorOutput
from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb, rotary_dim_of
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.mem_cache.memory_pool import KVCacheLayout
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class FusedRope(NamedTuple):
    """On CUDA, what each layer's fused norm/RoPE/KV-store kernel reads: the step's row indices
    into a float32 cos/sin table (the positions into the module's table, nothing gathered per
    step; or, for length-dependent RoPE, 0..N-1 into the step's own rows), and what the torch
    path needs where the kernel does not apply."""

    table_index: torch.Tensor  # [N] int64
    table: torch.Tensor  # [P, D] float32
    positions: torch.Tensor  # [N] int64
    seq_lens: Optional[torch.Tensor]  # [N] int64 for length-dependent RoPE, else None
    rotary_emb: RotaryEmbedding


# A step's RoPE input to every layer: cos, signed sin [N, 1, R] of its positions over the R
# rotated dims (RotaryEmbedding.forward), or on CUDA, where R is the whole head, a FusedRope.
Rope = Union[tuple[torch.Tensor, torch.Tensor], FusedRope]

# Checkpoint projection -> (our fused parameter, shard id passed to its weight_loader).
STACKED_PARAMS = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], **tp)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, **tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [N, 2 I / tp]
        kernels = _triton_kernels("activation.silu_mul_triton") if gate_up.is_cuda else None
        if kernels is not None and kernels.silu_mul_triton_applies(gate_up):
            return self.down_proj(kernels.silu_mul_triton(gate_up))  # one launch, no silu temporary
        if self.c_silu():
            # The int8-activation mode's SiLU on every path, so that its decode step, all in C,
            # gives the op-by-op path's bits.
            return self.down_proj(silu_mul_cpu(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # [N, I / tp] each
        return self.down_proj(F.silu(gate).mul_(up))

    def c_silu(self) -> bool:
        """Whether SiLU runs in silu_mul_cpu.c: with projections packed for int8 activations."""
        block = self.down_proj.block_weight
        return block is not None and block.int8_activations and silu_mul_cpu_available()


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        tp_rank: int,
        tp_size: int,
        qk_norm: bool,
        sliding_window: Optional[int] = None,
    ) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        d = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, d, config.num_attention_heads, config.num_key_value_heads, config.attention_bias, **tp
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, **tp)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, params_dtype=dtype) if qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps, params_dtype=dtype) if qk_norm else None
        self.attn = Attention(layer_id, self.num_heads, self.num_kv_heads, d, d**-0.5, sliding_window=sliding_window)

    def forward(self, rope: Rope, x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        return self.attend(rope, self.qkv_proj(x), forward_batch)  # qkv_proj: [N, (Hq + 2 Hk) * D]

    def attend(self, rope: Rope, qkv: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """qkv [N, (Hq + 2 Hk) * D] projections -> the attention output projected, [N, H]."""
        n, d, heads, kv_heads = qkv.shape[0], self.attn.head_dim, self.num_heads, self.num_kv_heads
        k_buf, v_buf = forward_batch.kv_cache.get_kv(self.attn.layer_id)
        if isinstance(rope, FusedRope):
            kernels = _triton_kernels("rotary.rope_store_triton")
            if kernels.rope_store_triton_applies(qkv, k_buf, v_buf):
                # One launch for q/k norm, RoPE and the K/V store (instead of ~15 small kernels).
                q = self._rope_store_triton(kernels, rope, qkv, k_buf, v_buf, forward_batch)  # [N, Hq, D]
                return self.o_proj(self.attn(q, None, None, forward_batch))
            rope = rope.rotary_emb(rope.positions, qkv.dtype, rope.seq_lens)
        if self.q_norm is None and rope[0].shape[-1] == d and rope_store_cpu_applies(qkv, k_buf):
            # One C call on CPU: q rotated in place, k rotated and v copied into the cache.
            q = rope_store_cpu(qkv, heads, *rope, forward_batch.out_cache_loc, k_buf, v_buf)  # [N, Hq, D]
            return self.o_proj(self.attn(q, None, None, forward_batch))
        # q and k heads are adjacent in the fused output, so they are normed and rotated as one tensor.
        qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
        qk = qk.view(n, heads + kv_heads, d)
        if self.q_norm is not None:
            # Contiguous copies, so that RMSNorm takes its per-row kernel at every N: the strided
            # views count as contiguous only when N == 1, and the torch fallback the others took
            # rounds differently, so a row's bits changed between alone and batched.
            q_part, k_part = qk[:, :heads].contiguous(), qk[:, heads:].contiguous()  # [N, Hq, D], [N, Hk, D]
            qk = torch.cat([self.q_norm(q_part), self.k_norm(k_part)], dim=1)
        q, k = apply_rotary_emb(qk, *rope).split([heads, kv_heads], dim=1)  # [N, Hq, D], [N, Hk, D]
        return self.o_proj(self.attn(q, k, v.view(n, kv_heads, d), forward_batch))

    def _rope_store_triton(
        self,
        kernels: ModuleType,
        rope: FusedRope,
        qkv: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """-> rotated q [N, Hq, D]; k and v are in the cache."""
        norm = {}
        if self.q_norm is not None:
            norm = dict(q_norm_weight=self.q_norm.weight, k_norm_weight=self.k_norm.weight, eps=self.q_norm.eps)
        return kernels.rope_store_triton(
            qkv, self.num_heads, rope.table_index, rope.table, forward_batch.out_cache_loc,
            k_buf, v_buf, **norm,
        )


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int,
                 qk_norm: bool, sliding_window: Optional[int] = None) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        self.self_attn = LlamaAttention(config, layer_id, dtype, tp_rank, tp_size, qk_norm, sliding_window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        self.mlp = self.build_mlp(config, layer_id, dtype, tp_rank, tp_size)

    def build_mlp(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> nn.Module:
        """The layer's MLP: [N, H] -> [N, H], all-reduced over the TP group (a family's MoE block)."""
        return LlamaMLP(config, dtype, tp_rank, tp_size)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(rope, x, forward_batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual

    def cpu_decode_weights(self) -> Optional[DecodeLayerWeights]:
        """This layer's weights for the one-call CPU decode, or None where it cannot take them:
        a projection without integer blocks, a bias on gate_up, q/k norms, a sliding window, tensor
        parallelism."""
        attn, mlp = self.self_attn, self.mlp
        linears = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj, "down": mlp.down_proj}
        blocks = {name: linear.block_weight for name, linear in linears.items()}
        if (
            any(b is None for b in blocks.values())
            or attn.q_norm is not None
            or attn.attn.sliding_window is not None
            or mlp.gate_up_proj.bias is not None
            or attn.o_proj.tp_size > 1
            or not decode_layer_kernel_available()
        ):
            return None
        return decode_layer_weights(
            (self.input_layernorm.weight.detach(), self.post_attention_layernorm.weight.detach()),
            (self.input_layernorm.eps, self.post_attention_layernorm.eps), blocks,
            {name: _detached(linears[name].bias) for name in ("qkv", "o", "down")},
            (attn.num_heads, attn.num_kv_heads, attn.attn.head_dim), attn.attn.scaling,
        )


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


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
        if x.is_cuda and whole_heads and _triton_kernels("rotary.rope_store_triton") is not None:
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
        return self.logits_head(hidden, self.lm_head)

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


@functools.cache
def _triton_kernels(module: str) -> Optional[ModuleType]:
    """sgl_kernel_ext.<module>, a Triton kernel module, imported on first CUDA use so that
    CPU-only installs never need triton; None where triton is not importable."""
    try:
        return importlib.import_module(f"sgl_kernel_ext.{module}")
    except ImportError:
        return None


def _vocab_all_gather(tp_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def gather(logits: torch.Tensor) -> torch.Tensor:
        shards = [torch.empty_like(logits) for _ in range(tp_size)]
        torch.distributed.all_gather(shards, logits.contiguous())
        return torch.cat(shards, dim=-1)  # [B, V_padded]

    return gather
