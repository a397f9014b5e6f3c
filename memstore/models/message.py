"""Messages: what a caller writes and what a store returns, and their constructors.

[`Message`][memstore.Message] is what a caller writes, [`StoredMessage`][memstore.StoredMessage]
what a store returns;
both are built from the OpenAI and Anthropic shapes here.

The Anthropic reader lives here, beside [`Message`][memstore.Message] whose
[`from_anthropic()`][memstore.Message.from_anthropic] it implements; `memstore.formats` re-exports
it
as `memstore.formats.from_anthropic()` beside the renderers.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

from memstore._validate import (
    MAX_COUNTER_NAME_LENGTH,
    MAX_SEQ,
    MAX_TOKEN_COUNT,
    check_flag,
    check_json,
    check_json_size,
    check_size,
    check_text,
    short_repr,
    text_problem,
    utf8_size,
)
from memstore.errors import InvalidInputError
from memstore.models.common import (
    _FROZEN,
    _IGNORABLE_OPENAI_KEYS,
    _MAX_FLOAT,
    ANCHOR_ROLES,
    Role,
    _check_json,
    _reject_nul,
    _utc,
    _validate_id,
    same_json,
)
from memstore.models.parts import (
    ContentPart,
    ImagePart,
    ImageURL,
    TextPart,
    ToolCall,
)


class Message(BaseModel):
    """A chat message as a caller writes it (OpenAI chat format plus memstore fields).

    Attributes:
        role: ``system``, ``developer``, ``user``, ``assistant`` or ``tool``.
        content: text, a list of content parts, or ``None`` (assistant only).
        name: optional participant name.
        tool_calls: calls requested by an assistant message.
        tool_call_id: the call a ``tool`` message answers (required for tool messages,
            forbidden for every other role).
        score: base importance, finite and ≥ 0 (views decay it at read time).
        pinned: kept by every view, like system messages.
        metadata: any JSON object.
        id: optional client id; appends with the same id are idempotent.
    """

    model_config = _FROZEN

    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    score: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    pinned: bool = False
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    id: str | None = None

    # ---- validation -------------------------------------------------------------------

    @field_validator("score", mode="before")
    @classmethod
    def _check_score_range(cls, value: Any) -> Any:
        if isinstance(value, bool):  # as set_score refuses it: True is no importance
            raise ValueError(f"score must be a number, not the bool {value}")
        if isinstance(value, int) and abs(value) > _MAX_FLOAT:
            raise ValueError(f"score must be finite and >= 0, got an integer of "
                             f"{value.bit_length()} bits (too large for a float)")
        return value

    @field_validator("score")
    @classmethod
    def _no_negative_zero(cls, value: float) -> float:
        return 0.0 if value == 0.0 else value  # -0.0 is stored as 0.0 on every database

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: str | list[Any] | None) -> str | list[Any] | None:
        if isinstance(value, str):
            _reject_nul(value, "content")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None:
            if not value:
                raise ValueError("name must not be empty when given")
            _validate_id(value, "name")
        return value

    @field_validator("tool_call_id", "id")
    @classmethod
    def _check_ids(cls, value: str | None, info: Any) -> str | None:
        if value is not None:
            _validate_id(value, info.field_name)
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _check_metadata(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"metadata must be a JSON object, not {type(value).__name__}")
        _check_json(value, "metadata")
        return value

    @model_validator(mode="after")
    def _check_roles(self) -> Message:
        if self.tool_calls is not None and len(self.tool_calls) == 0:
            object.__setattr__(self, "tool_calls", None)
        if self.tool_calls is not None:
            if self.role != "assistant":
                raise ValueError(
                    f"tool_calls is only allowed on assistant messages, not {self.role}"
                )
            ids = [call.id for call in self.tool_calls]
            duplicates = sorted({i for i in ids if ids.count(i) > 1})
            if duplicates:
                raise ValueError(f"tool_calls has duplicate ids: {', '.join(duplicates)}")
        if self.role == "tool":
            if self.tool_call_id is None:
                raise ValueError("tool_call_id is required for a tool message")
        elif self.tool_call_id is not None:
            raise ValueError(f"tool_call_id is only allowed on tool messages, not {self.role}")
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a {self.role} message")
        if (isinstance(self.content, list) and self.role not in _IMAGE_ROLES
                and any(not isinstance(part, TextPart) for part in self.content)):
            raise ValueError(f"a {self.role} message may only hold text parts "
                             "(images go in user messages and tool results)")
        _check_message_size(self)
        if type(self) is Message:  # (only plain messages are written as they are)
            _VALIDATED[id(self)] = self
        return self

    # ---- convenience ------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The message's text: the string content, or its text parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    @property
    def anchored(self) -> bool:
        """True for system/developer messages and pinned messages (kept by every view)."""
        return self.pinned or self.role in ANCHOR_ROLES

    @property
    def tool_call_ids(self) -> tuple[str, ...]:
        """The ids of this message's tool calls (empty when it has none)."""
        calls = self.tool_calls
        return tuple([call.id for call in calls]) if calls else ()

    def same_content(self, other: Message) -> bool:
        """Whether ``other`` carries the same content (the idempotency comparison).

        Compares role, content, name, tool calls, tool_call_id and metadata. Score and
        pinned are mutable after the write and are not compared. Metadata compares as
        JSON: ``1``, ``1.0`` and ``True`` are three different values (Python's ``==``
        would call them equal), as the databases store them.
        """
        return (
            self.role == other.role
            and self.content == other.content
            and self.name == other.name
            and self.tool_calls == other.tool_calls
            and self.tool_call_id == other.tool_call_id
            and same_json(self.metadata, other.metadata)
        )

    def as_message(self) -> Message:
        """Return a plain `Message` with this message's caller-visible fields."""
        return Message.model_validate(
            {name: getattr(self, name) for name in Message.model_fields}
        )

    # ---- constructors -----------------------------------------------------------------

    @classmethod
    def system(cls, content: str | list[ContentPart], **kwargs: Any) -> Message:
        """Build a system message."""
        return cls(role="system", content=content, **kwargs)

    @classmethod
    def developer(cls, content: str | list[ContentPart], **kwargs: Any) -> Message:
        """Build a developer message."""
        return cls(role="developer", content=content, **kwargs)

    @classmethod
    def user(cls, content: str | list[ContentPart], **kwargs: Any) -> Message:
        """Build a user message."""
        return cls(role="user", content=content, **kwargs)

    @classmethod
    def assistant(
        cls,
        content: str | list[ContentPart] | None = None,
        *,
        tool_calls: list[ToolCall] | None = None,
        **kwargs: Any,
    ) -> Message:
        """Build an assistant message, optionally with tool calls."""
        return cls(role="assistant", content=content, tool_calls=tool_calls, **kwargs)

    @classmethod
    def tool(cls, content: str | list[ContentPart], *, tool_call_id: str, **kwargs: Any) -> Message:
        """Build a tool result answering ``tool_call_id``."""
        return cls(role="tool", content=content, tool_call_id=tool_call_id, **kwargs)

    @classmethod
    def from_openai(cls, data: Mapping[str, Any], **extra: Any) -> Message:
        """Build a message from an OpenAI chat-format dict.

        Args:
            data: ``{"role": ..., "content": ..., "tool_calls": [...], ...}``. memstore's
                own fields (``score``, ``pinned``, ``metadata``, ``id``) may appear too.
            **extra: memstore fields given separately (override ``data``).

        Raises:
            pydantic.ValidationError: the dict is not a valid message; unknown keys are
                rejected by name (empty ``refusal``/``annotations``/``audio`` are ignored).
        """
        if not isinstance(data, Mapping):
            return cls.model_validate(data)  # a ValidationError naming the type
        fields: dict[str, Any] = {}
        for key, value in data.items():
            if key in _IGNORABLE_OPENAI_KEYS and _is_empty(value):
                continue
            fields[key] = value
        fields.update(extra)
        return cls.model_validate(fields)

    def to_openai(self) -> dict[str, Any]:
        """Return the message as an OpenAI Chat Completions message dict.

        Only the fields the role's message type defines are sent
        (``ChatCompletion<Role>MessageParam`` of the ``openai`` package): ``name`` on
        system, developer, user and assistant messages, never on a ``tool`` message,
        whose type has no ``name`` (strict OpenAI-compatible servers answer 400 to
        it); the name stays stored. A tool message's content parts may only be text
        there, so an image part of a tool result is sent as the text part
        ``TOOL_IMAGE_OMITTED`` (`memstore.formats.to_anthropic()` and
        `memstore.formats.to_responses()` send the image itself). memstore's
        rendering hints (``metadata["memstore"]``: cache control, thinking blocks)
        are never sent.
        """
        out: dict[str, Any] = {"role": self.role}
        content = self.content
        if isinstance(content, list):
            if self.role == "tool":
                out["content"] = [part.model_dump(exclude_none=True)
                                  if isinstance(part, TextPart)
                                  else {"type": "text", "text": TOOL_IMAGE_OMITTED}
                                  for part in content]
            else:
                out["content"] = [part.model_dump(exclude_none=True) for part in content]
        elif content is None and not self.tool_calls:
            # The API takes an assistant message without content only beside tool
            # calls: one with neither (a model that returned nothing) is sent as "".
            out["content"] = ""
        else:
            out["content"] = content
        if self.name is not None and self.role != "tool":
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    @classmethod
    def from_anthropic(cls, data: Mapping[str, Any], **extra: Any) -> list[Message]:
        """Read one Anthropic message param as a list of messages.

        One Anthropic user turn can hold several tool results: each becomes its own
        ``tool`` message. See `memstore.formats.from_anthropic()`.
        """
        return from_anthropic(data, **extra)


#: Roles whose content parts may be images: user messages and tool results (an
#: Anthropic ``tool_result`` can hold images; so can a Responses function output).
_IMAGE_ROLES = frozenset({"user", "tool"})

#: The text part [`Message.to_openai()`][memstore.Message.to_openai] sends in place of
#: an image part of a tool result: Chat Completions tool messages carry text only.
TOOL_IMAGE_OMITTED = "[image omitted: Chat Completions tool messages carry text only]"


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, tuple)) and len(value) == 0)


_MESSAGE_PARTS = "the message (content, parts, tool calls and metadata)"


def _check_message_size(message: Message) -> None:
    """Refuse a message whose strings and metadata take more than MAX_RECORD_BYTES."""
    content = message.content
    if isinstance(content, str):
        size = utf8_size(content)
    elif content:
        size = sum(utf8_size(part.text) if isinstance(part, TextPart)
                   else utf8_size(part.image_url.url) for part in content)
    else:
        size = 0
    if message.tool_calls:
        size += sum(utf8_size(call.arguments) + len(call.name) + len(call.id)
                    for call in message.tool_calls)
    check_size(size, _MESSAGE_PARTS)
    if message.metadata:
        check_json_size(message.metadata, _MESSAGE_PARTS, size)


class StoredMessage(Message):
    """A message as stored: the caller's message plus what the store assigned.

    Attributes:
        conversation_id: the conversation it belongs to.
        seq: its position, gap-free from the conversation's first stored message.
        created_at: when it was written (timezone-aware UTC); display, decay, retention.
        token_count: its tokens as counted by ``token_counter`` at write time.
        token_counter: the name of the counter that produced ``token_count``.
        id: the client id when one was given, else a store-assigned UUID string.
    """

    conversation_id: str
    seq: int = Field(ge=1, le=MAX_SEQ)
    created_at: datetime
    token_count: int = Field(ge=0, le=MAX_TOKEN_COUNT)
    token_counter: str = Field(min_length=1, max_length=MAX_COUNTER_NAME_LENGTH)
    id: str  # narrowed from ``str | None``: a stored message always has an id

    @field_validator("conversation_id")
    @classmethod
    def _check_conversation_id(cls, value: str) -> str:
        return _validate_id(value, "conversation id")

    @field_validator("token_counter")
    @classmethod
    def _check_counter(cls, value: str) -> str:
        return check_text(value, "token counter name")

    @field_validator("created_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return _utc(value)




_M = TypeVar("_M", bound=BaseModel)

#: Every message that validation built, by ``id()`` (held weakly, so an entry leaves
#: with its message and an address reused later is not mistaken for it).
#: `checked_message()` trusts these; a message made any other way
#: (``model_copy(update=...)``, ``model_construct``, ``copy.copy``) skipped validation.
_VALIDATED: weakref.WeakValueDictionary[int, Message] = weakref.WeakValueDictionary()


def checked_message(message: Message) -> Message:
    """``message`` as a valid plain [`Message`][memstore.Message] before it is written.

    A message built by validation is returned as it is, after its metadata is checked
    again (its nested dict is a plain one, which may have been changed in place). Any
    other (a ``model_copy(update=...)``, which pydantic does not validate, or a
    ``model_construct``) is validated again now.

    Raises:
        pydantic.ValidationError: the message is not valid (nothing is written).
    """
    if _VALIDATED.get(id(message)) is message:  # (a plain Message: only those are held)
        metadata = message.metadata
        if not metadata:
            return message
        try:
            check_json(metadata, "metadata")
            return message
        except ValueError:
            pass  # validated below, which names the problem
    return message.as_message()


_SHARED_FIELDS_SET: dict[type[BaseModel], set[str]] = {}


def build_trusted(cls: type[_M], values: dict[str, Any]) -> _M:
    """Instantiate a model from trusted, complete field values without validation.

    The state `pydantic.BaseModel.model_construct()` produces, at a fraction of its
    cost. Internal: the read path builds one model per row it returns and one window
    per read, from values that were validated when they were written (or computed by
    memstore itself). ``values`` must hold every field, defaults included.
    """
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    fields_set = _SHARED_FIELDS_SET.get(cls)
    if fields_set is None or len(fields_set) != len(values):
        fields_set = set(values)
        if cls.model_config.get("frozen") and len(values) == len(cls.model_fields):
            # Every field is set and a frozen model never adds to the set: instances
            # share one (a set per row is a GC-tracked object per cached row).
            _SHARED_FIELDS_SET[cls] = fields_set
            fields_set = set(values)
    object.__setattr__(obj, "__pydantic_fields_set__", fields_set)
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


# ---- rendering hints and the Anthropic reader ------------------------------------------

HINTS_KEY = "memstore"

#: The ``ttl`` values of an Anthropic cache-control object.
CACHE_TTLS = ("5m", "1h")

#: The keys of each Anthropic thinking block memstore stores, in the order it sends them.
_THINKING_KEYS: dict[str, tuple[str, ...]] = {
    "thinking": ("type", "thinking", "signature"),
    "redacted_thinking": ("type", "data"),
}


def _hints(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    value = metadata.get(HINTS_KEY)
    return value if isinstance(value, Mapping) else {}


def check_cache_control(value: Mapping[str, Any], where: str = "cache_control") -> dict[str, Any]:
    """``value`` as the Anthropic cache-control object it must be, or InvalidInputError.

    The Anthropic Messages API takes exactly ``{"type": "ephemeral"}``, optionally with
    ``"ttl": "5m"`` or ``"ttl": "1h"``; anything else is a 400 when the request is
    sent. It is refused here instead, naming what is wrong.

    Args:
        value: the cache-control mapping (its JSON-ness is checked by the caller).
        where: how the error names it.

    Returns:
        A plain copy: ``{"type": "ephemeral"}`` or ``{"type": "ephemeral", "ttl": ...}``.

    Raises:
        InvalidInputError: an unknown key, a ``type`` other than ``"ephemeral"`` (or
            none), or a ``ttl`` other than ``"5m"``/``"1h"``.
    """
    unknown = [key for key in value if key not in ("type", "ttl")]
    if unknown:
        raise InvalidInputError(
            f"{where} has the unknown key(s) {', '.join(short_repr(k) for k in unknown)}; "
            'an Anthropic cache-control object has only "type" ("ephemeral") and an '
            'optional "ttl" ("5m" or "1h")'
        )
    if "type" not in value:
        raise InvalidInputError(f'{where} has no "type"; it must be {{"type": "ephemeral"}}')
    if not isinstance(value["type"], str) or value["type"] != "ephemeral":
        raise InvalidInputError(
            f'{where} type must be "ephemeral" (the only cache type Anthropic accepts), '
            f"not {short_repr(value['type'])}"
        )
    out: dict[str, Any] = {"type": "ephemeral"}
    if "ttl" in value:
        ttl = value["ttl"]
        if not isinstance(ttl, str) or ttl not in CACHE_TTLS:
            raise InvalidInputError(
                f'{where} ttl must be "5m" or "1h" (Anthropic\'s only cache lifetimes), '
                f"not {short_repr(ttl)}"
            )
        out["ttl"] = ttl
    return out


def check_thinking(blocks: Any, where: str = "thinking") -> list[dict[str, str]]:
    """Anthropic thinking blocks as memstore stores them, or InvalidInputError.

    Each block is ``{"type": "thinking", "thinking": str, "signature": str}`` or
    ``{"type": "redacted_thinking", "data": str}`` (the SDK's ``ThinkingBlockParam``
    and ``RedactedThinkingBlockParam``); other keys of a block are not kept. The
    strings are kept exactly: Anthropic verifies the signature and refuses a block
    that was changed.

    Raises:
        InvalidInputError: not a list of such blocks (an unknown type, a missing or
            non-string field, text that cannot be stored).
    """
    if isinstance(blocks, (str, bytes, Mapping)) or not isinstance(blocks, Sequence):
        raise InvalidInputError(
            f"{where} must be a list of thinking blocks, not {type(blocks).__name__}")
    out: list[dict[str, str]] = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        keys = _THINKING_KEYS.get(kind) if isinstance(kind, str) else None
        if keys is None:
            raise InvalidInputError(
                f"{where}[{index}] must be a thinking or redacted_thinking block, not "
                f"{short_repr(kind if isinstance(block, Mapping) else block)}"
            )
        assert isinstance(block, Mapping) and isinstance(kind, str)
        stored: dict[str, str] = {}
        for key in keys:
            value = block.get(key)
            if not isinstance(value, str):
                raise InvalidInputError(
                    f"{where}[{index}] ({kind}) needs a string {key!r}, not {short_repr(value)}"
                )
            problem = text_problem(value)
            if problem is not None:
                raise InvalidInputError(f"{where}[{index}] ({kind}) {key!r} {problem}")
            stored[key] = value
        out.append(stored)
    return out


def with_hints(metadata: Mapping[str, Any] | None = None, *,
               cache_control: Mapping[str, Any] | None = None,
               is_error: bool | None = None,
               thinking: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A copy of ``metadata`` with rendering hints set under ``metadata["memstore"]``.

    Args:
        metadata: the message metadata to extend (not modified).
        cache_control: a prompt-cache breakpoint: ``{"type": "ephemeral"}``, optionally
            with ``"ttl": "5m"`` or ``"1h"`` (nothing else; see `check_cache_control()`).
        is_error: whether a tool result reports a failure.
        thinking: an assistant message's Anthropic ``thinking``/``redacted_thinking``
            blocks, in their order (see `check_thinking()`); ``to_anthropic()`` sends
            them back first in the message's turn, unchanged.

    Returns:
        The new metadata dict; hints given as ``None`` are left as they were.

    Raises:
        InvalidInputError: ``metadata`` or ``cache_control`` is not a mapping, the
            cache-control object is not one Anthropic accepts, ``is_error`` is not a
            bool, or ``thinking`` is not a list of thinking blocks.
    """
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a mapping, not {type(metadata).__name__}")
    if cache_control is not None and not isinstance(cache_control, Mapping):
        raise InvalidInputError(
            f"cache_control must be a mapping such as {{'type': 'ephemeral'}}, "
            f"not {type(cache_control).__name__}"
        )
    out = dict(metadata or {})
    hints = dict(_hints(out))
    if cache_control is not None:
        hints["cache_control"] = check_cache_control(cache_control)
    if is_error is not None:
        hints["is_error"] = check_flag(is_error, "is_error")
    if thinking is not None:
        blocks = check_thinking(thinking)
        if blocks:
            hints["thinking"] = blocks
        else:
            hints.pop("thinking", None)
    if hints:
        out[HINTS_KEY] = hints
    elif isinstance(out.get(HINTS_KEY), Mapping):
        del out[HINTS_KEY]  # (its last hint was cleared)
    return out


def _field(block: Mapping[str, Any], key: str, where: str) -> Any:
    """``block[key]``, or an InvalidInputError naming the block and the missing key."""
    if key not in block:
        raise InvalidInputError(f"{where} has no {key!r}")
    return block[key]


def _block_where(where: str, index: int, kind: str) -> str:
    return f"{where}: content block {index} ({kind})"


def _kind_shown(kind: object) -> str:
    """A block's ``type`` for a message: as it is when a string, else its short repr."""
    return kind if isinstance(kind, str) else short_repr(kind)


def _tool_result_parts(blocks: Any, where: str) -> str | list[TextPart | ImagePart]:
    """A ``tool_result`` block's ``content`` list as text and image parts, in order."""
    if blocks is None:
        return ""
    if not isinstance(blocks, Sequence) or isinstance(blocks, (bytes, bytearray)):
        raise InvalidInputError(
            f"{where}: content must be a string or a list of text and image blocks, "
            f"not {type(blocks).__name__}"
        )
    parts: list[TextPart | ImagePart] = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            parts.append(TextPart(text=_field(block, "text", _block_where(where, index, kind))))
        elif kind == "image":
            parts.append(_image_from_anthropic(block, _block_where(where, index, kind)))
        else:
            raise InvalidInputError(
                f"{where}: only text and image blocks are supported here, not "
                f"{short_repr(kind)}"
            )
    return parts


def _tool_arguments(block: Mapping[str, Any], where: str) -> str:
    """A tool_use block's ``input`` as the JSON text of a tool call's ``arguments``."""
    value = block.get("input", {})
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            f"{where}: input must be a JSON object, not {type(value).__name__}"
        )
    try:
        return json.dumps(value, allow_nan=False)
    except RecursionError:
        raise InvalidInputError(f"{where}: input is nested too deeply to serialise") from None
    except (TypeError, ValueError) as exc:
        # ValueError: NaN or Infinity, which JSON cannot express; TypeError: a value
        # (set, bytes ...) or key that is not JSON.
        raise InvalidInputError(f"{where}: input is not JSON: {exc}") from None


def _image_from_anthropic(block: Mapping[str, Any], where: str) -> ImagePart:
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise InvalidInputError(f"{where}: an image block needs a source object")
    if source.get("type") == "base64":
        media_type = _source_text(source, "media_type", where)
        url = f"data:{media_type};base64,{_source_text(source, 'data', where)}"
    elif source.get("type") == "url":
        url = _source_text(source, "url", where)
    else:
        raise InvalidInputError(
            f"{where}: image source type {short_repr(source.get('type'))} is not supported "
            "(supported: base64, url)"
        )
    return ImagePart(image_url=ImageURL(url=url))


def _source_text(source: Mapping[str, Any], key: str, where: str) -> str:
    """An image source's ``key``: a non-empty string, or an InvalidInputError naming it."""
    value = _field(source, key, f"{where}: the image source")
    if not isinstance(value, str) or not value:
        raise InvalidInputError(
            f"{where}: the image source's {key!r} must be a non-empty string, "
            f"not {short_repr(value)}"
        )
    return value


def _meta(base: dict[str, Any], cache: Any, where: str) -> dict[str, Any]:
    """``base`` with a block's ``cache_control`` (``None`` means none) as a hint."""
    if cache is None:
        return base
    if not isinstance(cache, Mapping):
        raise InvalidInputError(
            f'{where}: cache_control must be an object such as {{"type": "ephemeral"}}, '
            f"not {type(cache).__name__}"
        )
    try:
        check_json(dict(cache), "cache_control")
    except ValueError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None
    try:
        return with_hints(base, cache_control=check_cache_control(cache))
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None


#: The message fields `from_anthropic()` takes from the message param itself.
_FROM_ANTHROPIC_OWN = frozenset({"role", "content", "tool_calls", "tool_call_id"})


def from_anthropic(data: Mapping[str, Any], **extra: Any) -> list[Message]:
    """Read one Anthropic message param (``{"role": ..., "content": ...}``) as memstore messages.

    A user turn becomes one ``tool`` message per ``tool_result`` block and one user
    message per run of text and image blocks, in block order; a ``tool_result``'s
    content (a string, or text and image blocks) becomes the tool message's content.
    An assistant turn becomes one assistant message: text blocks as its content,
    ``tool_use`` blocks as its tool calls (``input`` serialised as the JSON
    ``arguments``), and ``thinking``/``redacted_thinking`` blocks, in their order and
    exactly as given (signature included), as the message's ``thinking`` hint, which
    `memstore.formats.to_anthropic()` sends back first in the turn (extended thinking
    with tool use needs them back unchanged; the OpenAI renderings leave them out).
    A block's ``cache_control`` and a tool result's ``is_error`` become hints in the
    metadata of the message made from the block (`with_hints()`).

    Args:
        data: the message param.
        **extra: memstore fields (``score``, ``pinned``, ``metadata``...) for every
            message made.

    Raises:
        InvalidInputError: an unknown role, a block type memstore cannot store
            (documents, search results, server tools...; thinking in a user turn), a
            block without a field it needs (a text block's ``text``, a ``tool_use``
            block's ``id`` or ``name``, a ``tool_result`` block's ``tool_use_id``, an
            image source's ``media_type``, ``data`` or ``url``, a thinking block's
            ``thinking`` or ``signature``, a redacted one's ``data``), a ``tool_use``
            input that is not a JSON object (NaN, sets, bytes, nesting too deep to
            serialise), or a ``cache_control`` Anthropic would refuse (see
            `check_cache_control()`); the message names the block by its index. Also a
            keyword naming a field the message param sets (``role``, ``content``,
            ``tool_calls``, ``tool_call_id``), or a ``metadata`` that is not a mapping.
        pydantic.ValidationError: a block's values are not a valid message (a text
            that is not a string, an empty id ...).
    """
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"from_anthropic expects a mapping, not {type(data).__name__}")
    role = data.get("role")
    content = data.get("content")
    if role not in ("user", "assistant"):
        raise InvalidInputError(
            f"Anthropic message role must be 'user' or 'assistant', not {short_repr(role)}"
        )
    where = f"Anthropic {role} message"
    own = sorted(_FROM_ANTHROPIC_OWN.intersection(extra))
    if own:
        raise InvalidInputError(
            f"from_anthropic sets {', '.join(own)} from the message itself; pass only "
            "memstore fields (score, pinned, metadata, name, id) as keywords"
        )
    base = extra.pop("metadata", None)
    if base is not None and not isinstance(base, Mapping):
        raise InvalidInputError(
            f"metadata must be a JSON object (a mapping), not {type(base).__name__}"
        )
    metadata = dict(base or {})
    if isinstance(content, str):
        return [Message(role=role, content=content, metadata=metadata, **extra)]
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise InvalidInputError(f"{where}: content must be a string or a list of blocks")
    if role == "assistant":
        texts: list[TextPart] = []
        calls: list[ToolCall] = []
        thinking: list[Mapping[str, Any]] = []
        cache: Any = None
        cache_at = where
        for index, block in enumerate(content):
            kind = block.get("type") if isinstance(block, Mapping) else None
            at = _block_where(where, index, _kind_shown(kind))
            if kind == "text":
                texts.append(TextPart(text=_field(block, "text", at)))
            elif kind == "tool_use":
                calls.append(ToolCall(id=_field(block, "id", at), name=_field(block, "name", at),
                                      arguments=_tool_arguments(block, at)))
            elif kind in _THINKING_KEYS:
                assert isinstance(block, Mapping)
                for key in _THINKING_KEYS[kind][1:]:
                    _field(block, key, at)
                thinking.append(block)
                continue  # (a thinking block cannot carry cache_control)
            else:
                raise InvalidInputError(
                    f"{where}: block type {short_repr(kind)} is not supported "
                    "(supported: text, tool_use, thinking, redacted_thinking)"
                )
            if block.get("cache_control") is not None:
                cache, cache_at = block.get("cache_control"), at
        text: str | list[TextPart] | None
        text = texts[0].text if len(texts) == 1 else (texts or None)
        meta = _meta(metadata, cache, cache_at)
        if thinking:
            try:
                meta = with_hints(meta, thinking=thinking)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{where}: {exc}") from None
        return [Message(role="assistant", content=text, tool_calls=calls or None,
                        metadata=meta, **extra)]
    out: list[Message] = []
    run: list[TextPart | ImagePart] = []
    run_cache: Any = None
    run_cache_at = where

    def flush() -> None:
        nonlocal run, run_cache
        if run:
            body: str | list[TextPart | ImagePart]
            body = run[0].text if len(run) == 1 and isinstance(run[0], TextPart) else run
            out.append(Message(role="user", content=body,
                               metadata=_meta(metadata, run_cache, run_cache_at), **extra))
        run, run_cache = [], None

    for index, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        at = _block_where(where, index, _kind_shown(kind))
        if kind == "text":
            run.append(TextPart(text=_field(block, "text", at)))
        elif kind == "image":
            run.append(_image_from_anthropic(block, at))
        elif kind == "tool_result":
            flush()
            inner = block.get("content", "")
            body_result = inner if isinstance(inner, str) else _tool_result_parts(inner, at)
            meta = _meta(metadata, block.get("cache_control"), at)
            if block.get("is_error"):
                meta = with_hints(meta, is_error=True)
            out.append(Message(role="tool", content=body_result,
                               tool_call_id=_field(block, "tool_use_id", at), metadata=meta,
                               **extra))
            continue
        else:
            raise InvalidInputError(
                f"{where}: block type {short_repr(kind)} is not supported "
                "(supported: text, image, tool_result)"
            )
        if block.get("cache_control") is not None:
            run_cache, run_cache_at = block.get("cache_control"), at
    flush()
    return out


# ---- OpenAI Responses ---------------------------------------------------------------------


