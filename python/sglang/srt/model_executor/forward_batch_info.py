"""ForwardBatch: what one model forward step computes, as tensors plus host-side lengths."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Optional, Sequence, Union

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention import AttentionMetadata
    from sglang.srt.mem_cache.memory_pool import KVCache


class ForwardMode(IntEnum):
    EXTEND = 1  # prefill, possibly of a chunk after a cached prefix
    DECODE = 2  # exactly one new token per request

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    """The new tokens of B requests, concatenated per request (N tokens in all).

    The caller has already allocated `out_cache_loc` and written it into req_to_token at
    positions [extend_prefix_len, seq_len) of each request.
    """

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    req_pool_indices: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64, prefix + new tokens
    extend_seq_lens: torch.Tensor  # [B] int64, new tokens (1 in decode)
    extend_prefix_lens: torch.Tensor  # [B] int64, tokens already in the KV cache
    out_cache_loc: torch.Tensor  # [N] int64 KV slots of the new tokens
    # Host copies, so attention and logits code never read lengths back from the device.
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    # Also return the logits of every new token (prompt logprobs).
    return_input_logits: bool = False

    # Set by ModelRunner.forward.
    kv_cache: Optional["KVCache"] = None
    attn_metadata: Optional["AttentionMetadata"] = None

    @classmethod
    def init_new(
        cls,
        forward_mode: ForwardMode,
        input_ids: Union[torch.Tensor, Sequence[int]],
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        extend_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        device: Union[str, torch.device],
        return_input_logits: bool = False,
    ) -> "ForwardBatch":
        """Build from host-side lengths; `input_ids` may already be a device tensor (overlap decode)."""
        if forward_mode.is_decode() and any(n != 1 for n in extend_lens):
            raise ValueError("A decode batch has exactly one new token per request.")
        prefix_lens, extend_lens = list(prefix_lens), list(extend_lens)
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        positions = [i for p, s in zip(prefix_lens, seq_lens) for i in range(p, s)]

        def to_dev(values: Sequence[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

        return cls(
            forward_mode=forward_mode,
            batch_size=len(seq_lens),
            input_ids=torch.as_tensor(input_ids, dtype=torch.int64).to(device, non_blocking=True),
            positions=to_dev(positions),
            req_pool_indices=to_dev(req_pool_indices),
            seq_lens=to_dev(seq_lens),
            extend_seq_lens=to_dev(extend_lens),
            extend_prefix_lens=to_dev(prefix_lens),
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=seq_lens,
            extend_seq_lens_cpu=extend_lens,
            extend_prefix_lens_cpu=prefix_lens,
            return_input_logits=return_input_logits,
        )
