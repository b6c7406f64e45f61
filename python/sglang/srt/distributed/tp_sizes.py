"""Which tensor-parallel sizes a model can be split by, checked before any rank is started.

The sharded layers need: attention heads divisible by tp_size; KV heads divisible by tp_size
(split) or dividing it (replicated, each rank keeps one); the MLP intermediate size divisible
by tp_size. The vocabulary is padded to a multiple of tp_size, so it never limits the choice.
"""

from __future__ import annotations

from sglang.srt.configs.model_config import ModelConfig


def tp_split_problems(config: ModelConfig, tp_size: int) -> list[str]:
    """Why `tp_size` cannot split `config`, one phrase per dimension; empty when it can."""
    problems = []
    heads, kv_heads, inter = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if heads % tp_size:
        problems.append(f"the {heads} attention heads are not divisible by {tp_size}")
    if (kv_heads >= tp_size and kv_heads % tp_size) or (kv_heads < tp_size and tp_size % kv_heads):
        problems.append(
            f"the {kv_heads} KV heads are neither divisible by {tp_size} (to split them) "
            f"nor a divisor of it (to replicate them)"
        )
    if inter % tp_size:
        problems.append(f"the MLP intermediate size {inter} is not divisible by {tp_size}")
    return problems


def supported_tp_sizes(config: ModelConfig) -> list[int]:
    """Every TP size that splits the model (never more ranks than attention heads)."""
    return [t for t in range(1, config.num_attention_heads + 1) if not tp_split_problems(config, t)]


def check_tp_size(config: ModelConfig, tp_size: int) -> None:
    """ValueError naming each dimension `tp_size` cannot split and the sizes that would work."""
    problems = tp_split_problems(config, tp_size)
    if not problems:
        return
    sizes = ", ".join(map(str, supported_tp_sizes(config)))
    raise ValueError(
        f"--tp-size {tp_size} cannot split this model: {'; '.join(problems)}. "
        f"TP sizes that work for it: {sizes} (the vocabulary of {config.vocab_size} is padded, so it never limits them)."
    )
