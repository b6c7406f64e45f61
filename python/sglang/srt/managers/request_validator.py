"""Validation of a request in the tokenizer manager: tokenization, sampling params, context
length, grammar, custom processor and logprob arguments; each failure is a ValueError naming
the offending parameter (HTTP 400), raised before anything is sent to the scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from sglang.srt.beam_search.params import verify_beam_request
from sglang.srt.managers.io_struct import GenerateReqInput, SchedulerReady
from sglang.srt.sampling.guidance_params import check_guide_model
from sglang.srt.managers.request_extras import check_extras
from sglang.srt.sampling.logits_processor.loader import LoadedLogitsProcessors
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.watermarking.config import check_request as check_watermark_request, resolve_request as resolve_watermark_request
from sglang.srt.server_args import ServerArgs


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class RequestValidator:
    def __init__(self, server_args: ServerArgs, ready: SchedulerReady, tokenizer: Any) -> None:
        self.server_args = server_args
        self.ready = ready
        self.tokenizer = tokenizer  # None with --skip-tokenizer-init
        self.preferred_sampling_params = server_args.preferred_sampling_params_dict()
        # The batch-level processor classes, for their validate_params (the scheduler runs them).
        self.logits_processors = LoadedLogitsProcessors.from_server_args(server_args, "cpu")
        self.watermark_settings = server_args.watermark_settings()

    def validate(self, obj: GenerateReqInput, grammar_checked: bool) -> tuple[list[int], SamplingParams]:
        """The request's prompt ids and its normalised, verified sampling params."""
        input_ids = self.tokenize(obj)
        params = self.sampling_params(obj.sampling_params)
        params.watermark = self.resolve_watermark(obj.watermark, params.watermark)
        self.check_context(len(input_ids), params.max_new_tokens)
        self.check_custom_logit_processor(obj.custom_logit_processor)
        if not grammar_checked:
            self.check_grammar(params)
        self.check_flags(obj)
        self.check_logprob_args(obj, len(input_ids))
        ready = self.ready
        verify_beam_request(params, obj.return_logprob, len(input_ids), ready.max_running_requests, ready.max_total_num_tokens)
        check_extras(obj, params, self.server_args, self.tokenizer is not None)
        self.check_speculation(obj, params)
        return input_ids, params

    def check_speculation(self, obj: GenerateReqInput, params: SamplingParams) -> None:
        """Speculative verify steps sample plain decode rows: the features that add rows (beams, a
        guide context) or report on the sampling support (sampling masks, entropy) are refused
        under speculation."""
        algorithm = getattr(self.server_args, "speculative_algorithm", None)
        if not algorithm:
            return
        asked = {
            "beam_width": params.beam_width is not None and params.beam_width > 1,
            "guidance": params.guidance is not None,
            "return_sampling_mask": bool(obj.return_sampling_mask),
            "return_entropy": bool(obj.return_entropy),
        }
        for name, on in asked.items():
            if on:
                raise ValueError(f"{name} is not supported with speculative decoding (--speculative-algorithm {algorithm}).")

    def tokenize(self, obj: GenerateReqInput) -> list[int]:
        if (obj.text is None) == (obj.input_ids is None):
            raise ValueError("Exactly one of text or input_ids must be given.")
        if obj.text is not None:
            if not isinstance(obj.text, str):
                raise ValueError(f"text must be a string, got {type(obj.text).__name__}.")
            if not obj.text:  # checked before encoding, which may add a BOS token
                raise ValueError("The input is empty: text must not be an empty string.")
            if self.tokenizer is None:
                raise ValueError(
                    "This server runs with --skip-tokenizer-init and cannot tokenize text: send input_ids instead."
                )
            ids = self.tokenizer.encode(obj.text)
        else:
            ids = obj.input_ids
            if not isinstance(ids, list) or not all(is_int(t) for t in ids):
                raise ValueError("input_ids must be a flat list of integers.")
            self.check_vocab("input_ids", ids)
        if not ids:
            raise ValueError("The input is empty: text or input_ids must contain at least one token.")
        return list(ids)

    def check_vocab(self, name: str, ids: Sequence[int]) -> None:
        vocab = self.ready.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise ValueError(
                    f"{name} contains out-of-vocabulary token id {t}; valid range is [0, {vocab}). "
                    f"Token ID {t} is out of vocabulary."
                )

    def sampling_params(self, raw: Any) -> SamplingParams:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ValueError(f"sampling_params must be an object, got {type(raw).__name__}.")
        params = SamplingParams.from_dict({**self.preferred_sampling_params, **raw})
        params.normalize(self.tokenizer)
        params.verify(self.ready.vocab_size)
        if params.thinking_token_budget is not None and self.tokenizer is None:
            raise ValueError("thinking_token_budget needs the tokenizer to find the think markers, which --skip-tokenizer-init leaves unloaded.")
        self.logits_processors.validate(params)
        check_guide_model(params.guidance, guide_model_loaded=self.server_args.guide_model_path is not None)
        return params

    def resolve_watermark(self, top_level: Any, in_params: Optional[dict]) -> Optional[dict]:
        """The request's watermark ({"key", "context_window"} or None) under the server's policy;
        /generate takes the object at the top level or in sampling_params, not both."""
        if top_level is not None:
            if in_params is not None:
                raise ValueError("watermark: set it at the top level or in sampling_params, not both.")
            check_watermark_request(top_level)
        return resolve_watermark_request(top_level if top_level is not None else in_params, self.watermark_settings)

    def check_context(self, input_len: int, max_new_tokens: Optional[int]) -> None:
        context = self.ready.context_len
        if input_len >= context:
            raise ValueError(
                f"The input ({input_len} tokens) is longer than the model's context length ({context} tokens)."
            )
        if max_new_tokens is not None and input_len + max_new_tokens > context:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {context} tokens: "
                f"{input_len} input tokens + max_new_tokens={max_new_tokens}. Reduce the input or max_new_tokens."
            )

    def check_grammar(self, params: SamplingParams) -> None:
        """A grammar this server cannot enforce, or that does not parse, is a 400 before anything is queued."""
        from sglang.srt.constrained.base_grammar_backend import grammar_key
        from sglang.srt.constrained.grammar_backends import validate_grammar

        key = grammar_key(params)
        if key is None:
            return
        if self.tokenizer is None:
            raise ValueError(f"{key.kind} needs the tokenizer, which --skip-tokenizer-init leaves unloaded.")
        if self.server_args.grammar_backend == "none":
            raise ValueError(f"{key.kind} needs a grammar backend; this server runs with --grammar-backend none.")
        validate_grammar(self.server_args.grammar_backend, key)

    def check_custom_logit_processor(self, processor: Optional[str]) -> None:
        if processor is None:
            return
        # torch-heavy module, and a request with a processor is the rare case.
        from sglang.srt.sampling import custom_logit_processor as clp

        if not self.server_args.enable_custom_logit_processor:
            raise ValueError(clp.DISABLED_MESSAGE)  # before any deserialisation
        if not isinstance(processor, str):
            raise ValueError(f"custom_logit_processor must be a string, got {type(processor).__name__}.")
        try:
            clp.load_custom_logit_processor(processor, allowlist=self.server_args.allowlist())
        except clp.CustomLogitProcessorError:
            raise
        except Exception as err:  # a processor's own constructor may raise anything
            raise ValueError(f"custom_logit_processor: cannot instantiate ({type(err).__name__}: {err})") from None

    @staticmethod
    def check_flags(obj: GenerateReqInput) -> None:
        for name in ("return_logprob", "return_text_in_logprobs", "stream"):
            if not isinstance(getattr(obj, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(obj, name)!r}.")
        if obj.extra_key is not None and not isinstance(obj.extra_key, str):
            raise ValueError(f"extra_key must be a string, got {obj.extra_key!r}.")

    def check_logprob_args(self, obj: GenerateReqInput, input_len: int) -> None:
        top, top_max = obj.top_logprobs_num, self.server_args.max_top_logprobs_num
        if not (is_int(top) and 0 <= top <= top_max):
            raise ValueError(
                f"top_logprobs_num must be an integer in [0, {top_max}] (--max-top-logprobs-num), got {top!r}."
            )
        start = obj.logprob_start_len
        if not (is_int(start) and -1 <= start <= input_len):
            raise ValueError(
                f"logprob_start_len must be -1 or an integer in [0, {input_len}] (the prompt length), got {start!r}."
            )
        ids = obj.token_ids_logprob
        if ids is not None:
            if not isinstance(ids, list) or not all(is_int(t) for t in ids):
                raise ValueError("token_ids_logprob must be a flat list of integers.")
            self.check_vocab("token_ids_logprob", ids)
