"""OpenAI's Embeddings wire format (`POST /v1/embeddings`), beside `api/protocol.py`'s chat.

`input` is a string, a list of strings, a list of token ids or a list of token-id lists; its
limits (1-2,048 inputs, none empty, each within the model's length, 300,000 tokens a request)
depend on the model and are checked by `serving/embeddings.py`, whose errors name `input`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from api.protocol import _Lenient

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(_Lenient):
    model: str
    input: EmbeddingInput
    # OpenAI's default is "float"; the `openai` SDK asks for "base64" unless told otherwise
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _one_shape(cls, value: Any) -> Any:
        """One message for every wrong shape, naming what `input` may be (a union's own errors
        list each member's complaint)."""
        if isinstance(value, str):
            return value
        if isinstance(value, list) and (
            all(isinstance(item, str) for item in value)
            or all(_is_token(item) for item in value)
            or all(isinstance(item, list) and all(map(_is_token, item)) for item in value)
        ):
            return value
        raise ValueError(
            "input must be a string, an array of strings, an array of token ids (integers) "
            "or an array of token-id arrays"
        )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str  # floats, or base64 of little-endian float32
    index: int


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
