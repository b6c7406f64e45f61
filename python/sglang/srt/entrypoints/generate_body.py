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
# SGLang's other /generate fields (its GenerateReqInput), each with the values that ask for nothing
# beyond what this server does (null always does: it is the same as absent). Clients such as
# sglang-router and bench_serving write some of them into every request; any other value is a
# 400 naming the field.
_OFF = (False,)
SGLANG_FIELD_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "return_hidden_states": _OFF, "return_routed_experts": _OFF, "routed_experts_start_len": (0,),
    "return_indexer_topk": _OFF, "return_flat_raw_top_logprobs": _OFF,
    "return_flat_raw_output_top_logprobs": _OFF, "return_bytes": _OFF,
    "background": _OFF, "use_audio_in_video": _OFF,
    "need_wait_for_mm_inputs": _OFF, "log_metrics": (True,), "no_logs": _OFF, "modalities": ([],),
    **{name: () for name in (
        "session_id", "session_params", "input_embeds", "image_data", "video_data", "audio_data", "mm_hashes",
        "mm_content_hashes", "video_config", "lora_path", "lora_id",
        "positional_embed_overrides", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
        "decode_tp_size", "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank",
        "num_items_assigned", "encoder_urls", "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch",
        "video_max_dynamic_patch", "images_config", "mm_processor_kwargs", "multi_item_delimiter_indices",
        "token_indices_to_pool", "kv_hints",
    )},
}
# Fields that only describe the request (tracing, metrics labels, routing hints): any value.
SGLANG_INFORMATIONAL_FIELDS = frozenset({
    "routing_key", "conversation_id", "custom_labels", "external_trace_header", "received_time", "http_worker_ipc",
})

def split_generate_body(body: Any) -> tuple[list[GenerateReqInput], bool]:
    """A /generate JSON body -> (one GenerateReqInput per input, whether it was a batch)."""
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    body = _without_sglang_defaults(body)
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


def _without_sglang_defaults(body: dict) -> dict:
    """The body without SGLang's fields this server does not implement, each checked to be at a
    value that asks for nothing (in a batch body, a list of such values is too); cache_salt joins
    extra_key (both namespace the prefix cache)."""
    for name, accepted in SGLANG_FIELD_DEFAULTS.items():
        if name in body and not _asks_nothing(body[name], accepted):
            allowed = " or ".join(repr(v) for v in (None, *accepted))
            raise ValueError(f"{name}={body[name]!r} is not supported by this server (only {allowed}).")
    body = {k: v for k, v in body.items() if k not in SGLANG_FIELD_DEFAULTS and k not in SGLANG_INFORMATIONAL_FIELDS}
    salt = body.pop("cache_salt", None)
    if salt is not None:
        body["extra_key"] = _salted(body.get("extra_key"), salt)
    return body


def _asks_nothing(value: Any, accepted: tuple[Any, ...]) -> bool:
    if value is None or any(type(value) is type(a) and value == a for a in accepted):
        return True
    return isinstance(value, list) and [] not in accepted and all(_asks_nothing(v, accepted) for v in value)


def _salted(extra_key: Any, salt: Any) -> Any:
    """SGLang's cache_salt: one more prefix-cache namespace, joined to extra_key (per input in a batch)."""
    if isinstance(salt, list) or isinstance(extra_key, list):
        salts = salt if isinstance(salt, list) else None
        keys = extra_key if isinstance(extra_key, list) else None
        size = len(salts if salts is not None else keys)
        return [_salted(keys[i] if keys else extra_key, salts[i] if salts else salt) for i in range(size)]
    if not isinstance(salt, str):
        raise ValueError(f"cache_salt must be a string or a list of strings, got {salt!r}.")
    return salt if extra_key is None else f"{extra_key}{salt}" if isinstance(extra_key, str) else extra_key

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
