"""DeepSeek-V3's multi-token-prediction (NextN) modules, loaded as draft heads kept on the model.

Module i predicts one token further ahead than the main model. Its checkpoint tensors sit under
`model.layers.{num_hidden_layers + i}.`:
    enorm.weight [H], hnorm.weight [H]      RMSNorms of the next token's embedding and of the
                                            main model's last hidden state
    eh_proj.weight [H, 2H]                  [enorm(embedding) | hnorm(hidden)] -> H
    self_attn.*, mlp.*, *_layernorm.weight  one decoder layer (MLA, MoE) of the main model's shape
    shared_head.norm.weight [H]             the final norm before the output head
    embed_tokens.weight [V, H], shared_head.head.weight [V, H]
                                            copies of the main model's embedding and output head:
                                            shape-checked and not kept (the heads share the main
                                            model's, as DeepSeek-V3 trains them)
The heads are not run by the target model's forward; a speculative-decoding draft runs them.
Their decoder layer's attention is numbered after the main layers and owns no KV cache here.
"""

from __future__ import annotations

import re
from typing import Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import default_weight_loader, dense_matmul, make_param

# Checkpoint suffixes of a NextN layer that copy the main model's tensors of the same shape.
SHARED_WITH_MAIN = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
_HEAD_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.*)$")


class EhProjection(nn.Module):
    """eh_proj: [enorm(embedding) | hnorm(hidden)] [N, 2H] -> [N, H], replicated, in the model
    dtype. Not a LinearBase: DeepSeek-V3's FP8 checkpoints keep this weight unquantised, so FP8
    attachment must pass it by."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = make_param((hidden_size, 2 * hidden_size), dtype, default_weight_loader)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_matmul(x, self.weight)


class DeepseekV3NextNHead(nn.Module):
    """One NextN module: enorm, hnorm, eh_proj, a decoder layer and shared_head.norm."""

    def __init__(self, config: ModelConfig, decoder: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(hidden, eps, params_dtype=dtype)
        self.hnorm = RMSNorm(hidden, eps, params_dtype=dtype)
        self.eh_proj = EhProjection(hidden, dtype)
        self.decoder = decoder
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(hidden, eps, params_dtype=dtype)


def nextn_target(name: str, num_hidden_layers: int, num_heads: int) -> Optional[tuple[int, str]]:
    """A checkpoint tensor of NextN module i (i < num_heads) -> (i, its name relative to the
    head: `decoder.self_attn.kv_b_proj.weight`, `eh_proj.weight`, or one of SHARED_WITH_MAIN's
    keys); None for every other tensor."""
    match = _LAYER_RE.match(name)
    if match is None:
        return None
    index, rest = int(match.group(1)) - num_hidden_layers, match.group(2)
    if not 0 <= index < num_heads:
        return None
    if rest in SHARED_WITH_MAIN or rest.startswith(_HEAD_OWN):
        return index, rest
    return index, "decoder." + rest


def check_shared_copy(rest: str, tensor: torch.Tensor, vocab_size: int, hidden_size: int) -> None:
    """A NextN copy of the main embedding or output head must have the main tensor's full shape."""
    if tuple(tensor.shape) != (vocab_size, hidden_size):
        raise ValueError(f"NextN tensor {rest!r} has shape {tuple(tensor.shape)}, expected {(vocab_size, hidden_size)}.")


def check_shape(name: str, tensor: torch.Tensor, param: nn.Parameter) -> None:
    """The head's own (replicated) tensors load whole: their shapes must match exactly."""
    if tuple(tensor.shape) != tuple(param.shape):
        raise ValueError(f"NextN tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}.")
