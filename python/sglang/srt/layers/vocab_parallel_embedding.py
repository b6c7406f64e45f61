"""Token embedding and LM head whose vocabulary rows can be split over tensor-parallel ranks."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sgl_kernel_ext.gemm.block_quant_linear import BlockQuantWeight
from sglang.srt.layers.linear import (
    CPU_PACK_BATCH_HINT,
    cpu_pack_supported,
    dense_matmul,
    find_block_quant,
    make_param,
    tp_all_reduce_sum,
)


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary, padded so the slices are equal;
    padding rows are zero and never looked up."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        params_dtype: torch.dtype = torch.float32,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.tp_size = tp_size
        self.shard_size = -(-num_embeddings // tp_size)
        self.vocab_start = tp_rank * self.shard_size
        self.vocab_end = min(self.vocab_start + self.shard_size, num_embeddings)
        self.weight = make_param((self.shard_size, embedding_dim), params_dtype, self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if loaded.shape[0] != self.num_embeddings:
            raise ValueError(f"Vocabulary mismatch: config {self.num_embeddings}, checkpoint {loaded.shape[0]}.")
        rows = self.vocab_end - self.vocab_start
        param.data[:rows].copy_(loaded[self.vocab_start : self.vocab_end])
        param.data[rows:].zero_()

    # The LM-head matmul is the largest of a decode step: on CPU it runs from oneDNN's blocked
    # layout (faster than dense, docs/cpu_kernels.md) or, for few rows, from the weight's integer blocks. Both are
    # copies, because the dense rows still serve embedding lookups (tied heads).
    _packed: Optional[torch.Tensor] = None
    _blocks: Optional[BlockQuantWeight] = None

    def process_weights_after_loading(self) -> None:
        self._blocks = find_block_quant(self.weight)
        if cpu_pack_supported(self.weight):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), CPU_PACK_BATCH_HINT)

    def project(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> this rank's logits [N, V_shard]."""
        weight = self._packed if self._packed is not None else self.weight
        return dense_matmul(hidden_states, weight, None, self._blocks)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [N, H]
        # Ids outside this rank's slice look up row 0 and are zeroed; the all-reduce adds the owner's row.
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [N] bool
        out = F.embedding((input_ids - self.vocab_start) * mine, self.weight) * mine.unsqueeze(-1)  # [N, H]
        return tp_all_reduce_sum(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection's weight [V_shard, H], sharded like the embedding; LogitsProcessor
    does the matmul and the all-gather of the shards."""
