"""ModelRunner: the model, its KV cache pools, and one forward step."""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from sgl_kernel_ext.attention.decode_attention_cpu import cpu_decode_attention_available
from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_cpu_applies
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_cpu_applies
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.communication import min_across_ranks
from sglang.srt.distributed.parallel_state import tp_cpu_group
from sglang.srt.layers.attention import GatherWorkspace, build_attention_metadata
from sglang.srt.layers.batch_invariant import batch_invariant
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader import load_model

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Default KV sizing: this many positions per running request...
DEFAULT_TOKENS_PER_REQUEST = 4096
# ...within a budget: on CPU a slice of free RAM (capped), on CUDA a share of the memory left after the weights.
CPU_KV_BUDGET_BYTES = 2 << 30
CPU_KV_RAM_FRACTION = 0.2
CUDA_KV_FREE_FRACTION = 0.8


class ModelRunner:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        context_length: Optional[int] = None,
        max_total_tokens: Optional[int] = None,
        max_running_requests: int = 64,
        tp_rank: int = 0,
        tp_size: int = 1,
        deterministic: bool = False,
    ) -> None:
        self.device = torch.device(device)
        # --enable-deterministic-inference: batch-invariant forward passes.
        self.deterministic = deterministic
        self.dtype = resolve_dtype(dtype, self.device)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.model_config = ModelConfig.from_path(model_path, context_length)
        self.vocab_size = self.model_config.vocab_size
        if self.device.type == "cpu":
            _build_cpu_kernels()
        self.model = load_model(self.model_config, model_path, self.dtype, self.device, tp_rank, tp_size)

        self.max_total_num_tokens = max_total_tokens or self._default_max_total_tokens(max_running_requests)
        # One spare request slot: a chunked prefill can hold one while a full batch decodes.
        self.req_to_token_pool = ReqToTokenPool(max_running_requests + 1, self.model_config.context_len, self.device)
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(self.max_total_num_tokens, self.device)
        attn = self.model.model.layers[0].self_attn
        self.kv_cache = KVCache(
            self.max_total_num_tokens,
            self.model_config.num_hidden_layers,
            attn.num_kv_heads,
            self.model_config.head_dim,
            self.dtype,
            self.device,
        )
        self.attn_workspace = GatherWorkspace(attn.num_kv_heads, self.model_config.head_dim, self.dtype, self.device)
        logger.info(
            "KV cache: %d tokens (%.1f MiB, %s) for %d running requests, context %d.",
            self.max_total_num_tokens, self.kv_cache.mem_bytes() / 2**20, self.dtype, max_running_requests,
            self.model_config.context_len,
        )

    def _default_max_total_tokens(self, max_running_requests: int) -> int:
        wanted = max_running_requests * min(self.model_config.context_len, DEFAULT_TOKENS_PER_REQUEST)
        per_token = self.model_config.kv_cache_bytes_per_token(self.dtype.itemsize, self.tp_size)
        tokens = max(1, min(wanted, self._kv_budget_bytes() // per_token))
        if self.tp_size > 1:
            # Each rank measures its own free memory; all must hold the same capacity, or their
            # admission decisions (and with them the collectives) would diverge.
            tokens = min_across_ranks(tokens, tp_cpu_group())
        return tokens

    def _kv_budget_bytes(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * CUDA_KV_FREE_FRACTION)
        free_ram = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return min(CPU_KV_BUDGET_BYTES, int(free_ram * CPU_KV_RAM_FRACTION))

    @torch.inference_mode()
    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """next_token_logits [B, V] float32 of each request's last new token (and
        input_token_logits [N, V] when forward_batch.return_input_logits)."""
        forward_batch.kv_cache = self.kv_cache
        with batch_invariant(self.deterministic):
            forward_batch.attn_metadata = build_attention_metadata(
                forward_batch, self.req_to_token_pool.req_to_token, self.attn_workspace
            )
            return self.model(forward_batch)


def _build_cpu_kernels() -> None:
    """Compile (or load from the cache) the C kernels the CPU layers use, now rather than inside
    the first request; the linears' kernel is built by the loader."""
    probe = torch.zeros(1, 2)
    cpu_decode_attention_available()
    rmsnorm_cpu_applies(probe, torch.zeros(2))
    rope_store_cpu_applies(probe, torch.zeros(1, 1, 2))


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}.")
    return DTYPES[dtype]
