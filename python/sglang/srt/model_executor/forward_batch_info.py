"""ForwardBatch: what one model forward step computes, as tensors plus host-side lengths."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Optional, Sequence, Union

import torch

from sglang.srt.mem_cache.memory_pool import KVCache
from sglang.srt.mem_cache.recurrent_state_pool import RecurrentStatePool
from sglang.srt.utils import host_to_device


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
    extend_start_loc: torch.Tensor  # [B] int64, offset of each request's first new token among the N
    out_cache_loc: torch.Tensor  # [N] int64 KV slots of the new tokens
    # Host copies, so attention and logits code never read lengths back from the device.
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    # Also return the logits of every new token (prompt logprobs).
    return_input_logits: bool = False
    # A speculative verify whose every request extends by exactly this many tokens (its last token
    # and its drafts, padded): the shape the verify CUDA graphs are captured for.
    verify_width: Optional[int] = None

    # Set by ModelRunner.forward. The attention backend (layers/attention) is typed there: the
    # layers read this batch, so this module does not import them.
    kv_cache: Optional[KVCache] = None
    attn_backend: Any = None
    # Hybrid models (linear-attention layers): each request slot's conv and recurrent states.
    state_pool: Optional[RecurrentStatePool] = None
    # Set while piecewise CUDA graphs are captured: takes (attention layer, q) in place of the
    # attention and returns the buffer the attention will write at replay (piecewise_cuda_graph_runner.py).
    attention_split: Optional[Callable[[Any, torch.Tensor], torch.Tensor]] = None
    # Set while a decode graph is captured: [B, V] float32, the static buffer its next-token
    # logits are written into (cuda_graph_runner.py); None leaves the logits a new tensor.
    logits_out: Optional[torch.Tensor] = None

    @classmethod
    def init_new(
        cls,
        forward_mode: ForwardMode,
        input_ids: Optional[Sequence[int]],
        req_pool_indices: Sequence[int],
        prefix_lens: Sequence[int],
        extend_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        device: Union[str, torch.device],
        return_input_logits: bool = False,
    ) -> "ForwardBatch":
        """Build from host-side values with one host-to-device copy (pinned, asynchronous on CUDA).
        `input_ids` None leaves them to the caller (overlap decode reads them on the device);
        `out_cache_loc` may be a host tensor, copied in the same transfer."""
        if forward_mode.is_decode() and any(n != 1 for n in extend_lens):
            raise ValueError("A decode batch has exactly one new token per request.")
        device = torch.device(device)
        prefix_lens, extend_lens = list(prefix_lens), list(extend_lens)
        batch, tokens = len(extend_lens), sum(extend_lens)
        seq_lens = [p + n for p, n in zip(prefix_lens, extend_lens)]
        starts = [0] * batch
        for i in range(1, batch):
            starts[i] = starts[i - 1] + extend_lens[i - 1]
        if forward_mode.is_decode():
            positions = prefix_lens
        else:
            positions = [i for p, s in zip(prefix_lens, seq_lens) for i in range(p, s)]
        loc_on_host = out_cache_loc.device.type == "cpu"
        ids = list(input_ids) if input_ids is not None else [0] * tokens
        host = [ids, positions, list(req_pool_indices), seq_lens, extend_lens, prefix_lens, starts]
        # Each field starts 16-byte aligned in the packed copy: Triton specialises kernels on a
        # pointer's alignment, and a field whose alignment followed the batch size would make
        # kernels compile in the serving loop.
        lengths = [len(part) for part in host]
        packed = torch.tensor([v for part in host for v in part + [0] * (len(part) % 2)], dtype=torch.int64)
        if loc_on_host:
            packed = torch.cat([packed, out_cache_loc.to(torch.int64)])
            lengths.append(out_cache_loc.numel())
        fields = _unpack(host_to_device(packed, device), lengths)  # views of one [sum] int64 copy
        return cls(
            forward_mode=forward_mode,
            batch_size=batch,
            input_ids=fields[0],
            positions=fields[1],
            req_pool_indices=fields[2],
            seq_lens=fields[3],
            extend_seq_lens=fields[4],
            extend_prefix_lens=fields[5],
            extend_start_loc=fields[6],
            out_cache_loc=fields[7] if loc_on_host else out_cache_loc,
            seq_lens_cpu=seq_lens,
            extend_seq_lens_cpu=extend_lens,
            extend_prefix_lens_cpu=prefix_lens,
            return_input_logits=return_input_logits,
        )


def _unpack(packed: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """The fields of a packed copy, each padded to an even length (16 bytes of int64)."""
    fields, offset = [], 0
    for n in lengths:
        fields.append(packed[offset : offset + n])
        offset += n + n % 2
    return fields
