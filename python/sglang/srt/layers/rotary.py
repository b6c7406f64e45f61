"""Rotary position embedding in the rotate-half (GPT-NeoX) layout that HF Llama/Qwen checkpoints
use, over the first `rotary_dim` dims of each head (all of them unless the model rotates a part)."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

# RoPE types whose frequencies depend on the length of the sequence being computed.
LENGTH_DEPENDENT_ROPE_TYPES = ("longrope", "dynamic")


def rope_inv_freq(
    head_dim: int, base: float, scaling: Optional[dict[str, Any]] = None, seq_len: Optional[int] = None
) -> torch.Tensor:
    """[head_dim / 2] float32 angular frequencies, after the checkpoint's RoPE scaling; `head_dim`
    is the rotated width. `seq_len` (longrope, dynamic): the length of the sequence computed."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, base, scaling)
    if rope_type == "longrope":
        # The long factors once the sequence outgrows the pretraining length, else the short ones.
        long = seq_len is not None and seq_len > scaling["original_max_position_embeddings"]
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * base**exponents)
    if rope_type == "dynamic":
        length = max(seq_len or 0, scaling["max_position_embeddings"])
        return 1.0 / (dynamic_ntk_base(base, scaling, length, head_dim) ** exponents)
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported.")
    return inv_freq


def dynamic_ntk_base(base: float, scaling: dict[str, Any], seq_len: Any, rotary_dim: int) -> Any:
    """Dynamic NTK: the base stretched for a sequence of `seq_len` >= max_position_embeddings
    positions (a number, or a float32 tensor of lengths, computed elementwise)."""
    factor, max_len = scaling["factor"], scaling["max_position_embeddings"]
    return base * ((factor * seq_len / max_len) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def longrope_attention_factor(scaling: dict[str, Any]) -> float:
    """The factor LongRoPE multiplies cos and sin by: the checkpoint's, or sqrt(1 + ln s / ln L)
    for the context extension s = factor (max_position / original_max_position when absent)."""
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or scaling["max_position_embeddings"] / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


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


def _cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """positions [P], inv_freq [R/2] (or [P, R/2]) -> [P, R] float32 = [cos | sin] * scale."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [P, R/2]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    return cos_sin * scale if scale != 1.0 else cos_sin


class RotaryEmbedding(nn.Module):
    """cos/sin of every position, precomputed in float32. Longrope keeps two tables (short factors
    in rows [0, P), long ones in rows [P, 2P)); dynamic NTK computes the rows of sequences past
    max_position_embeddings per step. For those two types a token's rows depend on the length L
    of its sequence in the step that computes it (prefix plus the step's tokens), which is what
    transformers' forward over a KV cache computes: longrope takes the long factors once
    L > original_max_position_embeddings, dynamic NTK stretches the base for L."""

    def __init__(
        self,
        rotary_dim: int,
        max_position: int,
        base: float,
        scaling: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(
                f"The rotary width (head_dim x partial_rotary_factor) is {rotary_dim}: RoPE rotates pairs of "
                "dimensions, so it must be even."
            )
        self.rotary_dim, self.half, self.base = rotary_dim, rotary_dim // 2, base
        self.scaling = scaling or {}
        self.rope_type = self.scaling.get("rope_type", "default")
        self.max_position = max_position
        positions = torch.arange(max_position, dtype=torch.float32)
        if self.rope_type == "longrope":
            scale = longrope_attention_factor(self.scaling)
            long_len = self.scaling["original_max_position_embeddings"] + 1
            tables = [
                _cos_sin(positions, rope_inv_freq(rotary_dim, base, self.scaling, n), scale) for n in (None, long_len)
            ]
            cos_sin = torch.cat(tables)  # [2P, R] float32: short rows, then long rows
        else:
            scale = rope_attention_factor(self.scaling)  # YaRN's magnitude correction, else 1
            cos_sin = _cos_sin(positions, rope_inv_freq(rotary_dim, base, self.scaling), scale)  # [P, R] float32
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)

    @property
    def length_dependent(self) -> bool:
        return self.rope_type in LENGTH_DEPENDENT_ROPE_TYPES

    def rows(self, positions: torch.Tensor, seq_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """positions [N] -> [N, R] float32 [cos | sin]; seq_lens [N] int64: the length of each
        token's sequence in this step, read by the length-dependent types (required for them)."""
        if self.rope_type == "longrope":
            is_long = seq_lens > self.scaling["original_max_position_embeddings"]
            return self.cos_sin_cache[positions + is_long.long() * self.max_position]
        if self.rope_type == "dynamic":
            stretched = self._dynamic_rows(positions, seq_lens)
            past = (seq_lens > self.scaling["max_position_embeddings"]).unsqueeze(-1)
            return torch.where(past, stretched, self.cos_sin_cache[positions])
        return self.cos_sin_cache[positions]

    def _dynamic_rows(self, positions: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """[N, R] rows with the base stretched for each token's length, in float32 as transformers'
        update computes it from a tensor length."""
        lengths = torch.clamp(seq_lens, min=self.scaling["max_position_embeddings"])
        base = dynamic_ntk_base(self.base, self.scaling, lengths, self.rotary_dim).unsqueeze(-1)  # [N, 1]
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.int64, device=positions.device).float()
        inv_freq = 1.0 / (base ** (exponents / self.rotary_dim))  # [N, R/2]
        return _cos_sin(positions, inv_freq)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype, seq_lens: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] -> cos [N, 1, R] (both halves) and sin [N, 1, R] with its first half
        negated, in `dtype`; built once per step for all layers, so that apply_rotary_emb is
        three ops."""
        cos, sin = self.rows(positions, seq_lens).to(dtype).unsqueeze(1).split(self.half, dim=-1)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D] (q and k heads may be stacked) -> rotated, same shape:
    [x1 * cos - x2 * sin, x2 * cos + x1 * sin] = x * cos + [x2, x1] * [-sin, sin] over the first
    R = cos.shape[-1] dims of each head; the other D - R dims pass unchanged."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        rotated = apply_rotary_emb(x[..., :rotary_dim], cos, signed_sin)
        return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)
    x1, x2 = x.split(x.shape[-1] // 2, dim=-1)
    return torch.cat([x2, x1], dim=-1).mul_(signed_sin).addcmul_(x, cos)


def rotary_dim_of(head_dim: int, hf_config: dict[str, Any], default_factor: float = 1.0) -> int:
    """The rotated width of each head: head_dim * partial_rotary_factor (read from the config's
    rope_parameters, else its top level, else `default_factor`)."""
    rope = hf_config.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", default_factor))
    return int(head_dim * factor)
