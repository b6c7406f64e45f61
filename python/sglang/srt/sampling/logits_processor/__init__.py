"""Batch-level logits processors (vLLM's V1 API): the interface plugins implement, the per-batch
pipeline, the loader, and the built-ins (allowed_token_ids, bad_words, no_repeat_ngram_size,
thinking_token_budget). See docs/sampling.md."""

from sglang.srt.sampling.logits_processor.adapter import AdapterLogitsProcessor
from sglang.srt.sampling.logits_processor.batch_update import BatchUpdateBuilder
from sglang.srt.sampling.logits_processor.interface import BatchUpdate, LogitsProcessor, MoveDirectionality, apply_batch_update
from sglang.srt.sampling.logits_processor.loader import BUILT_IN_LOGITS_PROCESSORS, LoadedLogitsProcessors

__all__ = [
    "AdapterLogitsProcessor",
    "BatchUpdate",
    "BatchUpdateBuilder",
    "BUILT_IN_LOGITS_PROCESSORS",
    "LoadedLogitsProcessors",
    "LogitsProcessor",
    "MoveDirectionality",
    "apply_batch_update",
]
