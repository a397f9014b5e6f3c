"""Conversations, summaries, snapshots and the reports of whole-conversation writes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

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
    utf8_size,
)
from memstore.models.common import (
    _FROZEN,
    DEFAULT_SUMMARY_TEMPLATE,
    READABLE_STATE_VERSIONS,
    STATE_VERSION,
    _utc,
    _validate_id,
)
from memstore.models.message import (
    Message,
    StoredMessage,
)


class Conversation(BaseModel):
    """A conversation's row: identity, metadata and running totals.

    Attributes:
        id: the caller-chosen id (1–255 characters).
        created_at: creation time (UTC).
        updated_at: time of the last write (UTC).
        metadata: any JSON object.
        message_count: stored messages.
        token_count: sum of the stored per-message token counts.
        expires_at: when ``prune(expired=True)`` may delete the conversation (UTC);
            ``None``: never (set it with ``update_conversation``).
        parent_id: the conversation this one was forked from (``fork``), if any.
        forked_at_seq: the parent's newest seq the fork copied (``None`` if not a fork).
    """

    model_config = _FROZEN

    id: str
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    message_count: int = Field(default=0, ge=0, le=MAX_SEQ)
    token_count: int = Field(default=0, ge=0, le=2**63 - 1)
    expires_at: datetime | None = None
    parent_id: str | None = None
    forked_at_seq: int | None = Field(default=None, ge=0, le=MAX_SEQ)

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        return _validate_id(value, "conversation id")

    @field_validator("created_at", "updated_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return _utc(value)

    @field_validator("expires_at")
    @classmethod
    def _aware_or_none(cls, value: datetime | None) -> datetime | None:
        return None if value is None else _utc(value)

    @field_validator("parent_id")
    @classmethod
    def _check_parent(cls, value: str | None) -> str | None:
        return None if value is None else _validate_id(value, "parent conversation id")

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
            A plain [`Message`][memstore.Message] whose metadata is
            ``{"memstore": {"summary": True, "first_seq": ..., "last_seq": ...}}``.
        """
        return Message(
            role="system",
            content=template.format(first=self.first_seq, last=self.last_seq, text=self.text),
            metadata={"memstore": {"summary": True, "first_seq": self.first_seq,
                                   "last_seq": self.last_seq}},
        )




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
        """Parse a JSON string produced by `to_json()`."""
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




class LoadReport(BaseModel):
    """What [`MemoryStore.restore_state()`][memstore.MemoryStore.restore_state] did.

    Attributes:
        conversation: the conversation as stored afterwards.
        messages: messages in the snapshot.
        written: messages stored.
        recounted: messages whose stored token count (or counter) was replaced by a
            fresh count: a snapshot's counts are never trusted. Counts made by a
            counter this process can rebuild are recounted with it; the others with
            the store's counter (and relabelled with its name).
    """

    model_config = _FROZEN

    __str__ = BaseModel.__repr__  # print() names the class

    conversation: Conversation
    messages: int
    written: int
    recounted: int




class PruneReport(BaseModel):
    """What ``prune`` deleted (with ``dry_run``: would delete).

    Attributes:
        conversations_scanned: conversations the policy was applied to.
        conversations_touched: conversations that lost messages or summaries (or went).
        messages_deleted: messages deleted, dropped conversations' included.
        summaries_deleted: summaries deleted, dropped conversations' included.
        conversations_dropped: conversations deleted whole (expired, or left empty
            with ``drop_empty``).
        dry_run: ``True`` when nothing was written.
    """

    model_config = _FROZEN

    __str__ = BaseModel.__repr__  # print() names the class

    conversations_scanned: int = 0
    conversations_touched: int = 0
    messages_deleted: int = 0
    summaries_deleted: int = 0
    conversations_dropped: int = 0
    dry_run: bool = False


class ForgetReport(BaseModel):
    """What ``forget`` erased (or, with ``dry_run=True``, would erase).

    Attributes:
        conversations: conversations deleted (the selected ones and every fork
            descending from them).
        messages: their messages.
        audit_id: the id of the audit entry recording it (see ``audit_log``);
            ``None`` for a dry run, which records nothing.
        dry_run: nothing was deleted: the counts are what a forget would delete now.
    """

    model_config = _FROZEN

    __str__ = BaseModel.__repr__  # print() names the class

    conversations: int
    messages: int
    audit_id: int | None
    dry_run: bool = False


class AuditEntry(BaseModel):
    """One entry of the audit log: a ``forget``, recorded without the erased values.

    Attributes:
        id: increasing entry id (the cursor of ``audit_log(after=...)``).
        at: when (UTC).
        operation: ``"forget"``.
        selector_digest: sha256 (hex) of the canonical JSON of the selector
            (``{"conversation_ids": [...], "where": {...}}``): it proves which selector
            was used to whoever holds it, and reveals nothing to whoever does not.
        conversations: conversations deleted.
        messages: messages deleted.
        reason: the caller's reason, as given (keep personal data out of it).
    """

    model_config = _FROZEN

    id: int
    at: datetime
    operation: str
    selector_digest: str
    conversations: int
    messages: int
    reason: str | None = None
