"""POST /v1/chat/completions: messages rendered by the model's chat template, then generated."""

from __future__ import annotations

import json
import logging
from functools import cached_property
from typing import Any, Optional

from jinja2 import TemplateError

from sglang.srt.entrypoints.openai.chat_output import ChatChoiceTracker, ChatOutputParser
from sglang.srt.entrypoints.openai.protocol import (
    CHAT_UNSUPPORTED,
    GRAMMAR_PARAMS,
    OPENAI_SAMPLING_DEFAULTS,
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatLogprobs,
    ChatTokenLogprob,
    DeltaMessage,
    Grammar,
    RequestError,
    TopLogprob,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase
from sglang.srt.entrypoints.openai.serving_choices import ChoiceTracker, LogprobEntry, Piece, TopEntries
from sglang.srt.entrypoints.openai.serving_params import common_sampling_params, grammar_params
from sglang.srt.entrypoints.openai.tool_protocol import FunctionDefinition, forced_tools, tool_call_schema
from sglang.srt.function_call import ToolCallParser, get_detector, json_array_detector
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS, ReasoningParser, prompt_opens_reasoning

logger = logging.getLogger(__name__)


def load_generation_defaults(model_path: str) -> dict[str, Any]:
    """The model's generation_config values for the parameters chat may default from it."""
    try:
        from sglang.srt.configs.model_config import ModelConfig

        defaults = ModelConfig.from_path(model_path).generation_defaults
    except Exception as exc:  # no readable config only costs the defaults, never the request
        logger.warning("Using OpenAI sampling defaults: no generation_config for %s (%s)", model_path, exc)
        return {}
    return {k: v for k, v in (defaults or {}).items() if k in OPENAI_SAMPLING_DEFAULTS and v is not None}


def tokenizer_adds_bos(tokenizer: Any) -> bool:
    """Whether encoding plain text (as the tokenizer manager does) prepends the BOS token."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    ids = tokenizer.encode("a")
    return bool(ids) and ids[0] == bos_id


def strip_duplicate_bos(prompt: str, tokenizer: Any, adds_bos: bool) -> str:
    """Drop a template-written BOS when tokenizing the text will add one anyway.

    Tokenizers that do not add BOS (SmolLM2's GGUF, whose BOS is <|im_start|>) keep the
    template's text untouched.
    """
    bos = getattr(tokenizer, "bos_token", None)
    if adds_bos and bos and prompt.startswith(bos):
        return prompt[len(bos) :]
    return prompt


class OpenAIServingChat(OpenAIServingBase[ChatCompletionRequest]):
    request_model = ChatCompletionRequest
    unsupported = CHAT_UNSUPPORTED
    id_prefix = "chatcmpl-"

    @cached_property
    def generation_defaults(self) -> dict[str, Any]:
        # Read on first use: the model config is only needed with --sampling-defaults model.
        if self.server_args.sampling_defaults != "model":
            return {}
        return load_generation_defaults(self.server_args.model_path)

    @cached_property
    def _adds_bos(self) -> bool:
        return tokenizer_adds_bos(self.tokenizer_manager.tokenizer)

    def convert(self, req: ChatCompletionRequest) -> list[GenerateReqInput]:
        text, prefix = self.render_parts(req)
        req._prompt_opens_reasoning = prompt_opens_reasoning(text + prefix)
        params = common_sampling_params(req, self.generation_defaults) | self.format_params(req) | self.tool_params(req)
        # None = up to the rest of the context, which the engine resolves.
        params["max_new_tokens"] = self._max_new_tokens(req)
        params["n"] = req.n
        if req.seed is not None:
            params["sampling_seed"] = req.seed
        return [
            GenerateReqInput(
                text=None if prefix else text,
                input_ids=self.prompt_with_prefix(text, prefix) if prefix else None,
                sampling_params=params,
                return_logprob=req.logprobs,
                top_logprobs_num=req.top_logprobs,
                return_text_in_logprobs=True,
                custom_logit_processor=req.custom_logit_processor,
                stream=req.stream,
                extra_key=req.cache_namespace,
                priority=req.priority,
                return_prompt_token_ids=req.return_prompt_token_ids,
                require_reasoning=self._reasoning_enabled(req),
            )
        ]

    def _reasoning_enabled(self, req: ChatCompletionRequest) -> bool:
        """Whether the output starts with a reasoning section, by SGLang's rule: always with
        deepseek-r1; with qwen3 unless chat_template_kwargs sets enable_thinking false (and the
        prompt does not itself open the section). Its tokens are then counted and a grammar
        applies after it."""
        parser = self.server_args.reasoning_parser
        if parser is None:
            return False
        thinking = req.chat_template_kwargs.get("enable_thinking") is not False
        return REASONING_PARSERS[parser] or req._prompt_opens_reasoning or thinking

    def _max_new_tokens(self, req: ChatCompletionRequest) -> Optional[int]:
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        context = getattr(getattr(self.tokenizer_manager, "ready", None), "context_len", None)
        if limit is not None and context is not None and limit > context:
            name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
            raise RequestError(
                f"max_completion_tokens is too large: {limit}. This model supports at most {context} completion tokens "
                f"(its context length).",
                param=name,
            )
        return limit

    def tool_params(self, req: ChatCompletionRequest) -> dict[str, str]:
        """The grammar of the tools: a required or named tool_choice's json_schema (the call), or
        the structural tag of strict tools under auto, or {} for none. Validated here, so that a
        schema the grammar backend refuses is a 400 naming tools."""
        functions = forced_tools(req.tools or [], req.effective_tool_choice)
        if not functions:
            return self._strict_tool_params(req)
        taken = [name for name in GRAMMAR_PARAMS if getattr(req, name, None) is not None]
        if req.format_grammar is not None or taken:
            raise RequestError(
                "tool_choice 'required' or a named function constrains the output to the call and cannot be "
                f"combined with {', '.join(taken) or 'response_format'}",
                param="tool_choice",
            )
        try:
            schema = tool_call_schema(functions, req.parallel_tool_calls)
        except ValueError as exc:
            raise RequestError(str(exc), param="tools") from None
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        return grammar_params(Grammar("json_schema", json.dumps(schema)), self.server_args, tokenizer, "tools")

    def _strict_tools(self, req: ChatCompletionRequest) -> list[FunctionDefinition]:
        """Under tool_choice auto with --tool-call-parser, the tools marked strict; none when the
        request carries its own grammar (which wins; the calls are still parsed)."""
        parser = self.server_args.tool_call_parser
        if req.effective_tool_choice != "auto" or parser is None or parser == "pythonic":
            return []
        if req.format_grammar is not None or any(getattr(req, name, None) is not None for name in GRAMMAR_PARAMS):
            return []
        return [t.function for t in req.tools or [] if t.function.strict]

    def _strict_tool_params(self, req: ChatCompletionRequest) -> dict[str, str]:
        """A structural tag in the parser's format for the strict tools: free text until the model
        opens a call, then that call's arguments follow its schema."""
        strict = self._strict_tools(req)
        if not strict:
            return {}
        detector = get_detector(self.server_args.tool_call_parser)
        infos = [(detector.structure_info(f.name), f.parameter_schema()) for f in strict]
        tag = {
            "type": "structural_tag",
            "structures": [{"begin": info.begin, "schema": schema, "end": info.end} for info, schema in infos],
            "triggers": sorted({info.trigger for info, _ in infos}),
        }
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        return grammar_params(Grammar("structural_tag", json.dumps(tag)), self.server_args, tokenizer, "tools")

    def grammar_checked(self, req: ChatCompletionRequest) -> bool:
        # format_params and tool_params validated these grammars; a regex / ebnf is the engine's to check.
        forced = forced_tools(req.tools or [], req.effective_tool_choice)
        return req.format_grammar is not None or bool(forced) or bool(self._strict_tools(req))

    def render(self, req: ChatCompletionRequest) -> str:
        """The prompt text: the chat template's text, then any assistant prefix."""
        text, prefix = self.render_parts(req)
        return text + prefix

    def render_parts(self, req: ChatCompletionRequest) -> tuple[str, str]:
        """The chat template applied to the messages, and the assistant prefix that follows it.

        With continue_final_message the final (assistant) message is left open, as SGLang does
        it: the template renders the messages before it with the generation prompt, and the
        message's text is the prefix, so no end-of-turn marker closes it. Without it (and without
        an explicit add_generation_prompt) a final assistant message is rendered as the user's,
        as SGLang renders it, so that the prompt always ends with a turn to answer.
        """
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        if tokenizer is None:
            raise RequestError(
                "chat completions need a tokenizer, and this server runs without one", param="messages"
            )
        messages = [m.to_template_dict() for m in req.messages]
        opening = req.add_generation_prompt is not False
        prefix = ""
        if req.continue_final_message:  # validated: the last message is the assistant's
            prefix, opening = messages.pop()["content"], True
        elif req.add_generation_prompt is None and messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
            messages[-1] = {"role": "user", "content": messages[-1]["content"]}
        prompt = self._apply_template(tokenizer, messages, opening, req.chat_template_kwargs, req.template_tools)
        return strip_duplicate_bos(prompt, tokenizer, self._adds_bos), prefix

    def prompt_with_prefix(self, text: str, prefix: str) -> list[int]:
        """The template's tokens, then the prefix's own (without a BOS): SGLang encodes the two
        apart, so the prefix's first token never merges with the template's last text."""
        tokenizer = self.tokenizer_manager.tokenizer
        ids = tokenizer.encode(prefix)
        if ids and ids[0] == getattr(tokenizer, "bos_token_id", None):
            ids = ids[1:]
        return tokenizer.encode(text) + ids

    @staticmethod
    def _apply_template(
        tokenizer: Any,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        variables: dict[str, Any],
        tools: Optional[list[dict[str, Any]]],
    ) -> str:
        kwargs = {**variables, "add_generation_prompt": add_generation_prompt, "tokenize": False}
        if tools is not None:
            kwargs["tools"] = tools
        try:
            return tokenizer.apply_chat_template(messages, **kwargs)
        except (TemplateError, ValueError, TypeError) as exc:
            raise RequestError(
                f"the chat template cannot render these messages: {exc}", param="messages"
            ) from None

    def trackers(self, req: ChatCompletionRequest, count: int) -> list[ChoiceTracker]:
        fmt = self._logprobs if req.logprobs else None
        return [ChatChoiceTracker(i, fmt, self.output_parser(req)) for i in range(count)]

    def output_parser(self, req: ChatCompletionRequest, reasoning_split: bool = True) -> ChatOutputParser:
        """A fresh parser of one choice's output: the reasoning section split out (with
        --reasoning-parser, unless the request or the caller says not to), the tool calls parsed."""
        reasoning = None
        if self.server_args.reasoning_parser is not None and req.separate_reasoning and reasoning_split:
            reasoning = ReasoningParser(
                self.server_args.reasoning_parser, req._prompt_opens_reasoning, req.stream_reasoning
            )
        tools = None
        choice = req.effective_tool_choice
        if forced_tools(req.tools or [], choice):
            tools = ToolCallParser(json_array_detector())
        elif choice == "auto" and req.tools and self.server_args.tool_call_parser is not None:
            tools = ToolCallParser(get_detector(self.server_args.tool_call_parser))
        return ChatOutputParser(reasoning, tools)

    def stream_preamble(
        self, req: ChatCompletionRequest, request_id: str, count: int
    ) -> list[ChatCompletionStreamResponse]:
        return [
            self._chunk(
                req,
                request_id,
                [ChatCompletionStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))],
            )
            for i in range(count)
        ]

    def full_response(
        self, req: ChatCompletionRequest, request_id: str, pieces: list[Piece], usage: UsageInfo
    ) -> ChatCompletionResponse:
        choices = [
            ChatCompletionChoice(
                index=p.index,
                message=AssistantMessage(
                    # No text beside tool calls is null content, as OpenAI sends it.
                    content=p.text if p.text or not p.tool_calls else None,
                    reasoning_content=p.reasoning or None,
                    tool_calls=p.tool_calls or None,
                ),
                logprobs=p.logprobs,
                finish_reason=p.finish_reason,
                matched_stop=p.matched_stop,
                prompt_token_ids=p.prompt_token_ids,
            )
            for p in pieces
        ]
        return ChatCompletionResponse(id=request_id, model=self.model_name(req), choices=choices, usage=usage)

    def stream_chunk(
        self,
        req: ChatCompletionRequest,
        request_id: str,
        pieces: list[Piece],
        usage: Optional[UsageInfo] = None,
    ) -> ChatCompletionStreamResponse:
        choices = [
            ChatCompletionStreamChoice(
                index=p.index,
                delta=DeltaMessage(
                    content=p.text or None, reasoning_content=p.reasoning or None, tool_calls=p.tool_calls or None
                ),
                logprobs=p.logprobs,
                finish_reason=p.finish_reason,
                matched_stop=p.matched_stop,
            )
            for p in pieces
        ]
        return self._chunk(req, request_id, choices, usage)

    def _chunk(
        self,
        req: ChatCompletionRequest,
        request_id: str,
        choices: list[ChatCompletionStreamChoice],
        usage: Optional[UsageInfo] = None,
    ) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(
            id=request_id, model=self.model_name(req), choices=choices, usage=usage
        )

    def _logprobs(self, entries: list[LogprobEntry], tops: list[TopEntries], offset: int) -> ChatLogprobs:
        # Chat logprobs carry no text offsets.
        content = [
            ChatTokenLogprob(
                **self._token(entry), top_logprobs=[TopLogprob(**self._token(t)) for t in top or ()]
            )
            for entry, top in zip(entries, tops)
        ]
        return ChatLogprobs(content=content)

    def _token(self, entry: LogprobEntry) -> dict[str, Any]:
        text = self.token_text(entry)
        return {"token": text, "bytes": list(text.encode("utf-8")), "logprob": entry[0]}
