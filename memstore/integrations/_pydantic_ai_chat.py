"""Pydantic AI's messages as memstore's chat messages (what memstore counts and views select).

The mapping `memstore.integrations.pydantic_ai` stores each entry with (see its module
documentation): a ``ModelResponse`` is one assistant message, a ``ModelRequest`` the tool
messages answering calls and then one system or user message per other part.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_ai.messages import (
    BinaryContent,
    FileUrl,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextContent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from memstore import ImagePart, ImageURL, Message, ToolCall
from memstore import TextPart as MemstoreTextPart

__all__ = ["HIDDEN_CALL_ID", "chat_messages", "request_messages", "response_message"]

#: The ``tool_call_id`` of hidden messages: no stored call has it, so views leave them out.
HIDDEN_CALL_ID = "memstore.pydantic_ai"


def _valid_call_id(call_id: Any) -> bool:
    if not isinstance(call_id, str) or call_id == HIDDEN_CALL_ID:
        return False
    try:
        ToolCall(id=call_id, name="call")
    except ValidationError:
        return False
    return True


def _valid_call(call_id: Any, name: Any) -> bool:
    if not _valid_call_id(call_id):
        return False
    try:
        ToolCall(id=call_id, name=name)
    except ValidationError:
        return False
    return True


def _image_url(url: str) -> ImageURL | None:
    try:
        return ImageURL(url=url)
    except ValidationError:
        return None


def _user_message(content: Any) -> Message:
    """A user prompt's content as one user message: text, and images as image parts."""
    if isinstance(content, str):
        return Message(role="user", content=content)
    parts: list[MemstoreTextPart | ImagePart] = []
    for item in content:
        image: ImageURL | None = None
        if isinstance(item, str):
            parts.append(MemstoreTextPart(text=item))
            continue
        if isinstance(item, TextContent):
            parts.append(MemstoreTextPart(text=item.content))
            continue
        if isinstance(item, ImageUrl):
            image = _image_url(item.url)
        elif isinstance(item, BinaryContent) and item.is_image:
            image = _image_url(item.data_uri)
        if image is not None:
            parts.append(ImagePart(image_url=image))
        elif isinstance(item, FileUrl):
            kind = getattr(item, "kind", "file")
            parts.append(MemstoreTextPart(text=f"[{kind}: {item.url}]"))
        else:  # audio, documents, uploaded files, cache points: not counted as text
            kind = getattr(item, "kind", type(item).__name__)
            parts.append(MemstoreTextPart(text=f"[{kind}]") if kind != "cache-point"
                         else MemstoreTextPart(text=""))
    if all(isinstance(part, MemstoreTextPart) for part in parts):
        return Message(role="user", content="".join(
            part.text for part in parts if isinstance(part, MemstoreTextPart)))
    return Message(role="user", content=list(parts))


def _answers_call(part: Any) -> bool:
    """Whether a request part answers a tool call (a tool return, or a legacy tool retry)."""
    if isinstance(part, ToolReturnPart):
        return True
    return (getattr(part, "part_kind", None) == "retry-prompt"
            and getattr(part, "tool_name", None) is not None)


def _part_text(part: Any) -> str:
    for name in ("model_response_str", "model_response"):
        method = getattr(part, name, None)
        if callable(method):
            text = method()
            if isinstance(text, str):
                return text
    content = getattr(part, "content", "")
    return content if isinstance(content, str) else repr(content)


def request_messages(request: ModelRequest) -> list[tuple[int, Message]]:
    """``(part index, chat message)`` for each part of a request that has one.

    Parts answering a call come first (a tool message must follow the call's assistant
    message before any other message), then the others in order. Parts with no chat
    equivalent (instruction and tool-availability deltas, compaction markers...) have
    none: they are not sent as conversation text.
    """
    answers: list[tuple[int, Message]] = []
    others: list[tuple[int, Message]] = []
    for index, part in enumerate(request.parts):
        if _answers_call(part):
            call_id = getattr(part, "tool_call_id", None)
            text = _part_text(part)
            if _valid_call_id(call_id):
                answers.append((index, Message(role="tool", tool_call_id=call_id, content=text)))
            else:
                others.append((index, Message(role="user", content=text)))
        elif isinstance(part, SystemPromptPart):
            others.append((index, Message(role="system", content=part.content)))
        elif isinstance(part, UserPromptPart):
            others.append((index, _user_message(part.content)))
        elif getattr(part, "part_kind", None) in ("retry-prompt", "retry-feedback"):
            others.append((index, Message(role="user", content=_part_text(part))))
    return answers + others


def response_message(response: ModelResponse) -> Message:
    """A response as one assistant message: its text and its (function) tool calls.

    Provider-run tool calls (``NativeToolCallPart``) are answered inside the response
    and thinking parts are not counted; a call memstore cannot hold (an invalid or
    repeated id) is counted as text.
    """
    texts: list[str] = []
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for part in response.parts:
        if isinstance(part, TextPart):
            texts.append(part.content)
        elif isinstance(part, ToolCallPart):
            args = part.args_as_json_str()
            if part.tool_call_id not in seen and _valid_call(part.tool_call_id, part.tool_name):
                seen.add(part.tool_call_id)
                calls.append(ToolCall(id=part.tool_call_id, name=part.tool_name, arguments=args))
            else:
                texts.append(f"[tool call {part.tool_name}: {args}]")
    return Message(role="assistant", content="\n".join(texts) if texts else None,
                   tool_calls=calls or None)


def chat_messages(message: ModelMessage) -> list[Message]:
    """The chat equivalent of a Pydantic AI message, what memstore counts and windows.

    A ``ModelResponse`` is one assistant message; a ``ModelRequest`` is a tool message
    per tool return (first), then a system or user message per other part that has
    text or images; a request with neither gives ``[]``.
    """
    if isinstance(message, ModelResponse):
        return [response_message(message)]
    return [chat for _, chat in request_messages(message)]
