"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from sglang.srt.entrypoints.openai.protocol import ModelCard, ModelList
from sglang.srt.entrypoints.openai.serving_base import json_response
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

__all__ = ["register_openai_routes"]


def register_openai_routes(app: FastAPI, tokenizer_manager: Any, server_args: Any) -> None:
    """Add the OpenAI routes to `app`, serving through `tokenizer_manager.generate_request`."""
    completions = OpenAIServingCompletion(tokenizer_manager, server_args)
    chat = OpenAIServingChat(tokenizer_manager, server_args)
    app.add_api_route("/v1/completions", completions.handle, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat.handle, methods=["POST"])

    async def list_models() -> Response:
        # The scheduler reports the context length once the model is loaded.
        ready = getattr(tokenizer_manager, "ready", None)
        card = ModelCard(
            id=server_args.served_model_name,
            root=server_args.model_path,
            max_model_len=getattr(ready, "context_len", None),
        )
        return json_response(ModelList(data=[card]))

    app.add_api_route("/v1/models", list_models, methods=["GET"])
