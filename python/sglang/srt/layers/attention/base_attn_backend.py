"""The interface every attention backend implements (SGLang's shape).

A backend computes its per-step metadata once (`init_forward_metadata`), shared by every
layer, then attends each layer's queries over the paged KV cache. Backends that can run
inside a captured CUDA graph also implement the three graph hooks: static state allocated
once for the largest captured batch, and metadata set up at capture and before each replay
from the graph runner's static input buffers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.attention_layer import Attention


class AttentionBackend(ABC):
    # Whether the decode forward may be captured in a CUDA graph with this backend.
    supports_cuda_graph = False

    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Per-step metadata for an eagerly run batch."""

    def init_cuda_graph_state(self, max_bs: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs.")

    def cuda_graph_state_bytes(self, max_bs: int) -> int:
        """Device bytes init_cuda_graph_state(max_bs) allocates."""
        return 0

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs.")

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs.")

    def forward(self, q: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch) -> torch.Tensor:
        """q [N, Hq, D] -> [N, Hq, D]; the layer's K/V for this step are already in the cache."""
        k_buf, v_buf = forward_batch.kv_cache.get_kv(layer.layer_id)
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k_buf, v_buf, layer, forward_batch)
        return self.forward_extend(q, k_buf, v_buf, layer, forward_batch)

    @abstractmethod
    def forward_decode(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """One query per request: q [B, Hq, D] -> [B, Hq, D]."""

    @abstractmethod
    def forward_extend(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """The new tokens of each request after its cached prefix: q [N, Hq, D] -> [N, Hq, D]."""
