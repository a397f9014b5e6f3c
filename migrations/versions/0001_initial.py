"""Initial schema: conversations and messages.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "memstore_conversations",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.Column("first_seq", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("token_count", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_score", sa.Double(), server_default=sa.text("1.0"), nullable=False),
        sa.CheckConstraint(
            "first_seq >= 1", name=op.f("ck_memstore_conversations_first_seq_positive")
        ),
        sa.CheckConstraint(
            "last_seq >= first_seq - 1", name=op.f("ck_memstore_conversations_seq_range")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memstore_conversations")),
    )
    op.create_table(
        "memstore_messages",
        sa.Column("conversation_id", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content_text", sa.Text(), nullable=True),
        sa.Column("content_parts", JSON, nullable=True),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("tool_calls", JSON, nullable=True),
        sa.Column("tool_call_id", sa.String(255), nullable=True),
        sa.Column("score", sa.Double(), server_default=sa.text("1.0"), nullable=False),
        sa.Column("pinned", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("anchored", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("token_counter", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metadata", JSON, nullable=True),
        sa.CheckConstraint(
            "role IN ('system', 'developer', 'user', 'assistant', 'tool')",
            name=op.f("ck_memstore_messages_role"),
        ),
        sa.CheckConstraint("score >= 0", name=op.f("ck_memstore_messages_score_nonnegative")),
        sa.CheckConstraint(
            "token_count >= 0", name=op.f("ck_memstore_messages_token_count_nonnegative")
        ),
        sa.ForeignKeyConstraint(
            ["conversation_id"],
            ["memstore_conversations.id"],
            name=op.f("fk_memstore_messages_conversation_id_memstore_conversations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("conversation_id", "seq", name=op.f("pk_memstore_messages")),
        sa.UniqueConstraint(
            "conversation_id",
            "message_id",
            name=op.f("uq_memstore_messages_conversation_id_message_id"),
        ),
    )
    op.create_index(
        "ix_memstore_messages_anchored",
        "memstore_messages",
        ["conversation_id", "seq"],
        unique=False,
        sqlite_where=sa.text("anchored"),
        postgresql_where=sa.text("anchored"),
    )


def downgrade() -> None:
    op.drop_index("ix_memstore_messages_anchored", table_name="memstore_messages")
    op.drop_table("memstore_messages")
    op.drop_table("memstore_conversations")
