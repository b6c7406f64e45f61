"""Per-request recurrent state of hybrid models (Gated DeltaNet layers), beside the paged KV cache.

Each request slot (its req_to_token row, `req_pool_indices`) owns, for every linear-attention
layer, a conv state [C, K-1] (the last K-1 inputs of the causal conv1d) and a recurrent state
[Hv, Dk, Dv] (float32). A row is zeroed when a request starts (an extend with no cached prefix),
carried across its prefill chunks and decode steps, and reused with the row when the request ends.
The extra row, the request pool's padding row, is what CUDA-graph padding rows read and write.
"""

from __future__ import annotations

from typing import NamedTuple, Union

import torch


class RecurrentStateLayout(NamedTuple):
    """What one request slot holds per linear-attention layer."""

    num_layers: int
    conv_shape: tuple[int, int]  # [C, K-1]
    state_shape: tuple[int, int, int]  # [Hv, Dk, Dv]
    conv_dtype: torch.dtype

    def bytes_per_request(self) -> int:
        conv = self.conv_shape[0] * self.conv_shape[1] * self.conv_dtype.itemsize
        state = self.state_shape[0] * self.state_shape[1] * self.state_shape[2] * 4
        return self.num_layers * (conv + state)


class RecurrentStatePool:
    def __init__(self, layout: RecurrentStateLayout, num_rows: int, device: Union[str, torch.device]) -> None:
        """num_rows: the request pool's rows, its padding row included."""
        self.layout = layout
        self.conv = torch.zeros(layout.num_layers, num_rows, *layout.conv_shape, dtype=layout.conv_dtype, device=device)  # [L, R+1, C, K-1]
        self.state = torch.zeros(layout.num_layers, num_rows, *layout.state_shape, dtype=torch.float32, device=device)  # [L, R+1, Hv, Dk, Dv]

    def reset(self, rows: torch.Tensor) -> None:
        """Zero every layer's states of `rows` ([M] int64 on the pool's device)."""
        if rows.numel():
            self.conv.index_fill_(1, rows, 0)
            self.state.index_fill_(1, rows, 0)

    def mem_bytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.state.numel() * self.state.element_size()
