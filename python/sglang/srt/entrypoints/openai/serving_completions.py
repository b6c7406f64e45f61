"""POST /v1/completions: prompt(s) in, text completions out (OpenAI legacy completions)."""

from __future__ import annotations

from functools import partial
from typing import Any, Optional, Union

from sglang.srt.entrypoints.openai.protocol import (
    COMPLETION_UNSUPPORTED,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase
from sglang.srt.entrypoints.openai.serving_choices import ChoiceTracker, LogprobEntry, Piece, TopEntries
from sglang.srt.entrypoints.openai.serving_params import common_sampling_params
from sglang.srt.managers.io_struct import GenerateReqInput


class OpenAIServingCompletion(OpenAIServingBase[CompletionRequest]):
    request_model = CompletionRequest
    unsupported = COMPLETION_UNSUPPORTED
    id_prefix = "cmpl-"

    def convert(self, req: CompletionRequest) -> list[GenerateReqInput]:
        # Completions never take generation_config defaults (SGLang: chat only).
        params = common_sampling_params(req, defaults={}) | self.format_params(req)
        params["max_new_tokens"] = req.max_tokens
        if req.json_schema is not None:
            params["json_schema"] = req.json_schema
        request_args = {
            "return_logprob": req.logprobs is not None,
            "top_logprobs_num": req.logprobs or 0,
            "return_text_in_logprobs": True,
            # echo returns the prompt's logprobs too, which start at its first token.
            "logprob_start_len": 0 if req.echo and req.logprobs is not None else -1,
            "custom_logit_processor": req.custom_logit_processor,
            "stream": req.stream,
            "extra_key": req.cache_namespace,
            "priority": req.priority,
        }
        params["n"] = req.n
        if req.seed is not None:
            params["sampling_seed"] = req.seed
        inputs: list[GenerateReqInput] = []
        for prompt in req.prompts():
            key = "text" if isinstance(prompt, str) else "input_ids"
            inputs.append(GenerateReqInput(**{key: prompt}, sampling_params=dict(params), **request_args))
        return inputs

    def trackers(self, req: CompletionRequest, count: int) -> list[ChoiceTracker]:
        fmt = partial(self._logprobs, with_top=bool(req.logprobs)) if req.logprobs is not None else None
        prompts = req.prompts()
        return [
            ChoiceTracker(i, fmt, echo=self._prompt_text(prompts[i // req.n]) if req.echo else None)
            for i in range(count)
        ]

    def full_response(
        self, req: CompletionRequest, request_id: str, pieces: list[Piece], usage: UsageInfo
    ) -> CompletionResponse:
        return CompletionResponse(
            id=request_id, model=self.model_name(req), choices=[_choice(p) for p in pieces], usage=usage
        )

    def stream_chunk(
        self, req: CompletionRequest, request_id: str, pieces: list[Piece], usage: Optional[UsageInfo] = None
    ) -> CompletionStreamResponse:
        return CompletionStreamResponse(
            id=request_id, model=self.model_name(req), choices=[_choice(p) for p in pieces], usage=usage
        )

    def _prompt_text(self, prompt: Union[str, list[int]]) -> str:
        if isinstance(prompt, str):
            return prompt
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        return tokenizer.decode(prompt) if tokenizer is not None else ""

    def _logprobs(
        self, entries: list[LogprobEntry], tops: list[TopEntries], offset: int, with_top: bool
    ) -> CompletionLogprobs:
        tokens = [self.token_text(e) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        top: Optional[list[Optional[dict[str, Any]]]] = None
        if with_top:
            top = [None if t is None else {self.token_text(e): e[0] for e in t} for t in tops]
        return CompletionLogprobs(
            tokens=tokens, token_logprobs=[e[0] for e in entries], top_logprobs=top, text_offset=offsets
        )


def _choice(piece: Piece) -> CompletionChoice:
    return CompletionChoice(
        index=piece.index,
        text=piece.text,
        logprobs=piece.logprobs,
        finish_reason=piece.finish_reason,
        matched_stop=piece.matched_stop,
    )
