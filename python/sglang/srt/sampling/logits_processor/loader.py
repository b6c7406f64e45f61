"""Which batch-level processors a server runs: the built-ins, then the `sglang.logits_processors`
entry-point group, then `--logits-processors module.path:QualName ...` (vLLM's flag and form).
Classes are loaded once per process (tokenizer manager: validate_params; each scheduler rank:
the instances), so only JSON arguments ever cross HTTP."""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any, Sequence

import torch

from sglang.srt.sampling.logits_processor.allowed_token_ids import AllowedTokenIdsLogitsProcessor
from sglang.srt.sampling.logits_processor.bad_words import BadWordsLogitsProcessor
from sglang.srt.sampling.logits_processor.interface import LogitsProcessor
from sglang.srt.sampling.logits_processor.no_repeat_ngram import NoRepeatNGramLogitsProcessor
from sglang.srt.sampling.logits_processor.pipeline import LogitsProcessorPipeline, qualified_name
from sglang.srt.sampling.logits_processor.thinking_budget import ThinkingBudgetLogitsProcessor

ENTRY_POINT_GROUP = "sglang.logits_processors"
BUILT_IN_LOGITS_PROCESSORS: tuple[type[LogitsProcessor], ...] = (
    AllowedTokenIdsLogitsProcessor,
    BadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    ThinkingBudgetLogitsProcessor,
)


def load_processor_class(spec: str) -> type[LogitsProcessor]:
    """`module.path:QualName` (exactly one colon) -> a LogitsProcessor subclass, or ValueError."""
    if spec.count(":") != 1:
        raise ValueError(f"--logits-processors: {spec!r} must have the form module.path:QualName (one colon)")
    module_name, qualname = spec.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"--logits-processors: cannot load {spec!r}: {type(err).__name__}: {err}") from None
    return _checked(obj, spec)


def _checked(obj: Any, origin: str) -> type[LogitsProcessor]:
    if not (isinstance(obj, type) and issubclass(obj, LogitsProcessor)):
        raise ValueError(f"{origin} is not a subclass of sglang.srt.sampling.logits_processor.LogitsProcessor")
    return obj


def plugin_classes(specs: Sequence[str]) -> list[type[LogitsProcessor]]:
    """Entry-point plugins, then the flag's classes (each class once)."""
    classes: list[type[LogitsProcessor]] = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        classes.append(_checked(entry.load(), f"entry point {entry.name} ({entry.value})"))
    classes += [load_processor_class(spec) for spec in specs]
    return list(dict.fromkeys(classes))


class LoadedLogitsProcessors:
    """The processor classes of a server and what their instances are built with."""

    def __init__(self, classes: Sequence[type[LogitsProcessor]], server_args: Any, device: torch.device) -> None:
        self.classes = list(classes)
        self.server_args = server_args
        self.device = torch.device(device)
        self.is_pin_memory = self.device.type == "cuda"

    @classmethod
    def from_server_args(cls, server_args: Any, device: Any) -> "LoadedLogitsProcessors":
        classes = [*BUILT_IN_LOGITS_PROCESSORS, *plugin_classes(server_args.logits_processors or ())]
        return cls(classes, server_args, device)

    def instantiate(self, cls: type[LogitsProcessor]) -> LogitsProcessor:
        return cls(self.server_args, self.device, self.is_pin_memory)

    def validate(self, params: Any) -> None:
        """Every processor's validate_params; its ValueError becomes one naming the processor."""
        for cls in self.classes:
            try:
                cls.validate_params(params)
            except ValueError as err:
                raise ValueError(f"logits processor {qualified_name(cls)}: {err}") from None

    def pipeline_for(self, rows: Sequence[Any], current: Any = None) -> Any:
        """The pipeline for a batch of `rows` (`current` is its pipeline so far): None when no
        processor acts on any row."""
        classes = [cls for cls in self.classes if any(cls.acts_on(row.params) for row in rows)]
        if not classes:
            return None
        if current is None:
            return LogitsProcessorPipeline(self, classes)
        current.set_classes(classes)
        return current
