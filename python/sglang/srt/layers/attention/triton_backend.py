"""CUDA attention by Triton kernels that read K/V in place from the paged cache.

Decode: split-KV (flash-decoding) so that a small batch still fills the GPU; the launch reads
no length on the host, so it is captured in the decode CUDA graph. In batch-invariant mode
decode runs the kernel that walks each request's positions in fixed blocks from 0 instead (a
split count would make a row's reduction order depend on the batch). Extend: one kernel over
the prefix and the new tokens of every request, causal, no per-shape planning. Each layer's sliding window and logit cap are the kernels'
constexprs, so a captured graph holds them.

MLA layers (v_head_dim < head_dim: one latent row per token is key and value) decode with the MLA
kernel (sgl_kernel_ext/attention/mla_decode.py: heads in blocks sharing each latent load, value
width kv_lora_rank), split-KV as above, one split in batch-invariant mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from sgl_kernel_ext.attention.decode_attention import decode_attention_triton
from sgl_kernel_ext.attention.mla_decode import mla_decode_attention
from sgl_kernel_ext.attention.paged_decode import default_num_kv_splits, paged_decode_attention
from sgl_kernel_ext.attention.paged_extend import paged_extend_attention
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.batch_invariant import is_batch_invariant
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.attention_layer import Attention


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, req_to_token: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.req_to_token = req_to_token  # [R, C] int64
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        device = req_to_token.device
        self.sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
        # Split-KV partials, sized for the largest decode batch seen so far.
        self.partial: Optional[torch.Tensor] = None
        self.lse: Optional[torch.Tensor] = None
        # The ones the captured graphs point into: kept alive when a larger eager batch grows them.
        self.captured_workspace: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.max_extend_len = 0  # this extend step's longest chunk: the kernel's grid

    def num_kv_splits(self, bs: int) -> int:
        # A function of the batch size alone: a captured graph and an eager step of the same
        # size split alike.
        return default_num_kv_splits(bs, self.num_kv_heads, self.sm_count)

    def _workspace_for(self, bs: int, splits: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous [bs, Hq, splits, width <= D] and [bs, Hq, splits] float32 views of one reused
        allocation."""
        rows = bs * self.num_heads * splits
        if self.partial is None or self.lse.numel() < rows:
            self._allocate(rows)
        partial = self.partial[: rows * width].view(bs, self.num_heads, splits, width)
        return partial, self.lse[:rows].view(bs, self.num_heads, splits)

    def _allocate(self, rows: int) -> None:
        device = self.req_to_token.device
        self.partial = torch.empty(rows * self.head_dim, dtype=torch.float32, device=device)  # [rows * D] float32
        self.lse = torch.empty(rows, dtype=torch.float32, device=device)  # [rows] float32

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_extend():
            self.max_extend_len = max(forward_batch.extend_seq_lens_cpu)

    def _graph_rows(self, max_bs: int) -> int:
        """Split-KV partial rows (request x head x split) of the largest batch up to max_bs."""
        return max(bs * self.num_heads * self.num_kv_splits(bs) for bs in range(1, max_bs + 1))

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self._allocate(self._graph_rows(max_bs))
        self.captured_workspace = (self.partial, self.lse)

    def cuda_graph_state_bytes(self, max_bs: int) -> int:
        return self._graph_rows(max_bs) * (self.head_dim + 1) * 4  # partial [rows, D] and lse [rows], float32

    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        pass  # decode reads the graph runner's static buffers through the forward batch

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        pass

    def forward_decode(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if layer.v_head_dim < layer.head_dim:
            return self._mla_decode(q, k_buf, layer, forward_batch)
        args = (q, k_buf, v_buf, self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, layer.scaling)
        opts = dict(sliding_window=layer.sliding_window, logit_cap=layer.logit_cap)
        if is_batch_invariant():
            return decode_attention_triton(*args, **opts)
        bs = q.shape[0]
        splits = self.num_kv_splits(bs)
        out = torch.empty((bs, layer.num_heads, layer.head_dim), dtype=q.dtype, device=q.device)  # [B, Hq, D]
        return paged_decode_attention(*args, out, self._workspace_for(bs, splits, layer.head_dim), splits, **opts)

    def _mla_decode(self, q: torch.Tensor, kv_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch) -> torch.Tensor:
        """q [B, H, D] absorbed queries over the latent rows -> [B, H, D], the first v_head_dim
        values of each head written (MLA layers have no window and no logit cap)."""
        bs, rank = q.shape[0], layer.v_head_dim
        splits = 1 if is_batch_invariant() else self.num_kv_splits(bs)
        out = torch.empty((bs, layer.num_heads, layer.head_dim), dtype=q.dtype, device=q.device)  # [B, H, D]
        mla_decode_attention(
            q, kv_buf, self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, layer.scaling, rank,
            out[..., :rank], self._workspace_for(bs, splits, rank), splits,
        )
        return out

    def forward_extend(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        out = torch.empty_like(q)  # [N, Hq, D]
        return paged_extend_attention(
            q, k_buf, v_buf, self.req_to_token, forward_batch.req_pool_indices, forward_batch.extend_start_loc,
            forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens, self.max_extend_len, layer.scaling, out,
            sliding_window=layer.sliding_window, logit_cap=layer.logit_cap,
        )
