"""What the CUDA-graph runners read from the ModelRunner that owns them."""

from __future__ import annotations

from typing import Protocol

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool


class GraphHost(Protocol):
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    deterministic: bool
    model: torch.nn.Module
    model_config: ModelConfig
    kv_cache: KVCache
    attn_backend: AttentionBackend
    req_to_token_pool: ReqToTokenPool
    future_tokens: torch.Tensor  # [R + 1] int64, the last sampled id of every request slot
