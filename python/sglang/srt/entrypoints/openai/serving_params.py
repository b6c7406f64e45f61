"""SGLang sampling_params from the fields /v1/completions and /v1/chat/completions share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from sglang.srt.entrypoints.openai.protocol import (
    OPENAI_SAMPLING_DEFAULTS,
    Grammar,
    RequestError,
    _GenerationRequest,
)

def common_sampling_params(req: _GenerationRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang sampling_params for what both endpoints share; unset values are left out.

    `defaults` are the model's generation_config values, consulted only for parameters the
    user did not set and before OpenAI's own defaults.
    """
    params: dict[str, Any] = {
        "min_new_tokens": req.min_tokens,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "stop_regex": req.stop_regex,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "ignore_eos": req.ignore_eos,
        "no_stop_trim": req.no_stop_trim,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "logit_bias": req.logit_bias,
        "guidance": req.guidance,
        "watermark": req.watermark,
        **processor_params(req),
        "regex": req.regex,
        "ebnf": req.ebnf,
    }
    for name, openai_default in OPENAI_SAMPLING_DEFAULTS.items():
        value = getattr(req, name)
        params[name] = value if value is not None else defaults.get(name, openai_default)
    return {k: v for k, v in params.items() if v is not None}


# Built-in processor parameters a vLLM client may send inside vllm_xargs (MinerU sends
# no_repeat_ngram_size there): taken as the first-class parameter, not left for a plugin.
BUILT_IN_PROCESSOR_PARAMS = ("allowed_token_ids", "bad_words", "no_repeat_ngram_size", "thinking_token_budget")


def processor_params(req: _GenerationRequest) -> dict[str, Any]:
    """custom_params (vllm_xargs merged under it) and the built-in processors' parameters."""
    xargs = dict(req.vllm_xargs or {})
    params = {name: xargs.pop(name, None) for name in BUILT_IN_PROCESSOR_PARAMS}
    for name in BUILT_IN_PROCESSOR_PARAMS:
        if getattr(req, name) is not None:
            params[name] = getattr(req, name)
    custom = {**xargs, **(req.custom_params or {})}
    params["custom_params"] = custom or None
    return params


def grammar_params(grammar: Optional[Grammar], server_args: Any, tokenizer: Any, param: str) -> dict[str, str]:
    """The sampling param a response format sets ({} for none), validated here, where the
    request enters, so that the 400's message and `param` name the client's field (the engine's
    would name json_schema / structural_tag); the engine is told not to validate it again."""
    if grammar is None:
        return {}
    backend = getattr(server_args, "grammar_backend", "xgrammar")
    if tokenizer is None:
        raise RequestError(f"{param} needs the tokenizer, which --skip-tokenizer-init leaves unloaded", param=param)
    if backend == "none":
        raise RequestError(f"{param} needs a grammar backend; this server runs with --grammar-backend none", param=param)
    # Imported here: the grammar libraries are loaded only once a request uses one.
    from sglang.srt.constrained.base_grammar_backend import GrammarKey
    from sglang.srt.constrained.grammar_backends import validate_grammar

    try:
        validate_grammar(backend, GrammarKey(grammar.kind, grammar.text))
    except ValueError as exc:
        raise RequestError(f"{param}: {exc}", param=param) from None
    return {grammar.kind: grammar.text}
