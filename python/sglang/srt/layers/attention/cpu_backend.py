"""CPU attention: decode by the C kernel that reads each request's K/V rows in place from the
paged cache (float32; rows independent of the batch, so batch-invariant mode uses it too);
extend, and decode where the kernel cannot run, by the torch SDPA paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sgl_kernel_ext.attention.decode_attention_cpu import cpu_decode_attention_available, decode_attention_cpu
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.attention_layer import Attention


class CpuAttnBackend(TorchNativeAttnBackend):
    def __init__(self, req_to_token: torch.Tensor, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__(req_to_token, num_kv_heads, head_dim, dtype)
        self.use_kernel = dtype == torch.float32 and cpu_decode_attention_available()

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode() and self.use_kernel:
            self.metadata = None  # the kernel reads the batch's own tensors
        else:
            super().init_forward_metadata(forward_batch)

    def forward_decode(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if not self.use_kernel:
            return super().forward_decode(q, k_buf, v_buf, layer, forward_batch)
        return decode_attention_cpu(
            q, k_buf, v_buf, self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, layer.scaling,
            sliding_window=layer.sliding_window, logit_cap=layer.logit_cap,
        )
