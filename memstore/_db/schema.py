"""SQLAlchemy tables: the single ``target_metadata`` of memstore's Alembic migrations.

Two tables, both keyed by the conversation id so that every hot statement is
scoped to one conversation (and a sharded deployment can distribute both tables
on ``conversation_id``):

* ``memstore_conversations``: one row per conversation; it hands out seqs
  (``last_seq``) under a row lock, keeps running totals so that counts never
  scan history, and carries the ``epoch`` that validates cached rows.
* ``memstore_messages``: primary key ``(conversation_id, seq)``, which is the index
  every window walks newest-first. A partial index covers anchored messages
  (system, developer, pinned) so views fetch them without scanning.
* ``memstore_summaries``: stored summaries of a conversation's older messages,
  primary key ``(conversation_id, number)``; deleting a conversation deletes them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import JSON, TypeDecorator

__all__ = ["VERSION_TABLE", "conversations", "messages", "metadata", "summaries"]

#: memstore's own Alembic version table, so it can live beside a host application's.
VERSION_TABLE = "memstore_alembic_version"

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: JSON on SQLite, JSONB on PostgreSQL.
JSONType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware timestamp that always comes back as UTC.

    SQLite has no timezone type: values are stored as naive UTC and tagged UTC on
    the way out. PostgreSQL stores ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("memstore timestamps must be timezone-aware")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        moment: datetime = value
        if moment.tzinfo is None:
            return moment.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc)


ROLE_CHECK = "role IN ('system', 'developer', 'user', 'assistant', 'tool')"

conversations = Table(
    "memstore_conversations",
    metadata,
    Column("id", String(255), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("metadata", JSONType, nullable=False),
    # Live seqs are exactly [first_seq, last_seq]; message_count = last_seq - first_seq + 1.
    Column("first_seq", BigInteger(), nullable=False, server_default=text("1")),
    Column("last_seq", BigInteger(), nullable=False, server_default=text("0")),
    Column("token_count", BigInteger(), nullable=False, server_default=text("0")),
    # Upper bound of every stored base score; only ever raised (a stale bound is still a bound).
    Column("max_score", Double(), nullable=False, server_default=text("1.0")),
    # A random token replaced whenever stored messages change other than by appending
    # (score, pin, pop, truncate, clear; a new conversation row gets a new one). Readers
    # keep decoded rows in a process-local cache and trust them while the epoch holds.
    Column("epoch", BigInteger(), nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("id"),
    CheckConstraint("first_seq >= 1", name="first_seq_positive"),
    CheckConstraint("last_seq >= first_seq - 1", name="seq_range"),
)

messages = Table(
    "memstore_messages",
    metadata,
    Column("conversation_id", String(255), nullable=False),
    Column("seq", BigInteger(), nullable=False),
    Column("message_id", String(255), nullable=False),
    Column("role", String(16), nullable=False),
    Column("content_text", Text(), nullable=True),
    Column("content_parts", JSONType, nullable=True),
    Column("name", String(255), nullable=True),
    Column("tool_calls", JSONType, nullable=True),
    Column("tool_call_id", String(255), nullable=True),
    Column("score", Double(), nullable=False, server_default=text("1.0")),
    Column("pinned", Boolean(), nullable=False, server_default=text("false")),
    Column("anchored", Boolean(), nullable=False, server_default=text("false")),
    Column("token_count", Integer(), nullable=False),
    Column("token_counter", String(64), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("metadata", JSONType, nullable=True),  # NULL = {} (nothing to decode on read)
    PrimaryKeyConstraint("conversation_id", "seq"),
    ForeignKeyConstraint(
        ["conversation_id"], ["memstore_conversations.id"], ondelete="CASCADE"
    ),
    UniqueConstraint("conversation_id", "message_id"),
    CheckConstraint(ROLE_CHECK, name="role"),
    CheckConstraint("score >= 0", name="score_nonnegative"),
    CheckConstraint("token_count >= 0", name="token_count_nonnegative"),
    Index(
        "ix_memstore_messages_anchored",
        "conversation_id",
        "seq",
        sqlite_where=text("anchored"),
        postgresql_where=text("anchored"),
    ),
)

summaries = Table(
    "memstore_summaries",
    metadata,
    Column("conversation_id", String(255), nullable=False),
    # 1, 2, ... per conversation; each summary's seq range contains the previous one's.
    Column("number", BigInteger(), nullable=False),
    Column("first_seq", BigInteger(), nullable=False),
    Column("last_seq", BigInteger(), nullable=False),
    Column("text", Text(), nullable=False),
    Column("token_count", Integer(), nullable=False),
    Column("token_counter", String(64), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    PrimaryKeyConstraint("conversation_id", "number"),
    ForeignKeyConstraint(
        ["conversation_id"], ["memstore_conversations.id"], ondelete="CASCADE"
    ),
    CheckConstraint("number >= 1", name="number_positive"),
    CheckConstraint("first_seq >= 1", name="first_seq_positive"),
    CheckConstraint("last_seq >= first_seq", name="seq_range"),
    CheckConstraint("token_count >= 0", name="token_count_nonnegative"),
)
