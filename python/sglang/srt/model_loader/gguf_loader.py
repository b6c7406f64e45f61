"""GGUF checkpoints: dequantised tensors under HF parameter names."""

from __future__ import annotations

import re
from typing import Iterator

import numpy as np
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.gguf_header import read_tensor_infos

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def iter_gguf_weights(path: str, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, float32 tensor) for every tensor of the file.

    Tensors are located with our header reader (GGUFReader would first parse the token tables,
    seconds per process, paid again by every TP rank) and dequantised by the gguf package."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    _, tensors = read_tensor_infos(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for tensor in tensors:
        qtype = GGMLQuantizationType(tensor.qtype)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        *outer, inner = tensor.shape
        row_bytes = inner // block_size * type_size
        end = tensor.offset + int(np.prod(outer, dtype=np.int64)) * row_bytes
        # A plain array: dequantize slices row groups, which on a memmap costs more than the copy.
        raw = np.array(data[tensor.offset : end]).reshape(*outer, row_bytes)
        weight = torch.from_numpy(np.array(dequantize(raw, qtype), dtype=np.float32))
        name = hf_name(tensor.name)
        # llama.cpp permutes Llama's q/k rows for its interleaved RoPE; undo it for rotate-half.
        if config.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            weight = unpermute_rope_rows(weight, heads)
        yield name, weight


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"Unsupported GGUF tensor {gguf_name!r}.")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Within each head, llama.cpp stores rows as (pair index, half) and HF as (half, pair index)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, -1).transpose(1, 2).reshape(weight.shape)
