"""A /generate JSON body -> one GenerateReqInput per input (a batch body has several)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sglang.srt.managers.io_struct import GenerateReqInput

# Per-input fields of a /generate body (a value, or a list with one per input in a batch).
_ITEM_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(GenerateReqInput) if f.name not in ("text", "input_ids", "stream")
}
_ITEM_DEFAULTS["sampling_params"] = None  # -> {} in the tokenizer manager
_GENERATE_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerateReqInput))
# SGLang's other /generate fields that sglang-router writes into every request it forwards, each
# at a value that asks for nothing beyond what this server does; any other value is a 400.
ROUTER_FIELD_DEFAULTS = {
    "log_metrics": True, "no_logs": False, "background": False,
    "return_hidden_states": False, "return_bytes": False, "return_entropy": False,
}


def split_generate_body(body: Any) -> tuple[list[GenerateReqInput], bool]:
    """A /generate JSON body -> (one GenerateReqInput per input, whether it was a batch)."""
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    body = _without_router_defaults(body)
    # A field we do not know would be silently dropped; null is the same as absent.
    unknown = sorted(k for k, v in body.items() if k not in _GENERATE_FIELDS and v is not None)
    if unknown:
        raise ValueError(
            f"Unknown or unsupported field(s) {', '.join(unknown)} in /generate; supported: {', '.join(sorted(_GENERATE_FIELDS))}."
        )
    inputs, key, batch = _generate_inputs(body)
    size = len(inputs)
    stream = body.get("stream", False)
    fields = {name: _per_item(body, name, size, batch) for name in _ITEM_DEFAULTS}
    items = []
    for i, value in enumerate(inputs):
        item = {name: values[i] for name, values in fields.items()}
        items.append(GenerateReqInput(**{key: value}, stream=stream, **item))
    return items, batch


def _without_router_defaults(body: dict) -> dict:
    for name, default in ROUTER_FIELD_DEFAULTS.items():
        if name in body and body[name] != default:
            raise ValueError(f"{name}={body[name]!r} is not supported by this server (only {default!r}).")
    return {k: v for k, v in body.items() if k not in ROUTER_FIELD_DEFAULTS}


def _generate_inputs(body: dict) -> tuple[list[Any], str, bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise ValueError("Exactly one of text or input_ids must be given.")
    if text is not None:
        return _as_batch(text, "text", isinstance(text, list))
    is_batch = isinstance(input_ids, list) and bool(input_ids) and all(isinstance(x, list) for x in input_ids)
    return _as_batch(input_ids, "input_ids", is_batch)


def _as_batch(value: Any, key: str, is_batch: bool) -> tuple[list[Any], str, bool]:
    if not is_batch:
        return [value], key, False
    if not value:
        raise ValueError(f"{key} must not be an empty list.")
    return list(value), key, True


def _per_item(body: dict, name: str, size: int, batch: bool) -> list[Any]:
    value = body.get(name)
    if value is None:
        return [_ITEM_DEFAULTS[name]] * size
    if batch and _is_per_item_list(name, value):
        if len(value) != size:
            raise ValueError(f"{name} has {len(value)} entries but the batch has {size} inputs.")
        return list(value)
    if batch and name == "rid":
        return [f"{value}_{i}" for i in range(size)]
    return [value] * size


def _is_per_item_list(name: str, value: Any) -> bool:
    if not isinstance(value, list):
        return False
    if name == "token_ids_logprob":  # a flat list is shared by every input
        return bool(value) and all(v is None or isinstance(v, list) for v in value)
    return True
