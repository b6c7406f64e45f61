"""What the CUDA-graph runners read from the ModelRunner that owns them."""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool
from sglang.srt.mem_cache.recurrent_state_pool import RecurrentStatePool


class GraphHost(Protocol):
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    deterministic: bool
    model: torch.nn.Module
    model_config: ModelConfig
    kv_cache: KVCache
    state_pool: Optional[RecurrentStatePool]  # hybrid models only
    attn_backend: AttentionBackend
    req_to_token_pool: ReqToTokenPool
    future_tokens: torch.Tensor  # [R + 1] int64, the last sampled id of every request slot
