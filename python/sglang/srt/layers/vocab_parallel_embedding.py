"""Token embedding and LM head whose vocabulary rows can be split over tensor-parallel ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.linear import CPU_PACK_BATCH_HINT, cpu_pack_supported, dense_matmul, make_param


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

    def process_weights_after_loading(self) -> None:
        # The LM-head matmul is the largest of a decode step; oneDNN's blocked layout makes it ~3x
        # faster on CPU. A copy, because the dense rows still serve embedding lookups (tied heads).
        self._packed = None
        if cpu_pack_supported(self.weight):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), CPU_PACK_BATCH_HINT)

    def project(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> this rank's logits [N, V_shard]."""
        packed = getattr(self, "_packed", None)
        return dense_matmul(hidden_states, packed if packed is not None else self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [N, H]
        # Ids outside this rank's slice look up row 0 and are zeroed; the all-reduce adds the owner's row.
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)  # [N] bool
        out = F.embedding((input_ids - self.vocab_start) * mine, self.weight) * mine.unsqueeze(-1)  # [N, H]
        torch.distributed.all_reduce(out)
        return out


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection's weight [V_shard, H], sharded like the embedding; LogitsProcessor
    does the matmul and the all-gather of the shards."""
