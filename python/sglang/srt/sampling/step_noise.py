"""The seed of one scheduler step's unseeded sampling noise.

The scheduler re-seeds its generator from (--random-seed, step counter) before every step
instead of letting it run on from process start. The noise is then a function of values every
TP rank holds alike (all ranks make the same scheduling decisions, so their step counters
agree), never of a process's own history of draws.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def step_noise_seed(random_seed: int, step: int) -> int:
    """A splitmix64 mix of (random_seed, step), in [0, 2**63) as torch.Generator.manual_seed wants."""
    z = (random_seed * 0xD1B54A32D192ED03 + (step + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1
