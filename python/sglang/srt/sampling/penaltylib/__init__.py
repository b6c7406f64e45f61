"""Batched sampling penalties (frequency, presence, repetition, min_new_tokens) with sparse per-row state."""

from sglang.srt.sampling.penaltylib.frequency_penalty import BatchedFrequencyPenalizer
from sglang.srt.sampling.penaltylib.min_new_tokens import BatchedMinNewTokensPenalizer
from sglang.srt.sampling.penaltylib.orchestrator import BatchedPenalizerOrchestrator
from sglang.srt.sampling.penaltylib.presence_penalty import BatchedPresencePenalizer
from sglang.srt.sampling.penaltylib.repetition_penalty import BatchedRepetitionPenalizer
from sglang.srt.sampling.penaltylib.token_counts import TokenCounts

__all__ = [
    "BatchedFrequencyPenalizer",
    "BatchedMinNewTokensPenalizer",
    "BatchedPenalizerOrchestrator",
    "BatchedPresencePenalizer",
    "BatchedRepetitionPenalizer",
    "TokenCounts",
]
