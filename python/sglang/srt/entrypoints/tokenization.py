"""/tokenize and /detokenize (also under /v1/), with SGLang's request and response shapes.

POST /tokenize   {"prompt": str | [str], "add_special_tokens": true, "model": ...}
              -> {"tokens": [int] | [[int]], "count": int | [int], "max_model_len": int}
POST /tokenize   {"messages": [...], chat template fields, "add_special_tokens": bool, "model": ...}
              -> {"tokens": [int], "count": int, "max_model_len": int}: the ids a chat completion
                 of these messages sends (add_special_tokens given: the rendered text encoded so)
POST /detokenize {"tokens": [int] | [[int]], "skip_special_tokens": true, "model": ...}
              -> {"text": str | [str]}
Any other field, or a value of the wrong type, is a ValueError naming it (the route answers 400).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

TOKENIZE_FIELDS = {"prompt", "add_special_tokens", "model"}
# With messages: the chat completion fields that shape the rendered prompt.
CHAT_TOKENIZE_FIELDS = {
    "messages", "model", "add_special_tokens", "add_generation_prompt", "continue_final_message",
    "chat_template_kwargs", "tools", "tool_choice", "reasoning_effort",
}
DETOKENIZE_FIELDS = {"tokens", "skip_special_tokens", "model"}


def tokenize(
    body: Any, tokenizer: Any, max_model_len: int, render_chat: Optional[Callable[[dict], str]] = None
) -> dict:
    """render_chat: chat messages (a chat completion body) -> the prompt text a chat completion sends."""
    if isinstance(body, dict) and "messages" in body:
        return _tokenize_chat(body, tokenizer, max_model_len, render_chat)
    _check_fields(body, TOKENIZE_FIELDS, "prompt")
    prompt = body["prompt"]
    add_special = _flag(body, "add_special_tokens")
    if isinstance(prompt, str):
        tokens = tokenizer.encode(prompt, add_special_tokens=add_special)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len}
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        tokens = [tokenizer.encode(p, add_special_tokens=add_special) for p in prompt]
        return {"tokens": tokens, "count": [len(t) for t in tokens], "max_model_len": max_model_len}
    raise ValueError("prompt must be a string or a list of strings.")


def _tokenize_chat(body: dict, tokenizer: Any, max_model_len: int, render_chat: Optional[Callable[[dict], str]]) -> dict:
    if "prompt" in body:
        raise ValueError("Exactly one of 'prompt' or 'messages' must be provided.")
    _check_fields(body, CHAT_TOKENIZE_FIELDS, "messages")
    if render_chat is None:
        raise ValueError("messages need the chat template of the OpenAI routes, which this server does not serve.")
    prompt = render_chat({k: v for k, v in body.items() if k != "add_special_tokens"})
    if "add_special_tokens" in body:
        tokens = tokenizer.encode(prompt, add_special_tokens=_flag(body, "add_special_tokens"))
    else:
        tokens = tokenizer.encode(prompt)  # as the tokenizer manager encodes a chat completion's prompt
    return {"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len}


def detokenize(body: Any, tokenizer: Any, vocab_size: int) -> dict:
    _check_fields(body, DETOKENIZE_FIELDS, "tokens")
    tokens = body["tokens"]
    skip_special = _flag(body, "skip_special_tokens")
    if _is_ids(tokens):
        _check_range(tokens, vocab_size)
        return {"text": tokenizer.decode(tokens, skip_special_tokens=skip_special)}
    if isinstance(tokens, list) and tokens and all(_is_ids(row) for row in tokens):
        for row in tokens:
            _check_range(row, vocab_size)
        return {"text": [tokenizer.decode(row, skip_special_tokens=skip_special) for row in tokens]}
    raise ValueError("tokens must be a list of token ids or a non-empty list of such lists.")


def _check_fields(body: Any, allowed: set[str], required: str) -> None:
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ValueError(f"Unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}.")
    if required not in body:
        raise ValueError(f"{required} is required.")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, True)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}.")
    return value


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_range(ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"tokens must be in [0, {vocab_size}), got {bad[0]}.")
