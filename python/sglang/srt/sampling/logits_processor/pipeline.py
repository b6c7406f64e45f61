"""LogitsProcessorPipeline: the batch-level processors of one SamplingBatchInfo, run once per step.

Instances are made per batch, only for the processor classes that act on one of its rows, and
fed the BatchUpdate from the rows they saw at their last step to the rows sampled now. A
processor that raises (in update_state or apply) fails exactly the rows it acts on; its instance
is dropped, and the next step starts a new one over the rows then present.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor.batch_update import BatchUpdateBuilder
from sglang.srt.sampling.logits_processor.interface import LogitsProcessor

logger = logging.getLogger(__name__)

CHECK_ENV = "SGLANG_CHECK_LOGITS_PROCESSORS"


def check_requested() -> bool:
    return os.environ.get(CHECK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class LogitsProcessorPipeline:
    """The processor instances of one batch (SamplingBatchInfo.logits_processors)."""

    def __init__(self, factory: Any, classes: Sequence[type[LogitsProcessor]]) -> None:
        self.factory = factory  # LoadedLogitsProcessors: makes the instances
        self.classes = list(classes)  # the classes acting on some row of the batch, in load order
        self.instances: dict[type[LogitsProcessor], LogitsProcessor] = {}
        # The row list each instance was last told about. SamplingBatchInfo replaces its list on
        # every filter/merge and never mutates one, so the same list object means the same rows.
        self.seen: dict[type[LogitsProcessor], Sequence[Any]] = {}

    def set_classes(self, classes: Sequence[type[LogitsProcessor]]) -> None:
        """The batch's rows changed: drop the instances of classes that act on no row any more."""
        self.classes = list(classes)
        for cls in list(self.instances):
            if cls not in self.classes:
                del self.instances[cls], self.seen[cls]

    def reset(self) -> None:
        """Forget every instance: the next run builds each from the rows' host state then. A
        speculative verify grows the outputs by the drafts and takes them back, which a
        BatchUpdate cannot express, and an incremental state (an n-gram index) would keep them."""
        self.instances.clear()
        self.seen.clear()

    def run(self, logits: torch.Tensor, rows: Sequence[Any], all_greedy: bool, truth: Optional[Sequence[Any]] = None) -> dict[int, str]:
        """Update every processor to `rows` and apply it to `logits` ([B, V] float32, in place);
        when every row is greedy, argmax-invariant processors are updated but not applied. `truth` (the
        scheduler's requests, with SGLANG_CHECK_LOGITS_PROCESSORS) is checked against each
        processor's row_views. Returns {row: message} for the rows of processors that failed."""
        errors: dict[int, str] = {}
        for cls in self.classes:
            try:
                processor = self._updated(cls, rows)
                if truth is not None:
                    check_row_views(processor, truth)
                if all_greedy and processor.is_argmax_invariant():
                    continue
                result = processor.apply(logits)
                if result is not logits:
                    if not isinstance(result, torch.Tensor) or result.shape != logits.shape:
                        raise TypeError(f"apply must return a tensor of shape {tuple(logits.shape)}")
                    logits.copy_(result)
            except Exception as err:  # noqa: BLE001 - a processor's error fails its own rows only
                self.instances.pop(cls, None)
                self.seen.pop(cls, None)
                message = f"logits processor {qualified_name(cls)} failed: {type(err).__name__}: {err}"
                logger.error("%s", message)
                for i, row in enumerate(rows):
                    if cls.acts_on(row.params):
                        errors.setdefault(i, message)
        return errors

    def _updated(self, cls: type[LogitsProcessor], rows: Sequence[Any]) -> LogitsProcessor:
        processor = self.instances.get(cls)
        if processor is None:
            processor = self.factory.instantiate(cls)
            update = BatchUpdateBuilder.full(rows)
            self.instances[cls] = processor
        else:
            update = BatchUpdateBuilder.build(self.seen[cls], rows)
        self.seen[cls] = rows
        processor.update_state(update)
        return processor


def check_row_views(processor: LogitsProcessor, truth: Sequence[Any]) -> None:
    """Raise naming the first row where the processor's view differs from the scheduler's
    (prompt ids, output length); `truth` holds Reqs (rid, origin_input_ids, output_ids)."""
    views = processor.row_views()
    if views is None:
        return
    for row in sorted(views):
        prompt_ids, output_ids = views[row]
        if not 0 <= row < len(truth):
            raise AssertionError(f"row check: holds state for row {row}, but the batch has {len(truth)} rows")
        req = truth[row]
        if list(prompt_ids) != req.origin_input_ids:
            owner = next((r.rid for r in truth if r.origin_input_ids == list(prompt_ids)), "no request of this batch")
            raise AssertionError(
                f"row check: row {row} is request {req.rid}, but the processor holds the prompt of {owner}"
            )
        if len(output_ids) != len(req.output_ids):
            raise AssertionError(
                f"row check: row {row} (request {req.rid}) has {len(req.output_ids)} output tokens, "
                f"the processor sees {len(output_ids)}"
            )


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
