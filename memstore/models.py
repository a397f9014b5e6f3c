"""Public data model: messages, stored messages, conversations, windows and state.

The canonical message shape is OpenAI's chat format. Every model here is a
frozen pydantic v2 model; invalid input raises :class:`pydantic.ValidationError`
naming the field, before anything is written.

The input rules (:mod:`memstore._validate`) hold in every model: strings are text
both databases store exactly (no NUL, no surrogate code point), JSON values hold
only numbers PostgreSQL's ``jsonb`` gives back unchanged and nest at most 64
levels, and seqs, token counts and counter names fit their columns.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

from memstore._validate import (
    MAX_COUNTER_NAME_LENGTH,
    MAX_SEQ,
    MAX_TOKEN_COUNT,
    check_json,
    check_json_size,
    check_size,
    check_text,
    short_repr,
    utf8_size,
)

__all__ = [
    "ROLES",
    "ContentPart",
    "ContextWindow",
    "Conversation",
    "ConversationState",
    "ImagePart",
    "ImageURL",
    "Message",
    "Omission",
    "OmissionReason",
    "Role",
    "StoreStats",
    "StoredMessage",
    "Summary",
    "TextPart",
    "ToolCall",
    "WindowReport",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")
ANCHOR_ROLES: frozenset[str] = frozenset({"system", "developer"})

MAX_ID_LENGTH = 255
_MAX_FLOAT = 1.7976931348623157e308
STATE_VERSION = 2
#: Snapshot versions ``ConversationState`` reads (version 1 predates summaries).
READABLE_STATE_VERSIONS = (1, 2)
#: The default ``SummaryView`` template (``{first}``, ``{last}``: the summary's seq range).
DEFAULT_SUMMARY_TEMPLATE = "Summary of messages {first}–{last}: {text}"

_FROZEN = ConfigDict(frozen=True, extra="forbid")

# Keys of an OpenAI chat message that carry no information memstore keeps; accepted
# by ``Message.from_openai`` only when empty (``None``, ``[]`` or ``""``).
_IGNORABLE_OPENAI_KEYS = frozenset({"refusal", "annotations", "audio", "function_call"})


def _reject_nul(value: str, what: str) -> str:
    """Return ``value`` unless it cannot be stored exactly (NUL or a surrogate code point)."""
    return check_text(value, what)


def _check_json(value: Any, where: str) -> None:
    """Raise ValueError unless ``value`` is JSON both databases read back exactly equal."""
    check_json(value, where)


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: ``1``, ``1.0`` and ``True`` differ.

    Object key order does not matter; list order does. Containers may be read-only
    ones (a stored message's) or plain ones.
    """
    if a != b:
        return False  # (== is necessary; it is only not sufficient)
    return _same_json(a, b)


def _json_kind(value: Any) -> type:
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, Mapping):
        return dict
    if isinstance(value, (list, tuple)):
        return list
    return type(value)  # float, str, NoneType


def _same_json(a: Any, b: Any) -> bool:
    kind = _json_kind(a)
    if kind is not _json_kind(b):
        return False
    if kind is dict:
        return all(_same_json(item, b[key]) for key, item in a.items())
    if kind is list:
        return all(_same_json(x, y) for x, y in zip(a, b))
    return True  # equal scalars of one kind (checked by the caller's ==)


def _validate_id(value: str, what: str) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} is {len(value)} characters long; the maximum is {MAX_ID_LENGTH}")
    return check_text(value, what)


def _utc(value: datetime) -> datetime:
    """A timezone-aware UTC datetime (naive values are taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    else:
        try:
            value = value.astimezone(timezone.utc)
        except OverflowError:
            raise ValueError(
                f"{value.isoformat()} is out of range once converted to UTC") from None
    if not _EARLIEST <= value <= _LATEST:
        # PostgreSQL returns a timestamptz in the session's time zone: a value within a
        # day of Python's datetime bounds would overflow there for some session (and
        # make its conversation unreadable to that client).
        raise ValueError(f"{value.isoformat()} is out of range: timestamps must lie between "
                         f"{_EARLIEST.isoformat()} and {_LATEST.isoformat()}")
    return value


#: The stored range of timestamps: every time zone can represent them.
_EARLIEST = datetime(1, 1, 2, tzinfo=timezone.utc)
_LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=timezone.utc)


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
            kept verbatim even when it is not valid JSON).
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
        if (isinstance(self.content, list) and self.role != "user"
                and any(not isinstance(part, TextPart) for part in self.content)):
            raise ValueError(f"a {self.role} message may only hold text parts")
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
        """Return a plain :class:`Message` with this message's caller-visible fields."""
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
        """Return the message as an OpenAI Chat Completions message dict."""
        out: dict[str, Any] = {"role": self.role}
        content = self.content
        if isinstance(content, list):
            out["content"] = [part.model_dump(exclude_none=True) for part in content]
        elif content is None and not self.tool_calls:
            # The API takes an assistant message without content only beside tool
            # calls: one with neither (a model that returned nothing) is sent as "".
            out["content"] = ""
        else:
            out["content"] = content
        if self.name is not None:
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
        ``tool`` message. See :func:`memstore.formats.from_anthropic`.
        """
        from memstore import formats

        return formats.from_anthropic(data, **extra)


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


class Conversation(BaseModel):
    """A conversation's row: identity, metadata and running totals.

    Attributes:
        id: the caller-chosen id (1–255 characters).
        created_at: creation time (UTC).
        updated_at: time of the last write (UTC).
        metadata: any JSON object.
        message_count: stored messages.
        token_count: sum of the stored per-message token counts.
    """

    model_config = _FROZEN

    id: str
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    message_count: int = Field(default=0, ge=0, le=MAX_SEQ)
    token_count: int = Field(default=0, ge=0, le=2**63 - 1)

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        return _validate_id(value, "conversation id")

    @field_validator("created_at", "updated_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return _utc(value)

    @field_validator("metadata", mode="before")
    @classmethod
    def _check_metadata(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"metadata must be a JSON object, not {type(value).__name__}")
        check_json(value, "metadata")
        check_json_size(value, "metadata")
        return value


OmissionReason = Literal[
    "budget",  # did not fit the token budget
    "buffer_size",  # beyond BufferedView's message count
    "head_tail_gap",  # between HeadAndTailView's head and tail
    "max_turns",  # older than RecentTurnsView's turn limit
    "score",  # ScoreBasedView: a higher-scored unit took the room
    "incomplete_unit",  # an unanswered tool call or a tool result whose call is not stored
    "tool_messages_removed",  # RecentTurnsView(remove_tool_messages=True)
    "start_on_user",  # TokenLimitedView(start_on_user=True) trimmed to a user message
    "summarized",  # SummaryView: inside the range its summary stands for
]


class Omission(BaseModel):
    """A run of stored messages a window left out, all for the same reason.

    Attributes:
        first_seq: first seq of the run.
        last_seq: last seq of the run (inclusive).
        count: how many stored messages of ``[first_seq, last_seq]`` were left out
            (anchored messages inside the range are kept and not counted).
        reason: why they were left out.
    """

    model_config = _FROZEN

    first_seq: int
    last_seq: int
    count: int
    reason: OmissionReason


class WindowReport(BaseModel):
    """What a window kept and left out, and why.

    Attributes:
        view: the view's class name.
        counter: the name of the token counter used.
        conversation_message_count: messages stored in the conversation.
        included_count: stored messages in the window (placeholder excluded).
        omitted: runs of left-out seqs with their reasons (chronological).
        placeholder: the placeholder text, when one was inserted.
        skipped: the number of messages the placeholder stands for (0 when none).
        rows_read: messages the view read to build the window, counted at every read
            (a message read twice counts twice; a cost measure: it
            grows with the window, not the history). Whether they came from the
            database or the store's row cache does not change the report (see
            ``store.cache_info()``); nor do the few rows past the last one taken that
            the store's last page fetched but never turned into messages.
        summary_range: ``(first_seq, last_seq)`` of the stored summary the window
            shows (``SummaryView``), else ``None``.
        unsummarized: stored messages after the summary's range (or, with no
            summary, anywhere) that the window neither shows nor summarizes (its
            ``"budget"`` omissions): about what the next ``summarize`` would fold in.
            Incomplete units among them are counted too (the view does not read that
            far), though ``summarize`` never folds them. 0 for views without summaries.
    """

    model_config = _FROZEN

    view: str
    counter: str
    conversation_message_count: int
    included_count: int
    omitted: list[Omission] = Field(default_factory=list)
    placeholder: str | None = None
    skipped: int = 0
    rows_read: int = 0
    summary_range: tuple[int, int] | None = None
    unsummarized: int = 0

    @property
    def omitted_count(self) -> int:
        """Total number of stored messages left out."""
        return sum(o.count for o in self.omitted)

    def omitted_seqs(self, reason: OmissionReason | None = None) -> list[int]:
        """The left-out seqs, optionally only those left out for ``reason``.

        Omission runs never span a kept message, so this is exact; it materialises
        every seq, so prefer ``omitted`` for long histories.
        """
        seqs: list[int] = []
        for o in self.omitted:
            if reason is None or o.reason == reason:
                seqs.extend(range(o.first_seq, o.last_seq + 1))
        return seqs


class Summary(BaseModel):
    """A stored summary of the older part of one conversation (``store.summarize``).

    Summaries are incremental: each one folds the units that aged out since the
    previous one into it, so its seq range contains the previous summary's. The
    original messages stay stored.

    Attributes:
        conversation_id: the conversation it summarizes.
        number: its position among the conversation's summaries (1, 2, ...).
        first_seq: the first seq it stands for (the conversation's first summarized seq).
        last_seq: the newest seq it folded in (inclusive).
        text: the summary text.
        token_count: ``text`` as one ``system`` message, counted by ``token_counter``.
        token_counter: the name of the counter that produced ``token_count``.
        created_at: when it was stored (timezone-aware UTC).
    """

    model_config = _FROZEN

    conversation_id: str
    number: int = Field(ge=1, le=MAX_SEQ)
    first_seq: int = Field(ge=1, le=MAX_SEQ)
    last_seq: int = Field(ge=1, le=MAX_SEQ)
    text: str
    token_count: int = Field(ge=0, le=MAX_TOKEN_COUNT)
    token_counter: str = Field(min_length=1, max_length=MAX_COUNTER_NAME_LENGTH)
    created_at: datetime

    @field_validator("conversation_id")
    @classmethod
    def _check_conversation_id(cls, value: str) -> str:
        return _validate_id(value, "conversation id")

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str) -> str:
        check_size(utf8_size(value), "summary text")
        return check_text(value, "summary text")

    @field_validator("token_counter")
    @classmethod
    def _check_counter(cls, value: str) -> str:
        return check_text(value, "token counter name")

    @field_validator("created_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return _utc(value)

    @model_validator(mode="after")
    def _check_range(self) -> Summary:
        if self.last_seq < self.first_seq:
            raise ValueError(
                f"summary last_seq ({self.last_seq}) is before its first_seq ({self.first_seq})"
            )
        return self

    @property
    def seq_range(self) -> tuple[int, int]:
        """``(first_seq, last_seq)``."""
        return (self.first_seq, self.last_seq)

    def to_message(self, template: str = DEFAULT_SUMMARY_TEMPLATE) -> Message:
        """The summary as one ``system`` message (not stored, no seq).

        Args:
            template: ``str.format`` template with ``{first}``, ``{last}`` and ``{text}``.

        Returns:
            A plain :class:`Message` whose metadata is
            ``{"memstore": {"summary": True, "first_seq": ..., "last_seq": ...}}``.
        """
        return Message(
            role="system",
            content=template.format(first=self.first_seq, last=self.last_seq, text=self.text),
            metadata={"memstore": {"summary": True, "first_seq": self.first_seq,
                                   "last_seq": self.last_seq}},
        )


class ContextWindow(BaseModel):
    """A view's result: the messages to send, their token count and a report.

    Attributes:
        conversation_id: the conversation the window was read from.
        messages: chronological; a plain :class:`Message` only for a placeholder.
        token_count: the whole list as the provider counts it (reply priming included).
        budget: the token limit of a budgeted view, else ``None``.
        report: what was left out and why.
    """

    model_config = ConfigDict(frozen=True)

    conversation_id: str
    messages: list[StoredMessage | Message]
    token_count: int
    budget: int | None = None
    report: WindowReport

    def to_openai(self) -> list[dict[str, Any]]:
        """Return the messages as OpenAI Chat Completions message dicts."""
        return [m.to_openai() for m in self.messages]

    def to_anthropic(self) -> dict[str, Any]:
        """Return ``{"system": [...], "messages": [...]}`` for the Anthropic Messages API.

        See :func:`memstore.formats.to_anthropic` for the mapping.
        """
        from memstore import formats

        return formats.to_anthropic(self.messages)

    def to_responses(self) -> list[dict[str, Any]]:
        """Return the messages as OpenAI Responses API input items.

        See :func:`memstore.formats.to_responses` for the mapping.
        """
        from memstore import formats

        return formats.to_responses(self.messages)

    @property
    def seqs(self) -> list[int]:
        """Seqs of the stored messages in the window (placeholder excluded)."""
        return [m.seq for m in self.messages if isinstance(m, StoredMessage)]

    def __len__(self) -> int:
        return len(self.messages)


def repeated_id(messages: Iterable[StoredMessage]) -> tuple[str, int] | None:
    """The first message whose id an earlier one of ``messages`` has, if any.

    Message ids are unique within a conversation. Returns ``(problem, seq)``: what is
    wrong, naming both seqs, and the repeat's seq; ``None`` when every id is unique.
    """
    seen: dict[str, int] = {}
    for m in messages:
        first = seen.setdefault(m.id, m.seq)
        if first != m.seq:
            return (f"message id {m.id!r} is the id of seq {first} and of seq {m.seq}: "
                    "message ids are unique within a conversation", m.seq)
    return None


class ConversationState(BaseModel):
    """A versioned, JSON-serialisable snapshot of one conversation.

    Produced by ``save_state`` and consumed by ``load_state``. ``model_dump_json()``
    and ``ConversationState.model_validate_json()`` move it through JSON losslessly.

    Attributes:
        format: always ``"memstore.conversation"``.
        version: the snapshot format version.
        conversation: the conversation row.
        messages: every stored message with seq, timestamps, scores and counts.
        view: the view configuration of the context handle that saved it, if any.
        summaries: the conversation's stored summaries, oldest first (version 2;
            a version 1 snapshot has none).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["memstore.conversation"] = "memstore.conversation"
    version: int = STATE_VERSION
    conversation: Conversation
    messages: list[StoredMessage]
    view: dict[str, JsonValue] | None = None
    summaries: list[Summary] = Field(default_factory=list)

    @field_validator("view", mode="before")
    @classmethod
    def _check_view(cls, value: Any) -> Any:
        if value is not None:
            if not isinstance(value, Mapping):
                raise ValueError(f"view must be a JSON object or null, not {type(value).__name__}")
            check_json(value, "view")
        return value

    @field_validator("version")
    @classmethod
    def _check_version(cls, value: int) -> int:
        if value not in READABLE_STATE_VERSIONS:
            raise ValueError(
                f"state version {value} is not supported (this memstore reads versions "
                f"{', '.join(map(str, READABLE_STATE_VERSIONS))})"
            )
        return value

    @model_validator(mode="after")
    def _check_messages(self) -> ConversationState:
        seqs = [m.seq for m in self.messages]
        if seqs != sorted(set(seqs)):
            raise ValueError("state messages must have unique seqs in increasing order")
        for m in self.messages:
            if m.conversation_id != self.conversation.id:
                raise ValueError(
                    f"message seq {m.seq} belongs to {m.conversation_id!r}, "
                    f"not {self.conversation.id!r}"
                )
        repeat = repeated_id(self.messages)
        if repeat is not None:
            raise ValueError(repeat[0])
        self._check_summaries()
        return self

    def _check_summaries(self) -> None:
        previous: Summary | None = None
        for s in self.summaries:
            if s.conversation_id != self.conversation.id:
                raise ValueError(
                    f"summary {s.number} belongs to {s.conversation_id!r}, "
                    f"not {self.conversation.id!r}"
                )
            if previous is not None:
                if s.number <= previous.number:
                    raise ValueError("state summaries must have increasing numbers")
                if s.first_seq > previous.first_seq or s.last_seq < previous.last_seq:
                    raise ValueError(
                        f"summary {s.number} ({s.first_seq}..{s.last_seq}) does not contain "
                        f"summary {previous.number} ({previous.first_seq}..{previous.last_seq})"
                    )
            previous = s
        if previous is not None and self.messages and previous.last_seq > self.messages[-1].seq:
            raise ValueError(
                f"summary {previous.number} ends at seq {previous.last_seq}, after the newest "
                f"message (seq {self.messages[-1].seq})"
            )

    def to_json(self) -> str:
        """Serialise to a JSON string."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> ConversationState:
        """Parse a JSON string produced by :meth:`to_json`."""
        return cls.model_validate_json(text)



class StoreStats(BaseModel):
    """Totals of a whole database (``store.stats()``, ``memstore stats``).

    Computed from the conversation rows (one aggregate over them, not over messages),
    so it is cheap but not a hot-path call.

    Attributes:
        conversations: stored conversations.
        messages: stored messages.
        tokens: sum of the stored per-message token counts.
        database_bytes: the database's size on disk (SQLite pages, or PostgreSQL's
            ``pg_database_size``); ``None`` when the backend does not report it.
        schema_revision: memstore's migration revision in the database, if any.
    """

    model_config = _FROZEN

    conversations: int
    messages: int
    tokens: int
    database_bytes: int | None = None
    schema_revision: str | None = None


_M = TypeVar("_M", bound=BaseModel)

#: Every message that validation built, by ``id()`` (held weakly, so an entry leaves
#: with its message and an address reused later is not mistaken for it).
#: :func:`checked_message` trusts these; a message made any other way
#: (``model_copy(update=...)``, ``model_construct``, ``copy.copy``) skipped validation.
_VALIDATED: weakref.WeakValueDictionary[int, Message] = weakref.WeakValueDictionary()


def checked_message(message: Message) -> Message:
    """``message`` as a valid plain :class:`Message` before it is written.

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

    The state :meth:`pydantic.BaseModel.model_construct` produces, at a fraction of its
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
