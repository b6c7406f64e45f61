"""What the Llama-style MoE families (Qwen3-MoE, Mixtral) share: the expert count key and a
decoder layer whose MLP may be a SparseMoeBlock."""

from __future__ import annotations

from typing import Any, Optional

from sgl_kernel_ext.layer.decode_layer_cpu import DecodeLayerWeights
from sglang.srt.layers.moe.sparse_block import SparseMoeBlock
from sglang.srt.models.llama_layers import LlamaDecoderLayer


def num_experts(hf: dict[str, Any]) -> int:
    """The expert count: `num_experts` in Qwen's configs, `num_local_experts` as transformers writes it."""
    return int(hf.get("num_experts") or hf.get("num_local_experts") or 0)


class MoeDecoderLayer(LlamaDecoderLayer):
    """A Llama-style layer whose MLP may be a SparseMoeBlock; such layers run op by op (the
    one-call CPU decode has no experts)."""

    def cpu_decode_weights(self) -> Optional[DecodeLayerWeights]:
        return None if isinstance(self.mlp, SparseMoeBlock) else super().cpu_decode_weights()
