"""What a quantisation method tells the linear layers: which layers it quantises and how each
holds its weight (QuantConfig, Fp8Scheme)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

# Our fused linears -> the checkpoint projections they are made of (names in ignore lists are
# the checkpoint's).
FUSED_PARTS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@dataclass(frozen=True)
class Fp8Scheme:
    """How one linear holds its FP8 weight.

    checkpoint_fp8: the checkpoint stores FP8 codes and scales; False: a bf16 checkpoint
    quantised at load, per output channel (--quantization fp8).
    weight_scale: "tensor" (one `weight_scale` per checkpoint tensor), "channel" (`weight_scale`
    [N] or [N, 1]) or "block" (`weight_scale_inv` [ceil(N / bn), ceil(K / bk)]).
    block: (bn, bk) for "block", else None.
    static_input: the checkpoint has an `input_scale` per tensor (activation_scheme static);
    otherwise activations are quantised per token (and group of 128 for block weights) at run time.
    """

    checkpoint_fp8: bool
    weight_scale: str
    block: Optional[tuple[int, int]] = None
    static_input: bool = False


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's (or the flag's) quantisation: the method name as --quantization spells it,
    the scheme of every quantised linear, and the layers left unquantised (module names, matched
    whole or as a dotted suffix, with or without a leading "model."; "re:" entries are regexes)."""

    method: str
    scheme: Fp8Scheme
    ignored: tuple[str, ...] = ()

    def scheme_for(self, prefix: str) -> Optional[Fp8Scheme]:
        """The scheme of our linear `prefix` (e.g. model.layers.0.self_attn.qkv_proj), None when
        the checkpoint leaves it unquantised. A fused linear's parts must agree."""
        *parent, leaf = prefix.split(".")
        parts = [".".join([*parent, p]) for p in FUSED_PARTS.get(leaf, (leaf,))]
        skipped = {part: self._ignored(part) for part in parts}
        if len(set(skipped.values())) > 1:
            raise ValueError(
                f"quantization_config ignores only some of the projections fused into {prefix}: {skipped}; "
                "they share one weight here and must be all quantised or all not."
            )
        return None if skipped[parts[0]] else self.scheme

    def _ignored(self, name: str) -> bool:
        bare = name.removeprefix("model.")
        for entry in self.ignored:
            if entry.startswith("re:"):
                if re.fullmatch(entry[3:], name) or re.fullmatch(entry[3:], bare):
                    return True
            elif any(n == e or n.endswith("." + e) for n in (name, bare) for e in (entry, entry.removeprefix("model."))):
                return True
        return False
