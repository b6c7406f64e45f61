"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models, /v1/models/{model},
/v1/responses (create, retrieve, delete, cancel) and SGLang's /v1/score."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    ResponsesRequest,
    ScoringRequest,
)
from sglang.srt.entrypoints.openapi_bodies import document_request_bodies
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_responses import OpenAIServingResponses
from sglang.srt.entrypoints.openai.serving_score import OpenAIServingScore
from sglang.srt.entrypoints.openai.serving_wire import error_response, json_response

__all__ = ["register_openai_routes"]


def register_openai_routes(app: FastAPI, tokenizer_manager: Any, server_args: Any) -> None:
    """Add the OpenAI routes to `app`, serving through `tokenizer_manager.generate_request`."""
    completions = OpenAIServingCompletion(tokenizer_manager, server_args)
    chat = OpenAIServingChat(tokenizer_manager, server_args)
    # /v1/tokenize renders chat messages into the prompt a chat completion would send.
    app.state.render_chat = lambda body: chat.render(chat.parse(orjson.dumps(body)))
    app.add_api_route("/v1/completions", completions.handle, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat.handle, methods=["POST"])
    score = OpenAIServingScore(tokenizer_manager, server_args)
    app.add_api_route("/v1/score", score.handle, methods=["POST"])
    _register_responses_routes(app, OpenAIServingResponses(tokenizer_manager, server_args, chat))
    document_request_bodies(app, {
        "/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest,
        "/v1/score": ScoringRequest, "/v1/responses": ResponsesRequest,
    })

    def card() -> ModelCard:
        # The scheduler reports the context length once the model is loaded.
        ready = getattr(tokenizer_manager, "ready", None)
        return ModelCard(
            id=server_args.served_model_name, root=server_args.model_path, max_model_len=getattr(ready, "context_len", None)
        )

    async def list_models() -> Response:
        return json_response(ModelList(data=[card()]))

    async def retrieve_model(model: str) -> Response:
        if model != server_args.served_model_name:
            return error_response(f"The model '{model}' does not exist; this server serves '{server_args.served_model_name}'.",
                                  "NotFoundError", 404, "model")
        return json_response(card())

    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", retrieve_model, methods=["GET"])


def _register_responses_routes(app: FastAPI, responses: OpenAIServingResponses) -> None:
    app.add_api_route("/v1/responses", responses.create, methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"])
    app.add_api_route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"])
