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
* ``memstore_conversation_keys``: the index of conversations' top-level scalar metadata
  (one row per key), kept by triggers on ``memstore_conversations`` in the same
  transaction as every write of metadata (`KEY_TRIGGERS`); ``where=`` filters read it.
* ``memstore_audit``: what ``forget`` erased and why, without the erased values.
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

__all__ = [
    "KEYS_BACKFILL",
    "KEY_TRIGGERS",
    "VERSION_TABLE",
    "audit",
    "conversation_keys",
    "conversations",
    "messages",
    "metadata",
    "summaries",
]

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
    # Lifecycle (migration 0006): when the conversation expires (``prune(expired=True)``
    # deletes it), and which conversation it was forked from, at which seq.
    Column("expires_at", UTCDateTime(), nullable=True),
    Column("parent_id", String(255), nullable=True),
    Column("forked_at_seq", BigInteger(), nullable=True),
    PrimaryKeyConstraint("id"),
    CheckConstraint("first_seq >= 1", name="first_seq_positive"),
    CheckConstraint("last_seq >= first_seq - 1", name="seq_range"),
    Index("ix_memstore_conversations_parent_id", "parent_id"),
    Index("ix_memstore_conversations_updated_at", "updated_at", "id"),
    Index(
        "ix_memstore_conversations_expires_at",
        "expires_at",
        sqlite_where=text("expires_at IS NOT NULL"),
        postgresql_where=text("expires_at IS NOT NULL"),
    ),
)

#: Longest metadata key (and string value) the key index holds. A longer string value is
#: indexed as present but not comparable (kind ``long``); a longer key is not indexed
#: (``where`` refuses such keys and values: see ``memstore._validate.check_where``).
MAX_INDEXED_TEXT = 1000

conversation_keys = Table(
    "memstore_conversation_keys",
    metadata,
    Column("conversation_id", String(255), nullable=False),
    Column("key", Text(), nullable=False),
    # text, int, bool, null (comparable); long (a string over MAX_INDEXED_TEXT), other
    # (a float, list or object): present, never equal to a filter value.
    Column("kind", String(8), nullable=False),
    Column("value", Text(), nullable=True),
    PrimaryKeyConstraint("conversation_id", "key"),
    ForeignKeyConstraint(
        ["conversation_id"], ["memstore_conversations.id"], ondelete="CASCADE"
    ),
    Index("ix_memstore_conversation_keys_lookup", "key", "kind", "value", "conversation_id"),
)

audit = Table(
    "memstore_audit",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), nullable=False,
           autoincrement=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("operation", String(32), nullable=False),
    # sha256 of the canonical JSON of the selector: never the selector's values.
    Column("selector_digest", String(64), nullable=False),
    Column("conversations", BigInteger(), nullable=False),
    Column("messages", BigInteger(), nullable=False),
    Column("reason", Text(), nullable=True),
    PrimaryKeyConstraint("id"),
)

# The key index's triggers: inserting a conversation, or changing its metadata, writes
# its keys in the same statement's transaction; deleting one cascades (foreign key).


def _keys_select(dialect: str, row: str, source: str = "") -> str:
    """The SELECT of a conversation's index rows.

    ``row`` names the conversation row (``NEW`` in a trigger); ``source`` adds FROM
    items (the backfill's table).
    """
    n = MAX_INDEXED_TEXT
    if dialect == "sqlite":
        return f"""SELECT {row}.id, j.key,
    CASE j.type
      WHEN 'text' THEN CASE WHEN length(j.atom) <= {n} THEN 'text' ELSE 'long' END
      WHEN 'integer' THEN 'int' WHEN 'true' THEN 'bool' WHEN 'false' THEN 'bool'
      WHEN 'null' THEN 'null' ELSE 'other' END,
    CASE j.type
      WHEN 'text' THEN CASE WHEN length(j.atom) <= {n} THEN j.atom END
      WHEN 'integer' THEN CAST(j.atom AS TEXT) WHEN 'true' THEN 'true'
      WHEN 'false' THEN 'false' END
  FROM {source}json_each({row}.metadata) AS j WHERE length(j.key) <= {n}"""
    text_ = "j.value #>> '{}'"
    return f"""SELECT {row}.id, j.key,
    CASE jsonb_typeof(j.value)
      WHEN 'string' THEN CASE WHEN length({text_}) <= {n} THEN 'text' ELSE 'long' END
      WHEN 'number' THEN CASE WHEN ({text_}) ~ '^-?[0-9]+$' THEN 'int' ELSE 'other' END
      WHEN 'boolean' THEN 'bool' WHEN 'null' THEN 'null' ELSE 'other' END,
    CASE jsonb_typeof(j.value)
      WHEN 'string' THEN CASE WHEN length({text_}) <= {n} THEN {text_} END
      WHEN 'number' THEN CASE WHEN ({text_}) ~ '^-?[0-9]+$' THEN {text_} END
      WHEN 'boolean' THEN {text_} END
  FROM {source}jsonb_each({row}.metadata) AS j WHERE length(j.key) <= {n}"""


_INSERT_KEYS = "INSERT INTO memstore_conversation_keys (conversation_id, key, kind, value) "

#: Migration 0006's backfill: every existing conversation's keys, in the database.
KEYS_BACKFILL: dict[str, str] = {
    dialect: _INSERT_KEYS + _keys_select(dialect, "c", "memstore_conversations AS c, ")
    for dialect in ("sqlite", "postgresql")
}

_PG_KEYS_FUNCTION = f"""CREATE FUNCTION memstore_conversation_keys_sync() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    DELETE FROM memstore_conversation_keys WHERE conversation_id = OLD.id;
  END IF;
  {_INSERT_KEYS}{_keys_select("postgresql", "NEW")};
  RETURN NULL;
END $$"""

#: DDL of the key index's triggers per dialect, run by migration 0006 and by
#: ``create_partitioned`` (a row trigger on a partitioned table applies to each partition).
KEY_TRIGGERS: dict[str, tuple[str, ...]] = {
    "sqlite": (
        "CREATE TRIGGER memstore_conversation_keys_insert AFTER INSERT ON "
        f"memstore_conversations BEGIN {_INSERT_KEYS}{_keys_select('sqlite', 'NEW')}; END",
        "CREATE TRIGGER memstore_conversation_keys_update AFTER UPDATE OF metadata ON "
        "memstore_conversations BEGIN DELETE FROM memstore_conversation_keys WHERE "
        f"conversation_id = OLD.id; {_INSERT_KEYS}{_keys_select('sqlite', 'NEW')}; END",
    ),
    "postgresql": (
        _PG_KEYS_FUNCTION,
        "CREATE TRIGGER memstore_conversation_keys_sync AFTER INSERT OR UPDATE OF metadata "
        "ON memstore_conversations FOR EACH ROW EXECUTE FUNCTION "
        "memstore_conversation_keys_sync()",
    ),
}

#: What undoes `KEY_TRIGGERS` (migration 0006's downgrade).
DROP_KEY_TRIGGERS: dict[str, tuple[str, ...]] = {
    "sqlite": ("DROP TRIGGER IF EXISTS memstore_conversation_keys_insert",
               "DROP TRIGGER IF EXISTS memstore_conversation_keys_update"),
    "postgresql": ("DROP TRIGGER IF EXISTS memstore_conversation_keys_sync "
                   "ON memstore_conversations",
                   "DROP FUNCTION IF EXISTS memstore_conversation_keys_sync()"),
}

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
