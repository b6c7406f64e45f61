"""SGLang's /v1/score: the request and the response."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sglang.srt.entrypoints.openai.protocol.common import RequestError, UsageInfo
from sglang.srt.entrypoints.openai.protocol_base import _Strict

class ScoringRequest(_Strict):
    """SGLang's scoring request: query and items both text, or both token ids."""

    model_config = ConfigDict(extra="forbid")  # not an OpenAI route: a misspelt field is named

    query: Union[str, list[int]]
    items: Union[str, list[str], list[list[int]]]
    label_token_ids: list[int] = Field(min_length=1)
    apply_softmax: bool = False
    item_first: bool = False
    model: Optional[str] = None

    @model_validator(mode="after")
    def _same_kind(self) -> "ScoringRequest":
        if not self.item_list():
            raise RequestError("items must not be empty", param="items")
        text_query = isinstance(self.query, str)
        if any(isinstance(item, str) != text_query for item in self.item_list()):
            kind = "strings" if text_query else "lists of token ids"
            raise RequestError(f"items must be {kind}, like query", param="items")
        return self

    def item_list(self) -> list[Union[str, list[int]]]:
        return [self.items] if isinstance(self.items, str) else list(self.items)


class ScoringResponse(BaseModel):
    scores: list[list[float]]  # per item, one probability per label_token_ids entry, in order
    model: str
    usage: Optional[UsageInfo] = None
    object: Literal["scoring"] = "scoring"
