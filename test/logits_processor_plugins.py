"""Batch-level logits processors that the end-to-end tests load with --logits-processors
(the server finds this module through PYTHONPATH). Each acts only on the requests whose
custom_params name it, except RecordingProcessor, which records every row of every step."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor import BatchUpdate, LogitsProcessor, apply_batch_update

RECORD_ENV = "LP_RECORD_PATH"


class _Rows(LogitsProcessor):
    """Keeps (prompt_ids, output_ids) per row for the rows acts_on selects."""

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[Sequence[int], Sequence[int], dict]] = {}

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        apply_batch_update(self.rows, batch_update, lambda p, prompt, out: (prompt, out, p.custom_params or {}))

    def is_argmax_invariant(self) -> bool:
        return False

    def row_views(self):
        return {row: (prompt, out) for row, (prompt, out, _) in self.rows.items()}


class RecordingProcessor(_Rows):
    """Appends {"batch_size", "rows": [[row, prompt_ids, output_len], ...]} per step to $LP_RECORD_PATH."""

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(server_args, device, is_pin_memory)
        self.path = os.environ[RECORD_ENV]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows = [[row, list(prompt), len(out)] for row, (prompt, out, _) in sorted(self.rows.items())]
        with open(self.path, "a") as f:
            f.write(json.dumps({"batch_size": logits.shape[0], "rows": rows}) + "\n")
        return logits


class ForceTokenProcessor(_Rows):
    """custom_params {"force_token": id}: that token at every step."""

    @classmethod
    def validate_params(cls, params: Any) -> None:
        token = (params.custom_params or {}).get("force_token")
        if token is not None and not (isinstance(token, int) and not isinstance(token, bool) and token >= 0):
            raise ValueError(f"custom_params.force_token must be a non-negative integer token id, got {token!r}")

    @classmethod
    def acts_on(cls, params: Any) -> bool:
        return "force_token" in (params.custom_params or {})

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        apply_batch_update(
            self.rows, batch_update,
            lambda p, prompt, out: (prompt, out, p.custom_params) if self.acts_on(p) else None,
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (_, _, custom) in self.rows.items():
            logits[row].fill_(float("-inf"))
            logits[row, custom["force_token"]] = 0.0
        return logits


class RaisingProcessor(_Rows):
    """custom_params {"raise": true}: apply raises."""

    @classmethod
    def acts_on(cls, params: Any) -> bool:
        return bool((params.custom_params or {}).get("raise"))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this processor always fails")


class FirstPromptProcessor(_Rows):
    """Seed 004's bug: every row gets the first request's prompt. custom_params {"first_prompt_bug": true}."""

    @classmethod
    def acts_on(cls, params: Any) -> bool:
        return bool((params.custom_params or {}).get("first_prompt_bug"))

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        super().update_state(batch_update)
        if batch_update is not None and batch_update.added and not hasattr(self, "first_prompt"):
            self.first_prompt = batch_update.added[0][2]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def row_views(self):
        return {row: (self.first_prompt, out) for row, (_, out, custom) in self.rows.items() if custom.get("first_prompt_bug")}


class NoOpProcessor(LogitsProcessor):
    """The trivial argmax-invariant plugin: touches no row (benchmark/bench_sampler.py)."""

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def is_argmax_invariant(self) -> bool:
        return True
