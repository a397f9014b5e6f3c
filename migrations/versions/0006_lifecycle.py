"""Conversation lifecycle: expiry, fork lineage, the metadata key index and the audit log.

* ``memstore_conversations`` gains ``expires_at`` (``prune(expired=True)`` deletes what
  has passed it), ``parent_id`` and ``forked_at_seq`` (a fork's lineage), with indexes
  on the parent, on ``(updated_at, id)`` (listing by recency) and on the expiries set.
* ``memstore_conversation_keys`` indexes each conversation's top-level scalar metadata,
  one row per key, so ``where={"user_id": "u1"}`` is an index lookup on both databases.
  Triggers on ``memstore_conversations`` keep it in the transaction of every write of
  metadata; the existing conversations' keys are written here, in the database (one
  ``INSERT ... SELECT``: nothing is read into this process).
* ``memstore_audit`` records each ``forget``: when, what, how much, why — never the
  erased values (the selector is kept as a sha256 digest).

Revision ID: 0006_lifecycle
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore._db.schema import DROP_KEY_TRIGGERS, KEY_TRIGGERS, KEYS_BACKFILL

revision: str = "0006_lifecycle"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.add_column("memstore_conversations",
                  sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("memstore_conversations",
                  sa.Column("parent_id", sa.String(255), nullable=True))
    op.add_column("memstore_conversations",
                  sa.Column("forked_at_seq", sa.BigInteger(), nullable=True))
    op.create_index("ix_memstore_conversations_parent_id", "memstore_conversations",
                    ["parent_id"])
    op.create_index("ix_memstore_conversations_updated_at", "memstore_conversations",
                    ["updated_at", "id"])
    op.create_index("ix_memstore_conversations_expires_at", "memstore_conversations",
                    ["expires_at"], sqlite_where=sa.text("expires_at IS NOT NULL"),
                    postgresql_where=sa.text("expires_at IS NOT NULL"))
    op.create_table(
        "memstore_conversation_keys",
        sa.Column("conversation_id", sa.String(255), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["conversation_id"], ["memstore_conversations.id"],
            name=op.f("fk_memstore_conversation_keys_conversation_id_memstore_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("conversation_id", "key",
                                name=op.f("pk_memstore_conversation_keys")),
    )
    op.create_index("ix_memstore_conversation_keys_lookup", "memstore_conversation_keys",
                    ["key", "kind", "value", "conversation_id"])
    op.create_table(
        "memstore_audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("operation", sa.String(32), nullable=False),
        sa.Column("selector_digest", sa.String(64), nullable=False),
        sa.Column("conversations", sa.BigInteger(), nullable=False),
        sa.Column("messages", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memstore_audit")),
    )
    if dialect in KEYS_BACKFILL:
        op.execute(KEYS_BACKFILL[dialect])
    for statement in KEY_TRIGGERS.get(dialect, ()):
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in DROP_KEY_TRIGGERS.get(dialect, ()):
        op.execute(statement)
    op.drop_table("memstore_audit")
    op.drop_index("ix_memstore_conversation_keys_lookup", "memstore_conversation_keys")
    op.drop_table("memstore_conversation_keys")
    op.drop_index("ix_memstore_conversations_expires_at", "memstore_conversations")
    op.drop_index("ix_memstore_conversations_updated_at", "memstore_conversations")
    op.drop_index("ix_memstore_conversations_parent_id", "memstore_conversations")
    # SQLite 3.35+ drops a column in place (as 0002 does): a table copy would drop the
    # table the messages' foreign key cascades from.
    for column in ("forked_at_seq", "parent_id", "expires_at"):
        op.drop_column("memstore_conversations", column)
