"""Rotary position embedding in the rotate-half (GPT-NeoX) layout that HF Llama/Qwen checkpoints use."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn


def rope_inv_freq(head_dim: int, base: float, scaling: Optional[dict[str, Any]] = None) -> torch.Tensor:
    """[head_dim / 2] float32 angular frequencies, after the checkpoint's RoPE scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, base, scaling)
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported.")
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a linear blend
    (in 1/wavelength) between the two cut-offs."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    blend = (original_len / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > original_len / low, inv_freq / factor, inv_freq)
    mixed = (1 - blend) * scaled / factor + blend * scaled
    is_medium = (wavelen <= original_len / low) & (wavelen >= original_len / high)
    return torch.where(is_medium, mixed, scaled)


def _yarn_inv_freq(head_dim: int, base: float, scaling: dict[str, Any]) -> torch.Tensor:
    """YaRN: frequencies that turn fewer than `beta_slow` times over the original context are
    interpolated (divided by `factor`), those that turn more than `beta_fast` times are kept, with a
    linear ramp over the dimensions in between."""
    factor, original_len = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over original_len
        return head_dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # the ramp needs a non-empty range
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [D/2]
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    # Rounded as transformers rounds them: 1 / (factor * base^e), not (1 / base^e) / factor.
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)  # [D/2]
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when not extending)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: Optional[dict[str, Any]]) -> float:
    """The factor cos and sin are multiplied by: `attention_factor` if given, else for YaRN
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else mscale(factor);
    1 for the other scalings."""
    if (scaling or {}).get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


class RotaryEmbedding(nn.Module):
    """cos/sin of every position, precomputed in float32 (times the scaling's attention factor)."""

    def __init__(
        self, head_dim: int, max_position: int, base: float, scaling: Optional[dict[str, Any]] = None
    ) -> None:
        super().__init__()
        self.half = head_dim // 2
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inv_freq(head_dim, base, scaling))  # [P, D/2]
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [P, D] float32
        attention_factor = rope_attention_factor(scaling)
        if attention_factor != 1.0:
            cos_sin = cos_sin * attention_factor
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] -> cos [N, 1, D] (both halves) and sin [N, 1, D] with its first half
        negated, in `dtype`; built once per step for all layers, so that apply_rotary_emb is
        three ops."""
        cos, sin = self.cos_sin_cache[positions].to(dtype).unsqueeze(1).split(self.half, dim=-1)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D] (q and k heads may be stacked) -> rotated, same shape:
    [x1 * cos - x2 * sin, x2 * cos + x1 * sin] = x * cos + [x2, x1] * [-sin, sin]."""
    x1, x2 = x.split(x.shape[-1] // 2, dim=-1)
    return torch.cat([x2, x1], dim=-1).mul_(signed_sin).addcmul_(x, cos)
