"""The parts of a message: tool calls, text parts and image parts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    field_validator,
    model_validator,
)

from memstore._validate import (
    check_json,
    check_text,
    short_repr,
)
from memstore.models.common import (
    _FROZEN,
    _reject_nul,
    _validate_id,
)


def _tool_call_fields(item: Any) -> Any:
    """Turn an OpenAI ``tool_calls`` item (``{"id", "type", "function": {...}}``) into fields.

    Other keys of the item (such as a streaming ``index``) carry nothing memstore keeps
    and are ignored, as before.
    """
    if not isinstance(item, Mapping):
        return item
    kind = item.get("type", "function")
    if kind != "function":
        raise ValueError(
            f"tool call type {short_repr(kind)} is not supported (only \"function\" tool calls "
            f"are)"
        )
    if "function" not in item:
        return item
    function = item["function"]
    if not isinstance(function, Mapping):
        raise ValueError(
            f"tool call function must be an object with name and arguments, "
            f"not {type(function).__name__}"
        )
    fields = {"id": item.get("id"), "name": function.get("name")}
    if "arguments" in function:
        fields["arguments"] = function["arguments"]
    return fields


class ToolCall(BaseModel):
    """One function call requested by an assistant message.

    Attributes:
        id: the provider's call id; tool results answer it with ``tool_call_id``.
        name: the function name.
        arguments: the arguments exactly as the model produced them (a JSON string,
            kept verbatim even when it is not valid JSON). A mapping (the way LangChain
            and Anthropic hand arguments over) is accepted and stored as its compact
            JSON text (``{"a":1}``: no spaces, keys in the mapping's order, non-ASCII
            kept); it must be JSON (no NaN, no sets, string keys).
        type: always ``"function"``.
    """

    model_config = _FROZEN

    id: str
    name: str
    arguments: str = "{}"
    type: Literal["function"] = "function"

    @model_validator(mode="before")
    @classmethod
    def _from_openai_shape(cls, data: Any) -> Any:
        return _tool_call_fields(data)

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        return _validate_id(value, "tool call id")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value:
            raise ValueError("tool call name must not be empty")
        return _reject_nul(value, "tool call name")

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_text(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            check_json(dict(value), "tool call arguments")
            return json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
        if not isinstance(value, str):
            raise ValueError(
                "tool call arguments must be the JSON text of the arguments (a str) or a "
                f"mapping of them, got {type(value).__name__}")
        return value

    @field_validator("arguments")
    @classmethod
    def _check_arguments(cls, value: str) -> str:
        return _reject_nul(value, "tool call arguments")

    def to_openai(self) -> dict[str, Any]:
        """Return the call in OpenAI's ``tool_calls`` item shape."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class TextPart(BaseModel):
    """A text content part."""

    model_config = _FROZEN

    type: Literal["text"] = "text"
    text: str

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str) -> str:
        return _reject_nul(value, "text part")


class ImageURL(BaseModel):
    """The ``image_url`` object of an image part."""

    model_config = _FROZEN

    url: str
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return check_text(value, "image url")


class ImagePart(BaseModel):
    """An image content part (a URL or a ``data:`` URI)."""

    model_config = _FROZEN

    type: Literal["image_url"] = "image_url"
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


